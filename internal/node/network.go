package node

import (
	"context"
	"slices"
	"strings"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/state"
)

// NetworkUpdate changes a running sandbox's network policy.
type NetworkUpdate struct {
	// Mode "" keeps the current mode.
	Mode string
	// Allow rules are added (or replace the list, with Replace).
	Allow []string
	// Deny rules are removed from the list (matched by canonical form).
	Deny    []string
	Replace bool
}

// UpdateNetwork applies u; the new policy is in force when it returns.
func (n *Node) UpdateNetwork(ctx context.Context, id string, u NetworkUpdate) (backend.Network, error) {
	e, sb, err := n.acquire(ctx, id)
	if err != nil {
		return backend.Network{}, err
	}
	defer e.release()
	nw, ok := sb.(backend.Networker)
	if !ok {
		return backend.Network{}, errdefs.NotSupported("sandbox %s: backend %s cannot change a running sandbox's network", id, e.backend.Name())
	}
	e.netMu.Lock()
	defer e.netMu.Unlock()
	cur := e.snapshot()
	next := backend.Network{Mode: cur.NetworkMode, Allow: cur.NetworkAllow}
	if u.Mode != "" {
		next.Mode = u.Mode
	}
	if next.Allow, err = editRules(next.Allow, u); err != nil {
		return backend.Network{}, err
	}
	if next.Mode == "" || next.Mode == string(netpolicy.ModeNone) {
		// Mode none on a wired sandbox: every rule goes.
		next.Allow = nil
	}
	if err := checkNetwork(next); err != nil {
		return backend.Network{}, err
	}
	if err := nw.UpdateNetwork(ctx, next); err != nil {
		return backend.Network{}, err
	}
	e.mu.Lock()
	e.rec.NetworkMode, e.rec.NetworkAllow = next.Mode, next.Allow
	e.rec.BackendRecord = sb.Record()
	n.putLocked(e)
	e.mu.Unlock()
	return next, nil
}

// editRules applies u's allow and deny lists to rules, in canonical form.
func editRules(rules []string, u NetworkUpdate) ([]string, error) {
	canon := func(field string, i int, s string) (string, error) {
		r, err := netpolicy.ParseRule(s)
		if err != nil {
			return "", errdefs.InvalidArgument("%s[%d]: %v", field, i, err)
		}
		return r.String(), nil
	}
	var out []string
	if !u.Replace {
		for i, s := range rules {
			c, err := canon("network.allow", i, s)
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
	}
	for i, s := range u.Allow {
		c, err := canon("allow", i, s)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	for i, s := range u.Deny {
		c, err := canon("deny", i, s)
		if err != nil {
			return nil, err
		}
		j := slices.Index(out, c)
		if j < 0 {
			return nil, errdefs.InvalidArgument("deny[%d]: %q is not in the allow list (%s)", i, c, strings.Join(out, ", "))
		}
		out = slices.Delete(out, j, j+1)
	}
	return out, nil
}

// NetworkStats returns the refused attempts of a running sandbox (none for
// a sandbox without a network).
func (n *Node) NetworkStats(ctx context.Context, id string) (backend.NetworkStats, error) {
	return withSandbox(ctx, n, id, func(sb backend.Sandbox) (backend.NetworkStats, error) {
		if nw, ok := sb.(backend.Networker); ok {
			return nw.NetworkStats(ctx)
		}
		return backend.NetworkStats{}, nil
	})
}

// NetworkCounters returns the refusal counters of every running or paused
// sandbox with a network, for metrics. Unlike NetworkStats it neither
// resumes a paused sandbox nor counts as activity for its idle timeout.
func (n *Node) NetworkCounters(ctx context.Context) map[string]backend.NetworkStats {
	out := map[string]backend.NetworkStats{}
	for _, e := range n.entries() {
		e.mu.Lock()
		nw, ok := e.sb.(backend.Networker)
		live := !e.deleting && (e.rec.Phase == state.PhaseRunning || e.rec.Phase == state.PhasePaused) &&
			e.rec.NetworkMode != "" && e.rec.NetworkMode != string(netpolicy.ModeNone)
		id := e.rec.ID
		e.mu.Unlock()
		if !ok || !live {
			continue
		}
		if st, err := nw.NetworkStats(ctx); err == nil {
			out[id] = st
		}
	}
	return out
}
