package server

import (
	"context"

	"github.com/corral-dev/corral/internal/hostlimit"
	"github.com/corral-dev/corral/internal/node"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/state"
)

// openHostLimits reads (and unless told not to, raises) the host's limits
// and keeps the daemon a few idle threads for when the host's PIDs run low.
func openHostLimits(cfg Config) (*hostlimit.Guard, error) {
	parent := cgroupParent(cfg)
	var costs map[string]hostlimit.Cost
	serving := 1.0
	if cfg.InitStub {
		costs = map[string]hostlimit.Cost{"container": hostlimit.StubContainerCost}
		serving = cfg.InitStubServing
	}
	return hostlimit.Open(hostlimit.Config{
		Costs:          costs,
		ServingShare:   serving,
		DataDir:        cfg.DataDir,
		SandboxParents: []string{parent, parent + cgroup.IdleSuffix},
		NoRaise:        cfg.NoRaiseLimits,
		SpareThreads:   spareDaemonThreads,
		Logger:         cfg.Logger,
	})
}

// spareDaemonThreads are OS threads the daemon keeps idle, made at start
// and topped up while PIDs are plentiful: Go reuses them, so a burst of
// blocking calls while the host has no PID to spare needs no new thread (a
// failed one is fatal to a Go program).
const spareDaemonThreads = 32

// hostAdmit refuses a create that would take the host past a limit.
func hostAdmit(g *hostlimit.Guard) node.AdmitFunc {
	return func(_ context.Context, rec *state.Record, live func() []*state.Record) error {
		recs := live()
		creating := 0
		for _, r := range recs {
			if r.Phase == state.PhaseCreating {
				creating++
			}
		}
		return g.Admit(rec.Backend, len(recs), creating)
	}
}

// admitAll runs each admission in turn; the first refusal wins.
func admitAll(admits ...node.AdmitFunc) node.AdmitFunc {
	return func(ctx context.Context, rec *state.Record, live func() []*state.Record) error {
		for _, a := range admits {
			if err := a(ctx, rec, live); err != nil {
				return err
			}
		}
		return nil
	}
}
