package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"strings"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// maxForks bounds one Fork call.
const maxForks = 64

// ForkOfLabel marks each fork with the sandbox it was forked from.
const ForkOfLabel = "corral.fork-of"

// ForkResult is what Fork made: the composition the forks start from and,
// per fork, its sandbox or why it failed.
type ForkResult struct {
	Image string
	// Snapshot is the snapshot the forks were restored from (VM
	// backends; removed once they were made).
	Snapshot string
	// ProcessesCarried: the forks continue the parent's processes (false
	// for containers: only the files are carried).
	ProcessesCarried bool
	Forks            []Fork
}

// Fork is one fork's outcome.
type Fork struct {
	Sandbox *Sandbox // nil when Err is set
	Err     error
}

// Fork makes n new sandboxes that start from sandbox id's files as they
// are now: the writable layer is packed (the parent is frozen meanwhile)
// into a composition over the parent's layers, and each fork is created
// from it with the parent's resources, settings, network policy and labels
// (plus ForkOfLabel), in the parent's project. Processes are not carried: no working checkpoint of
// container processes exists on this host (see docs/rollouts.md). A
// backend that restores snapshots (microvm) forks from one snapshot
// instead, processes and all (forkFromSnapshot). Failures are per fork;
// an invalid request makes nothing.
func (n *Node) Fork(ctx context.Context, id string, count int) (*ForkResult, error) {
	if count < 1 || count > maxForks {
		return nil, errdefs.InvalidArgument("count: %d is out of range (allowed 1 to %d)", count, maxForks)
	}
	e, err := n.lookup(id)
	if err != nil {
		return nil, err
	}
	rec := e.snapshot()
	if _, ok := e.backend.(backend.Restorer); ok {
		return n.forkFromSnapshot(ctx, id, count, map[string]string{ForkOfLabel: id})
	}
	if rec.Backend != "container" {
		return nil, errdefs.NotSupported("not supported: fork of a %s sandbox (containers fork their files, microVMs from a snapshot)", rec.Backend)
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return nil, err
	}
	_, short, _ := strings.Cut(id, "-")
	ref := fmt.Sprintf("fork-%s@%s", short, hex.EncodeToString(suffix))
	packed, err := n.Pack(ctx, PackRequest{ID: id, PackOptions: layers.PackOptions{Ref: ref}})
	if err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	labels := maps.Clone(rec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[ForkOfLabel] = id
	idle, life := rec.IdleTimeout, rec.MaxLifetime
	req := CreateRequest{
		Project: rec.Project, Backend: rec.Backend, Image: packed.Composition.Ref,
		Resources: Resources{CPUMillis: rec.CPUMillis, MemoryBytes: rec.MemoryBytes, DiskBytes: rec.DiskBytes,
			Pids: rec.Pids, BestEffort: rec.BestEffort},
		Workdir: rec.Workdir, User: rec.User, Labels: labels,
		IdleTimeout: &idle, MaxLifetime: &life, IdleAction: rec.IdleAction, Fresh: rec.Fresh,
		Network: backend.Network{Mode: rec.NetworkMode, Allow: rec.NetworkAllow},
	}
	out := &ForkResult{Image: packed.Composition.Ref, Forks: make([]Fork, count)}
	makeForks(id, out.Forks, func() (*Sandbox, error) {
		r := req
		r.Labels = maps.Clone(labels)
		return n.Create(ctx, r)
	})
	return out, nil
}

// makeForks fills forks with the sandboxes made by create, bulkParallel at
// once; a failure is that fork's, named by its index.
func makeForks(id string, forks []Fork, create func() (*Sandbox, error)) {
	inParallel(len(forks), func(i int) {
		sb, err := create()
		if err != nil {
			err = fmt.Errorf("fork %d of sandbox %s: %w", i, id, err)
		}
		forks[i] = Fork{Sandbox: sb, Err: err}
	})
}
