package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// TestVMMRecordIsFlat: a backend record embedding VMM keeps the field
// names of the run dirs written before VMM existed, so a daemon of this
// build recovers them.
func TestVMMRecordIsFlat(t *testing.T) {
	type record struct {
		Driver string `json:"driver"`
		VMM
	}
	old := []byte(`{"driver":"qemu","pid":42,"start_time":7,"snapshotted":true,"mac":"02:00:00:00:00:01"}`)
	var got record
	if err := json.Unmarshal(old, &got); err != nil {
		t.Fatal(err)
	}
	want := VMM{Pid: 42, StartTime: 7, Snapshotted: true, MAC: "02:00:00:00:00:01"}
	if got.VMM != want || got.Driver != "qemu" {
		t.Errorf("read %+v, want %+v", got, want)
	}
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]any
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"driver", "pid", "start_time", "snapshotted", "mac"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("written record %s lacks top-level %q", b, k)
		}
	}
	if pid, _ := got.Live(); pid != 0 {
		t.Errorf("a snapshotted VM's live pid is %d, want none", pid)
	}
}

// TestVMMRestored: a restore whose record cannot be written kills the
// new VMM and keeps the snapshot file; one that is written removes it.
func TestVMMRestored(t *testing.T) {
	snap := filepath.Join(t.TempDir(), "snapshot")
	if err := os.WriteFile(snap, []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	v := VMM{Snapshotted: true}
	proc := startVMM(t)
	if _, err := v.Restored(proc, func() error { return errors.New("disk full") }, snap); err == nil {
		t.Fatal("restore with an unwritable record succeeded")
	}
	select {
	case <-proc.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the VMM of a restore whose record failed still runs")
	}
	if _, err := os.Stat(snap); err != nil {
		t.Errorf("snapshot file after a failed restore: %v", err)
	}
	proc = startVMM(t)
	v.Started(proc)
	saved := false
	if _, err := v.Restored(proc, func() error { saved = !v.Snapshotted; return nil }, snap); err != nil {
		t.Fatal(err)
	}
	if !saved {
		t.Error("the record was written still saying snapshotted")
	}
	if _, err := os.Stat(snap); !os.IsNotExist(err) {
		t.Errorf("snapshot file after a restore: %v", err)
	}
	if pid, start := v.Live(); pid != proc.Pid || start != proc.StartTime {
		t.Errorf("live VMM %d/%d, want %d/%d", pid, start, proc.Pid, proc.StartTime)
	}
}

// reattached is a backend's sandbox as far as Recover uses one.
type reattached struct {
	backend.Sandbox
	proc *launch.Process
	err  error
	did  bool
}

func (r *reattached) Reattach(context.Context, time.Duration) error { r.did = true; return r.err }

// TestRecover: a recorded live VMM is attached and reattached; a gone one
// (pid reused: another start time) is NotFound; a snapshotted VM is
// recovered without a process; a networked record on a node without a
// network manager is NotFound.
func TestRecover(t *testing.T) {
	ctx := context.Background()
	recover := func(v VMM, reattachErr error) (*reattached, error) {
		s, err := Recover(ctx, nil, "s1", v, time.Second, func(_ *netpolicy.Sandbox, p *launch.Process) Reattacher {
			return &reattached{proc: p, err: reattachErr}
		})
		if err != nil {
			return nil, err
		}
		return s.(*reattached), nil
	}
	proc := startVMM(t)
	var v VMM
	v.Started(proc)
	s, err := recover(v, nil)
	if err != nil || s.proc == nil || s.proc.Pid != proc.Pid || !s.did {
		t.Fatalf("live VMM: %+v %v", s, err)
	}
	if _, err := recover(v, errdefs.NotFound("agent does not answer")); !errdefs.IsNotFound(err) {
		t.Errorf("failed reattach: %v", err)
	}
	gone := v
	gone.StartTime++
	if _, err := recover(gone, nil); !errdefs.IsNotFound(err) {
		t.Errorf("VMM with another start time: %v, want NotFound", err)
	}
	v.Hibernated()
	if s, err := recover(v, nil); err != nil || s.proc != nil || s.did {
		t.Errorf("snapshotted: %+v %v, want a sandbox without a process, not reattached", s, err)
	}
	v.Net = &netpolicy.Record{}
	if _, err := recover(v, nil); !errdefs.IsNotFound(err) {
		t.Errorf("networked without a manager: %v, want NotFound", err)
	}
}
