package redteam

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestPackExecServed (issue 21, finding 7, second half): a pack of a
// large writable layer froze the sandbox for the whole of mkfs.erofs, so
// an exec sent meanwhile waited for the end of the pack. The node now
// freezes it only to copy the layer (a reflink copy on the XFS pool) and
// builds the layer from the copy: execs sent during the pack must be
// answered before the pack ends (frozen for the whole pack, at most the
// one exec waiting for the thaw could be). The exec times go in the
// report.
func TestPackExecServed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		skipRows(t, backend, "kernel2/pack-exec-served")
		srv, _ := startServer(t)
		sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend, Resources: client.Resources{DiskBytes: 2 << 30}})
		// Incompressible data, in files of 4 MiB: mkfs.erofs reads and
		// hashes every byte (seconds here), the copy is one reflink each.
		testenv.Sh(t, sb, "mkdir -p /data && for i in $(seq 1 150); do head -c 4194304 /dev/urandom > /data/f$i; done && sync")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		packed := make(chan error, 1)
		start := time.Now()
		var packTook time.Duration
		go func() {
			_, err := sb.Pack(ctx, testenv.UniqueName("big")+"@1", client.PackOptions{})
			packTook = time.Since(start)
			packed <- err
		}()
		var during []time.Duration
		var worstAt time.Duration // when the slowest exec was sent, from the pack's start
		var packErr error
		done := false
		for !done {
			t0 := time.Now()
			res, err := sb.Run(ctx, client.Command{Args: []string{"true"}})
			took := time.Since(t0)
			select {
			case packErr = <-packed:
				done = true
			default:
				// Answered while the pack still runs.
				if err == nil && res.ExitCode == 0 {
					during = append(during, took)
					if took >= slices.Max(during) {
						worstAt = t0.Sub(start)
					}
				}
			}
			if err != nil {
				t.Errorf("exec during the pack: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		worst := time.Duration(0)
		if len(during) > 0 {
			worst = slices.Max(during)
		}
		report.Logf("kernel2/pack-exec-served [%s]: pack of 600 MiB took %v; %d execs answered during it, slowest %v (sent %v into the pack), p99 %v",
			backend, packTook.Round(time.Millisecond), len(during), worst.Round(time.Millisecond), worstAt.Round(time.Millisecond), p99(during).Round(time.Millisecond))
		judge(t, backend, []Result{check("kernel2/pack-exec-served", packErr == nil && len(during) >= 2,
			"pack: %v (took %v); %d execs answered before it ended, slowest %v", packErr, packTook.Round(time.Millisecond), len(during), worst.Round(time.Millisecond))})
	})
}
