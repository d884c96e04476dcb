package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/client"
)

// AuthResult compares create→ready through the TCP listener with a
// project token (authentication, project scoping and quota admission on
// every call) against the unix socket (the node administrator), samples
// interleaved so both see the same machine.
type AuthResult struct {
	Addr            string      `json:"addr"`
	TCPToken        Percentiles `json:"tcp_token"`
	Unix            Percentiles `json:"unix"`
	TCPTokenP50Ms   float64     `json:"tcp_token_create_ready_p50_ms"`
	UnixP50Ms       float64     `json:"unix_create_ready_p50_ms"`
	OverheadP50Ms   float64     `json:"auth_overhead_p50_ms"`
	Errors          Errors      `json:"errors"`
	ProjectDeleteMs float64     `json:"project_delete_ms"`
}

// measureAuth makes a throwaway project with a quota (so admission does
// its full work) and a member token, then takes n samples of each path.
func measureAuth(ctx context.Context, t *tracker, o ContainerOptions) (res *AuthResult, err error) {
	res = &AuthResult{Addr: o.TCPAddr}
	project := "corral-bench-" + t.label
	if _, err := t.c.CreateProject(ctx, project, client.Quota{MaxSandboxes: 1000, CPUMillis: 1 << 40, MemoryBytes: 1 << 50}); err != nil {
		return res, fmt.Errorf("bench project: %w", err)
	}
	defer func() {
		start := time.Now()
		derr := t.c.DeleteProject(context.WithoutCancel(ctx), project, false)
		res.ProjectDeleteMs = ms(time.Since(start))
		err = errors.Join(err, derr)
	}()
	_, secret, err := t.c.CreateToken(ctx, client.TokenOptions{Project: project, Role: "member", TTL: time.Hour})
	if err != nil {
		return res, fmt.Errorf("bench token: %w", err)
	}
	tc, err := client.New(o.TCPAddr, client.WithToken(secret))
	if err != nil {
		return res, err
	}
	defer tc.Close()
	// Same label: the admin's final sweep sees and deletes these too.
	tt := &tracker{c: tc, label: t.label, live: map[string]struct{}{}}
	create := client.CreateOptions{Image: o.Image}
	sample := func(tr *tracker) (time.Duration, error) {
		start := time.Now()
		sb, err := tr.create(ctx, create)
		if err != nil {
			return 0, fmt.Errorf("create: %w", err)
		}
		err = runTrue(ctx, sb)
		d := time.Since(start)
		return d, errors.Join(err, tr.delete(ctx, sb))
	}
	// One untimed sample each warms the TCP connection and the pools.
	for _, tr := range []*tracker{t, tt} {
		if _, err := sample(tr); err != nil {
			return res, err
		}
	}
	var viaTCP, viaUnix []time.Duration
	for len(viaTCP) < o.N {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if err := res.Errors.tooMany(o.N); err != nil {
			return res, err
		}
		dt, err := sample(tt)
		if err != nil {
			res.Errors.add(err)
			continue
		}
		du, err := sample(t)
		if err != nil {
			res.Errors.add(err)
			continue
		}
		viaTCP, viaUnix = append(viaTCP, dt), append(viaUnix, du)
	}
	res.TCPToken, res.Unix = Summarise(viaTCP), Summarise(viaUnix)
	res.TCPTokenP50Ms, res.UnixP50Ms = res.TCPToken.P50, res.Unix.P50
	res.OverheadP50Ms = round(res.TCPToken.P50 - res.Unix.P50)
	return res, nil
}
