package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/storage/layers"
)

// TestRuncPeer runs the runc peer's cycle for real: a few `runc run true`
// on two workers. It checks that the peer works, not how fast.
func TestRuncPeer(t *testing.T) {
	runc := needRunc(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := newRuncPeer(ctx, runc, "", []string{"true"}, 2, "corral-bench-test")
	if err != nil {
		t.Fatal(err)
	}
	dir := p.dir
	defer p.Close()
	for i := range 3 {
		if err := p.cycle(ctx, i%2, i); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
	}
	r := sustain(ctx, 2, 500*time.Millisecond, p.cycle)
	if r.Errors != 0 || r.Cycles == 0 {
		t.Errorf("sustain: %+v, want cycles and no errors", r)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Close left %s behind", dir)
	}
}

// TestAgainstRunc runs a corral phase against the real runc peer: both
// run, for the duration asked, and runc's rate comes back with no reason.
func TestAgainstRunc(t *testing.T) {
	needRunc(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ran []time.Duration
	corral := func(_ context.Context, d time.Duration, _ int) Rate {
		ran = append(ran, d)
		return Rate{Cycles: 7, Seconds: d.Seconds(), PerS: 7 / d.Seconds()}
	}
	c, runc, reason := againstRunc(ctx, ContainerOptions{Concurrency: 2, Duration: 500 * time.Millisecond}, corral, []string{"true"}, "test")
	if reason != "" || runc == nil {
		t.Fatalf("no runc rate: %q", reason)
	}
	if runc.Cycles == 0 || runc.Errors != 0 {
		t.Errorf("runc: %+v, want cycles and no errors", *runc)
	}
	if len(ran) != 1 || ran[0] != 500*time.Millisecond || c.Cycles != 7 {
		t.Errorf("corral phase ran %v and gave %+v, want one round of 500ms and its 7 cycles", ran, c)
	}
}

// needRunc returns Debian's runc, or skips: the peer needs it, root and a
// static busybox for its rootfs.
func needRunc(t *testing.T) string {
	t.Helper()
	runc, err := FindRunc()
	if err != nil {
		t.Skip("runc peer: ", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("runc peer: needs root to create containers")
	}
	if _, err := layers.StaticBusybox(); err != nil {
		t.Skip("runc peer: ", err)
	}
	return runc
}
