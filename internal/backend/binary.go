package backend

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/errdefs"
)

// SandboxBinary resolves a sandbox-side binary of corral (corral-init,
// corral-agent): path when set, else name beside the running executable,
// where corral installs them. A missing one is errdefs.NotSupported naming
// field, the config setting that overrides it.
func SandboxBinary(path, name, field string) (string, error) {
	if path == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("find %s: %w", name, err)
		}
		path = filepath.Join(filepath.Dir(exe), name)
	}
	if _, err := os.Stat(path); err != nil {
		return "", errdefs.NotSupported("%s: %v (needs the static binary beside corral or %s)", name, err, field)
	}
	return path, nil
}
