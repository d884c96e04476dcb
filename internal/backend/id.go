package backend

import (
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// MaxIDLen bounds a sandbox id so that it plus a suffix (".img.tmp") is
// still a valid file name.
const MaxIDLen = 200

// CheckID rejects a sandbox id that is not a single plain file name:
// backends and disk stores name directories, files and cgroups after it.
func CheckID(id string) error {
	switch {
	case id == "":
		return errdefs.InvalidArgument("sandbox id: must not be empty")
	case len(id) > MaxIDLen:
		return errdefs.InvalidArgument("sandbox id: %d bytes is over the limit of %d", len(id), MaxIDLen)
	case strings.ContainsAny(id, "/\x00"):
		return errdefs.InvalidArgument("sandbox id %q: must not contain '/' or NUL", id)
	case strings.HasPrefix(id, "."):
		return errdefs.InvalidArgument("sandbox id %q: must not start with '.' (covers '.' and '..')", id)
	}
	return nil
}
