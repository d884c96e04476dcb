package qemu

import (
	"context"
	"os"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// VMM is the part of a VM sandbox's machine record (MachineFile) that
// says where its monitor process and network slot are. Both backends
// embed it in their records; encoding/json flattens an embedded struct,
// so the file's fields are those the records had before.
type VMM struct {
	Pid       int    `json:"pid,omitempty"`
	StartTime uint64 `json:"start_time,omitempty"`
	// Snapshotted: the VM's state is in the run dir's snapshot file and
	// no VMM process runs.
	Snapshotted bool `json:"snapshotted,omitempty"`
	// Net is the network slot of a networked VM (nil: no NIC) and MAC
	// its NIC's address.
	Net *netpolicy.Record `json:"net,omitempty"`
	MAC string            `json:"mac,omitempty"`
}

// Started records proc as the VM's VMM.
func (v *VMM) Started(proc *launch.Process) { v.Pid, v.StartTime = proc.Pid, proc.StartTime }

// Hibernated records that the VM's state went to its snapshot file and
// its VMM ended.
func (v *VMM) Hibernated() { v.Snapshotted, v.Pid, v.StartTime = true, 0, 0 }

// Live is the recorded VMM process (pid 0: none runs).
func (v VMM) Live() (pid int, start uint64) {
	if v.Snapshotted {
		return 0, 0
	}
	return v.Pid, v.StartTime
}

// Restored records proc, just started from the snapshot file, as the VM's
// VMM, writes the record (save) and removes the file, which the VM no
// longer needs. When the record cannot be written proc is killed: the
// record must not say snapshotted while a VMM runs the VM.
func (v *VMM) Restored(proc *launch.Process, save func() error, snapshotFile string) (*launch.Process, error) {
	v.Snapshotted = false
	if err := save(); err != nil {
		_ = proc.Kill()
		return nil, err
	}
	_ = os.Remove(snapshotFile)
	return proc, nil
}

// Reattacher is a backend's sandbox that can take over a VMM an earlier
// daemon started (Lifecycle.Reattach).
type Reattacher interface {
	backend.Sandbox
	Reattach(ctx context.Context, timeout time.Duration) error
}

// Recover brings back the sandbox id of a restarted daemon from its
// record v: its network slot, then (unless snapshotted) its VMM process,
// checked by start time against pid reuse, whose agent must answer within
// timeout. sandbox makes the backend's sandbox of the slot and the process
// (nil while snapshotted). On failure the slot is released and the error
// is NotFound when the VMM is gone.
func Recover(ctx context.Context, mgr *netpolicy.Manager, id string, v VMM, timeout time.Duration, sandbox func(*netpolicy.Sandbox, *launch.Process) Reattacher) (_ backend.Sandbox, err error) {
	ns, err := RecoverNet(ctx, mgr, id, v.Net)
	if err != nil {
		return nil, err
	}
	if ns != nil {
		defer func() {
			if err != nil {
				_ = ns.Close()
			}
		}()
	}
	if v.Snapshotted {
		return sandbox(ns, nil), nil
	}
	proc, err := launch.Attach(v.Pid, v.StartTime)
	if err != nil {
		return nil, errdefs.NotFound("sandbox %s: its VMM is gone: %v", id, err)
	}
	s := sandbox(ns, proc)
	if err := s.Reattach(ctx, timeout); err != nil {
		return nil, err
	}
	return s, nil
}
