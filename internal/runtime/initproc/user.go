package initproc

import (
	"errors"
	"syscall"

	"github.com/corral-dev/corral/internal/runtime/initproto"
	"github.com/corral-dev/corral/internal/runtime/passwd"
)

// lookupUser turns "name", "uid" or "uid:gid" into credentials, reading the
// sandbox's own /etc/passwd and /etc/group. "" means root.
func lookupUser(user string) (*syscall.Credential, error) {
	cred, err := passwd.Lookup("", user)
	if nf := (*passwd.NotFoundError)(nil); errors.As(err, &nf) {
		return nil, &reqError{initproto.ClassNotFound, err}
	}
	return cred, err
}
