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
