package container

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/backend/backendtest"
	"github.com/corral-dev/corral/internal/procfs"
)

// TestConformance runs the backend conformance suite: every backend's
// shared behaviour (exec, files, limits, pause, errors, cleanup, restart),
// over both writable-layer stores a node may use.
func TestConformance(t *testing.T) {
	t.Run("dir", func(t *testing.T) {
		b := newBackend(t)
		backendtest.Run(t, backendtest.Harness{
			New:       func(t *testing.T) backend.Backend { return newBackend(t) },
			Spec:      func(t *testing.T) backend.Spec { return defaultSpec(newID(t)) },
			Leftovers: func(id string) []string { return leftovers(b, id) },
		})
	})
	t.Run("ext4-image", func(t *testing.T) {
		b := newDiskBackend(t)
		backendtest.Run(t, backendtest.Harness{
			New: func(t *testing.T) backend.Backend { return newDiskBackend(t) },
			Spec: func(t *testing.T) backend.Spec {
				spec := defaultSpec(newID(t))
				withDisk(64<<20, 16384)(&spec)
				return spec
			},
			Leftovers: func(id string) []string { return append(leftovers(b, id), diskLeftovers(id)...) },
		})
	})
	t.Run("recyclable", func(t *testing.T) {
		b := newDiskBackend(t)
		backendtest.Run(t, backendtest.Harness{
			New: func(t *testing.T) backend.Backend { return newDiskBackend(t) },
			Spec: func(t *testing.T) backend.Spec {
				spec := defaultSpec(newID(t))
				recyclable(&spec)
				return spec
			},
			Leftovers: func(id string) []string { return append(leftovers(b, id), diskLeftovers(id)...) },
			Skip:      map[string]string{"Resettable": "a sandbox is resettable (fncall) or recyclable, not both: the dir and ext4-image rows run it"},
		})
	})
}

// leftovers lists what of sandbox id remains on the host: its cgroup, run
// dir, upper dir, or a mount in any mount namespace.
func leftovers(b *Backend, id string) []string {
	var out []string
	if b.cg.Group(id).Exists() {
		out = append(out, "cgroup")
	}
	if _, err := os.Lstat(b.runDir(id)); !os.IsNotExist(err) {
		out = append(out, "run dir")
	}
	if _, err := os.Lstat(filepath.Join(tmpRoot, "upper", id)); !os.IsNotExist(err) {
		out = append(out, "upper dir")
	}
	// The cgroup cannot go while a process is in it; mounts can outlive
	// it in another namespace.
	for pid := range procfs.PIDs() {
		p := procfs.Path(pid, "mountinfo")
		if mi, err := os.ReadFile(p); err == nil && strings.Contains(string(mi), "/"+id+"/") {
			out = append(out, "a mount in "+p)
			break
		}
	}
	return out
}
