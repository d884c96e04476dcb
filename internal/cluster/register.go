package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// RegistrarConfig configures a node's registration.
type RegistrarConfig struct {
	Etcd *clientv3.Client
	// Record is the node's registration; Load and AsOf are filled in from
	// LoadFunc on every report.
	Record NodeRecord
	// LoadFunc measures the node's committed load.
	LoadFunc func(ctx context.Context) (Load, error)
	// TTL is the lease's time to live: a node that stops renewing is lost
	// this long after its last renewal (default 10s).
	TTL time.Duration
	// Interval is how often the load is reported (default 1s).
	Interval time.Duration
	// Summary, when set, is the node's sandboxes and their generation
	// (NodeAgent.Summary): a new generation is written to the node's
	// summary record at most every SummaryInterval (default 10 Intervals),
	// so that a lost node's sandboxes can be listed.
	Summary         func() (uint64, []*corralv1.Sandbox)
	SummaryInterval time.Duration
	Logger          *slog.Logger
}

// Registrar keeps a node registered under a lease and its load reported.
// When the lease is lost (etcd unreachable past the TTL) the node keeps
// its sandboxes and registers again under a new lease.
type Registrar struct {
	cfg  RegistrarConfig
	stop context.CancelFunc
	done chan struct{}
	// lease is the current lease (read only by run's goroutine and Stop
	// after run ended).
	lease clientv3.LeaseID
	// summaryGen and summaryAt are the last summary written (run's
	// goroutine only, like lease).
	summaryGen uint64
	summaryAt  time.Time
}

// StartRegistrar registers the node and keeps it registered until Stop.
// The first registration happens before it returns.
func StartRegistrar(ctx context.Context, cfg RegistrarConfig) (*Registrar, error) {
	if cfg.TTL <= 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.SummaryInterval <= 0 {
		cfg.SummaryInterval = 10 * cfg.Interval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Registrar{cfg: cfg, done: make(chan struct{})}
	// rctx bounds everything the registrar starts, the lease's keepalive
	// included.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.stop = cancel
	keepalive, err := r.register(ctx, rctx)
	if err != nil {
		cancel()
		return nil, err
	}
	go r.run(rctx, keepalive)
	return r, nil
}

// register grants a lease, writes the member record and the node record
// under the lease, and starts renewing it.
func (r *Registrar) register(ctx, rctx context.Context) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.TTL)
	defer cancel()
	cli := r.cfg.Etcd
	ttl := int64((r.cfg.TTL + time.Second - 1) / time.Second)
	lease, err := cli.Grant(ctx, ttl)
	if err != nil {
		return nil, fmt.Errorf("register node %s: grant lease: %w", r.cfg.Record.ID, err)
	}
	member := MemberRecord{ID: r.cfg.Record.ID, Address: r.cfg.Record.Address, RegisteredAt: time.Now().UTC()}
	if _, err := cli.Put(ctx, membersPrefix+member.ID, marshal(member)); err != nil {
		return nil, fmt.Errorf("register node %s: member record: %w", member.ID, err)
	}
	r.lease = lease.ID
	if err := r.report(ctx); err != nil {
		return nil, err
	}
	// The keepalive lives as long as the registrar, not this call.
	ka, err := cli.KeepAlive(rctx, lease.ID)
	if err != nil {
		return nil, fmt.Errorf("register node %s: keep the lease alive: %w", member.ID, err)
	}
	r.cfg.Logger.Info("node registered", "node", member.ID, "address", member.Address, "lease_ttl", r.cfg.TTL)
	return ka, nil
}

// report writes the node record with its current load under the lease.
func (r *Registrar) report(ctx context.Context) error {
	rec := r.cfg.Record
	load, err := r.cfg.LoadFunc(ctx)
	if err != nil {
		return fmt.Errorf("node %s: measure load: %w", rec.ID, err)
	}
	rec.Load, rec.AsOf = load, time.Now().UTC()
	if _, err := r.cfg.Etcd.Put(ctx, nodesPrefix+rec.ID, marshal(rec), clientv3.WithLease(r.lease)); err != nil {
		return fmt.Errorf("node %s: report: %w", rec.ID, err)
	}
	// The summary is for listing a lost node; failing to write it must
	// not fail the registration.
	if err := r.writeSummary(ctx, rec.AsOf); err != nil {
		r.cfg.Logger.Warn("node sandbox summary", "err", err)
	}
	return nil
}

// writeSummary rewrites the node's sandbox summary when the set of
// sandboxes changed and the last write is SummaryInterval old.
func (r *Registrar) writeSummary(ctx context.Context, asOf time.Time) error {
	if r.cfg.Summary == nil {
		return nil
	}
	gen, sbs := r.cfg.Summary()
	if gen == r.summaryGen || time.Since(r.summaryAt) < r.cfg.SummaryInterval {
		return nil
	}
	id := r.cfg.Record.ID
	b, err := encodeSummary(id, asOf, sbs)
	if err != nil {
		return err
	}
	if _, err := r.cfg.Etcd.Put(ctx, summaryPrefix+id, string(b)); err != nil {
		return fmt.Errorf("node %s: sandbox summary: %w", id, err)
	}
	r.summaryGen, r.summaryAt = gen, time.Now()
	return nil
}

func (r *Registrar) run(ctx context.Context, keepalive <-chan *clientv3.LeaseKeepAliveResponse) {
	defer close(r.done)
	tick := time.NewTicker(r.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-keepalive:
			if ok {
				continue
			}
			// The lease is gone (expired while etcd was unreachable, or
			// revoked): the sandboxes stay; register anew.
			r.cfg.Logger.Warn("node lease lost; registering again", "node", r.cfg.Record.ID)
			keepalive = r.reregister(ctx)
		case <-tick.C:
			rctx, cancel := context.WithTimeout(ctx, r.cfg.Interval*3)
			err := r.report(rctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("node report", "err", err)
			}
		}
	}
}

func (r *Registrar) reregister(ctx context.Context) <-chan *clientv3.LeaseKeepAliveResponse {
	for backoff := 200 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		ka, err := r.register(ctx, ctx)
		if err == nil {
			return ka
		}
		r.cfg.Logger.Warn("register node", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
	}
}

// Stop ends the registration: the lease is revoked, so control instances
// see the node leave at once; with forget (the node deletes its sandboxes
// on the way out) its member record goes too, and it is not reported lost.
func (r *Registrar) Stop(ctx context.Context, forget bool) error {
	r.stop()
	<-r.done
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var errs []error
	if _, err := r.cfg.Etcd.Revoke(ctx, r.lease); err != nil {
		errs = append(errs, fmt.Errorf("revoke lease: %w", err))
	}
	if forget {
		if _, err := r.cfg.Etcd.Delete(ctx, membersPrefix+r.cfg.Record.ID); err != nil {
			errs = append(errs, fmt.Errorf("forget member: %w", err))
		}
		if _, err := r.cfg.Etcd.Delete(ctx, summaryPrefix+r.cfg.Record.ID); err != nil {
			errs = append(errs, fmt.Errorf("forget sandbox summary: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Abandon stops renewing and reporting without revoking the lease, as a
// crashed node would: control instances see the node lost once the lease
// expires. Simulations and tests use it.
func (r *Registrar) Abandon() {
	r.stop()
	<-r.done
}
