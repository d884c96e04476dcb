package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Files every QEMU backend's snapshot dir has (the node adds its own
// record, written last, and syncs the tree before it).
const (
	SnapStateFile = "machine.json" // the source's machine state, as the backend records it
	SnapRAMFile   = "ram.img"      // guest RAM, sparse, when it is not in the migration stream
)

// WriteState writes the source machine's state (JSON) into snapshot dir.
func WriteState(dir string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, SnapStateFile), b, 0o600); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

// ReadState decodes a snapshot dir's machine state into v.
func ReadState(dir string, v any) error {
	raw, err := os.ReadFile(filepath.Join(dir, SnapStateFile))
	if err != nil {
		return errdefs.NotFound("snapshot %s: %v", filepath.Base(dir), err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("snapshot %s: decode %s: %w", filepath.Base(dir), SnapStateFile, err)
	}
	return nil
}

// RAMImage is the snapshot's guest RAM image, "" when its RAM is in the
// migration stream.
func RAMImage(dir string) string {
	p := filepath.Join(dir, SnapRAMFile)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// CopyDisk copies a sparse disk image (raw or qcow2): a reflink where the
// file system has them, else only its data blocks.
func CopyDisk(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "--reflink=auto", "--sparse=always", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy disk: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DiskUsage is the bytes of allocated blocks under dir.
func DiskUsage(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	return n, err
}

// MachineFile is a run dir's record of its machine (what Recover, Cleanup
// and Sweep read after a daemon restart).
const MachineFile = "vm.json"

// SaveMachine writes v as dir's MachineFile through a temporary file and
// a rename, so that a crash leaves the old record or the new one.
func SaveMachine(dir string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, MachineFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("save vm state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, MachineFile)); err != nil {
		return fmt.Errorf("save vm state: %w", err)
	}
	return nil
}

// LoadMachine decodes dir's MachineFile into v (an fs.ErrNotExist error
// when there is none).
func LoadMachine(dir string, v any) error {
	b, err := os.ReadFile(filepath.Join(dir, MachineFile))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", MachineFile, err)
	}
	return nil
}
