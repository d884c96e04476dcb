package cgroup

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ownerXattr names the daemon that holds a parent, for another daemon's
// error message. The lock, not the attribute, decides: the attribute of
// a dead owner is simply overwritten.
const ownerXattr = "trusted.corral.owner"

// Owner is what a parent's marker records about the daemon holding it.
type Owner struct {
	Pid     int    `json:"pid"`
	DataDir string `json:"data_dir"`
}

// OwnedError is the refusal to use a parent another live daemon holds.
type OwnedError struct {
	Parent string
	Owner  Owner // zero when the marker could not be read
}

func (e *OwnedError) Error() string {
	who := "another live corral daemon"
	if e.Owner.Pid > 0 {
		who = fmt.Sprintf("the corral daemon with pid %d and data dir %s", e.Owner.Pid, e.Owner.DataDir)
	}
	return fmt.Sprintf("cgroup parent %q is in use by %s: give each daemon a --cgroup-parent of its own", e.Parent, who)
}

// Claim holds a parent for one daemon until Release.
type Claim struct {
	dir *os.File
}

// Claim makes the parent directories and takes the parent for the daemon
// with data dir dataDir, so that no second daemon places or sweeps
// sandboxes there. Liveness is an exclusive flock on the parent's
// directory (in the first hierarchy, the same on every daemon of a host):
// the kernel drops it when its holder dies, so the parent of a dead
// daemon is taken over, with no stale pid to trust. The holder's pid and
// data dir go in an extended attribute of that directory for the error
// the next daemon gets (*OwnedError).
func (m *Manager) Claim(dataDir string) (*Claim, error) {
	dirs := m.dirs()
	if len(dirs) == 0 {
		return nil, errors.New("cgroup: no hierarchy to claim a parent in")
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return nil, fmt.Errorf("cgroup: create parent: %w", err)
		}
	}
	f, err := os.Open(dirs[0])
	if err != nil {
		return nil, fmt.Errorf("cgroup: claim parent %s: %w", m.parent, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			oe := &OwnedError{Parent: m.parent}
			buf := make([]byte, 4096)
			if n, err := unix.Fgetxattr(int(f.Fd()), ownerXattr, buf); err == nil {
				_ = json.Unmarshal(buf[:n], &oe.Owner)
			}
			return nil, oe
		}
		return nil, fmt.Errorf("cgroup: claim parent %s: lock: %w", m.parent, err)
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	marker, _ := json.Marshal(Owner{Pid: os.Getpid(), DataDir: abs})
	// Best effort: a hierarchy without xattrs only loses the detail in
	// the other daemon's error.
	_ = unix.Fsetxattr(int(f.Fd()), ownerXattr, marker, 0)
	return &Claim{dir: f}, nil
}

// Release gives the parent up (closing the directory drops the lock).
func (c *Claim) Release() error {
	if c == nil || c.dir == nil {
		return nil
	}
	_ = unix.Fremovexattr(int(c.dir.Fd()), ownerXattr)
	err := c.dir.Close()
	c.dir = nil
	return err
}
