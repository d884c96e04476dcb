package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestPauseKeepsTheSamplerShare: a quick sweep comes back at the
// interval; one that takes more than its share of the interval pushes the
// next one out, so that sweeping takes that share of the time.
func TestPauseKeepsTheSamplerShare(t *testing.T) {
	for _, c := range []struct {
		took, want time.Duration
	}{
		{10 * time.Millisecond, 1990 * time.Millisecond}, // every 2 s, as configured
		{200 * time.Millisecond, 1800 * time.Millisecond},
		{500 * time.Millisecond, 4500 * time.Millisecond}, // every 5 s: a tenth of the time
		{3 * time.Second, 27 * time.Second},
	} {
		if got := pause(2*time.Second, c.took, 0.1); got != c.want {
			t.Errorf("pause after a %v sweep: %v, want %v", c.took, got, c.want)
		}
	}
}

// TestPacedSpacesSlowCalls: paced calls a slow fn no more than its share
// of the time allows, and stops with its context.
func TestPacedSpacesSlowCalls(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var calls atomic.Int32
	start := time.Now()
	go paced(ctx, 10*time.Millisecond, 0.25, done, func() {
		calls.Add(1)
		time.Sleep(20 * time.Millisecond) // twice the interval: one call per 80 ms
	})
	time.Sleep(400 * time.Millisecond)
	cancel()
	<-done
	elapsed := time.Since(start)
	// At the interval, a 20 ms call would run about 13 times in 400 ms;
	// at a quarter of the time, about 5.
	if n := calls.Load(); n < 2 || n > 7 {
		t.Errorf("%d calls of a 20 ms fn in %v at a quarter of the time: want about 5", n, elapsed)
	}
}
