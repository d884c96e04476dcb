package bench

import (
	"context"
	"sync"
	"time"
)

// phase runs one round of a measured rate for d; round numbers the round
// (0, 1, …).
type phase func(ctx context.Context, d time.Duration, round int) Rate

// Rounds of alternate. A round's drain, where the workers stop one by one,
// costs no rate (see sustain).
const (
	minRound  = 5 * time.Second
	maxRounds = 4
)

// alternate measures a and its peer b for d each in all, in rounds that
// alternate them (a b, b a, a b, …), and returns each one's rate over its
// rounds. On a shared host the machine's speed drifts by more than the
// ratios these benchmarks report; a peer measured after the other phases
// would see another machine.
func alternate(ctx context.Context, d time.Duration, a, b phase) (Rate, Rate) {
	rounds := min(max(int(d/minRound), 1), maxRounds)
	each := d / time.Duration(rounds)
	var ra, rb Rate
	for i := 0; i < rounds && ctx.Err() == nil; i++ {
		if i%2 == 0 {
			ra.add(a(ctx, each, i))
			rb.add(b(ctx, each, i))
		} else {
			rb.add(b(ctx, each, i))
			ra.add(a(ctx, each, i))
		}
	}
	return ra, rb
}

// add counts round x into r; the rate is the rounds' rates weighted by
// their lengths.
func (r *Rate) add(x Rate) {
	if secs := r.Seconds + x.Seconds; secs > 0 {
		r.PerS = round((r.PerS*r.Seconds + x.PerS*x.Seconds) / secs)
	}
	r.Cycles += x.Cycles
	r.Errors += x.Errors
	r.Seconds = round(r.Seconds + x.Seconds)
	if r.FirstErr == "" {
		r.FirstErr = x.FirstErr
	}
}

// againstRunc measures corral and the runc peer running args with
// o.Concurrency workers, alternating (see alternate); without runc, corral
// alone for o.Duration, and why there is no peer.
func againstRunc(ctx context.Context, o ContainerOptions, corral phase, args []string, label string) (Rate, *Rate, string) {
	runc, err := FindRunc()
	if err != nil {
		return corral(ctx, o.Duration, 0), nil, err.Error()
	}
	p, err := newRuncPeer(ctx, runc, o.Rootfs, args, o.Concurrency, "corral-bench-"+label)
	if err != nil {
		return corral(ctx, o.Duration, 0), nil, "runc peer setup: " + err.Error()
	}
	defer p.Close()
	peer := func(ctx context.Context, d time.Duration, round int) Rate {
		// Container ids stay unique across rounds.
		return sustain(ctx, o.Concurrency, d, func(ctx context.Context, worker, seq int) error {
			return p.cycle(ctx, worker, round<<24|seq)
		})
	}
	c, r := alternate(ctx, o.Duration, corral, peer)
	if r.Cycles == 0 {
		return c, nil, "runc completed no cycle: " + r.FirstErr
	}
	return c, &r, ""
}

// cycles is the phase of cycle on conc workers.
func cycles(conc int, cycle func(ctx context.Context, worker, seq int) error) phase {
	return func(ctx context.Context, d time.Duration, _ int) Rate { return sustain(ctx, conc, d, cycle) }
}

// callMeter collects the latencies of calls over one or more rounds.
type callMeter struct {
	conc int
	call func(ctx context.Context) error

	mu  sync.Mutex
	lat []time.Duration
}

// round runs call on m.conc workers for d.
func (m *callMeter) round(ctx context.Context, d time.Duration, _ int) Rate {
	return sustain(ctx, m.conc, d, func(ctx context.Context, _, _ int) error {
		start := time.Now()
		err := m.call(ctx)
		lat := time.Since(start)
		m.mu.Lock()
		m.lat = append(m.lat, lat)
		m.mu.Unlock()
		return err
	})
}

// result is rate, that of the rounds, with the latencies of their calls.
func (m *callMeter) result(rate Rate) CallRate {
	p := Summarise(m.lat)
	return CallRate{Rate: rate, P50Ms: p.P50, P99Ms: p.P99}
}
