package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/procfs"
)

// MicroVMSnapshotFigures time snapshots of a running microVM (256 MiB of
// RAM, a counter loop running) and restores of them into new sandboxes,
// beside the cold boot of the same microVM (the peer a restore replaces).
type MicroVMSnapshotFigures struct {
	Snapshot Percentiles `json:"snapshot"`
	Restore  Percentiles `json:"restore"`
	// BootMs is the create of the source microVM (boot to agent ready).
	BootMs float64 `json:"boot_ms"`
	// Bytes is a snapshot's size on disk (memory file and disk copy).
	Bytes int64 `json:"bytes"`
	// ForkMs is one Fork × ForkN (one snapshot, ForkN restores).
	ForkN  int     `json:"fork_n"`
	ForkMs float64 `json:"fork_ms"`
	Failed int     `json:"failed"`
	// ForkRSSMiB and ForkPSSMiB sum the forks' VMM processes (read from
	// /proc when the bench runs on the node; 0 otherwise): RSS counts the
	// pages they share from the snapshot's RAM image in each, PSS once.
	ForkRSSMiB float64 `json:"fork_rss_mib"`
	ForkPSSMiB float64 `json:"fork_pss_mib"`
	Skipped    string  `json:"skipped,omitempty"`
}

// microVMSnapshots takes n snapshots of one running microVM, restores
// each into a new sandbox (deleted again), then forks it × forkN.
func microVMSnapshots(ctx context.Context, t *tracker, n, forkN int) (MicroVMSnapshotFigures, error) {
	f := MicroVMSnapshotFigures{ForkN: forkN}
	start := time.Now()
	sb, err := t.create(ctx, client.CreateOptions{Backend: "microvm", Image: "busybox", Resources: client.Resources{MemoryBytes: 256 << 20}})
	if client.IsInvalidArgument(err) || client.IsUnimplemented(err) || client.IsFailedPrecondition(err) {
		f.Skipped = fmt.Sprintf("no microvm backend on this server: %v", err)
		return f, nil
	}
	if err != nil {
		return f, err
	}
	f.BootMs = ms(time.Since(start))
	defer t.delete(context.WithoutCancel(ctx), sb)
	if _, err := sb.Run(ctx, client.Command{Shell: "(i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.2; done) >/dev/null 2>&1 &"}); err != nil {
		return f, err
	}
	snaps, restores, bytes, err := snapshotRestores(ctx, t, sb, n)
	if err != nil {
		return f, err
	}
	f.Bytes = bytes
	f.Snapshot, f.Restore = Summarise(snaps), Summarise(restores)
	if forkN > 0 {
		start := time.Now()
		res, err := sb.Fork(ctx, forkN)
		if err != nil {
			return f, err
		}
		f.ForkMs = ms(time.Since(start))
		var ids []string
		for _, fk := range res.Forks {
			if fk.Err == nil {
				ids = append(ids, fk.Sandbox.ID())
			}
		}
		f.ForkRSSMiB, f.ForkPSSMiB = vmmMemory(ids)
		f.Failed += t.deleteForks(ctx, res.Forks)
	}
	return f, nil
}

// snapshotRestores takes n snapshots of the running sandbox sb, restores
// each into a new sandbox and deletes both; it returns the times and a
// snapshot's size on disk.
func snapshotRestores(ctx context.Context, t *tracker, sb *client.Sandbox, n int) (snaps, restores []time.Duration, bytes int64, err error) {
	for range n {
		start := time.Now()
		s, err := sb.Snapshot(ctx)
		if err != nil {
			return snaps, restores, bytes, err
		}
		snaps = append(snaps, time.Since(start))
		bytes = s.Bytes
		start = time.Now()
		r, _, err := t.c.Restore(ctx, s.ID, nil)
		if err == nil {
			restores = append(restores, time.Since(start))
			t.mu.Lock()
			t.live[r.ID()] = struct{}{}
			t.mu.Unlock()
			err = t.delete(context.WithoutCancel(ctx), r)
		}
		if derr := t.c.DeleteSnapshot(context.WithoutCancel(ctx), s.ID); err == nil {
			err = derr
		}
		if err != nil {
			return snaps, restores, bytes, err
		}
	}
	return snaps, restores, bytes, nil
}

// vmmMemory sums RSS and PSS of the VMM processes of sandboxes ids, found
// by their "-name corral-<id>" argument.
func vmmMemory(ids []string) (rssMiB, pssMiB float64) {
	want := map[string]bool{}
	for _, id := range ids {
		want["corral-"+id] = true
	}
	var rss, pss int64
	for pid, args := range procfs.Cmdlines() {
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-name" && want[args[i+1]] {
				rollup := procfs.Path(pid, "smaps_rollup")
				rss += statusKB(rollup, "Rss:") << 10
				pss += statusKB(rollup, "Pss:") << 10
			}
		}
	}
	return mib(rss), mib(pss)
}

func (f MicroVMSnapshotFigures) rows() []row {
	if f.Skipped != "" {
		return []row{{"microVM snapshot/restore", "not measured", f.Skipped, ""}}
	}
	return []row{
		{"microVM (256 MiB, running) snapshot p50", f3(f.Snapshot.P50) + " ms",
			fmt.Sprintf("%s MiB on disk; E2B ~%s ms for 256 MiB (published)", f3(float64(f.Bytes)/(1<<20)), f3(e2bPauseSPerGiB*250)), ""},
		{"microVM restore into a new sandbox p50", f3(f.Restore.P50) + " ms",
			fmt.Sprintf("cold boot of the same microVM %s ms (%.2fx); E2B resume ~%d ms (published)", f3(f.BootMs), ratio(f.Restore.P50, f.BootMs), e2bResumeMs), ""},
		{fmt.Sprintf("microVM fork × %d (processes carried)", f.ForkN), f3(f.ForkMs) + " ms",
			fmt.Sprintf("%.2fx one cold boot; %d failed", ratio(f.ForkMs, f.BootMs), f.Failed), ""},
		{fmt.Sprintf("microVM fork × %d: host memory of the forks (PSS)", f.ForkN), f3(f.ForkPSSMiB) + " MiB",
			fmt.Sprintf("RSS %s MiB: the RAM image's pages are shared copy-on-write", f3(f.ForkRSSMiB)), ""},
	}
}
