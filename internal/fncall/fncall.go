// Package fncall is the fncall backend: short stateless calls served from
// warm pools of resettable container sandboxes (backend.Spec.Resettable),
// one pool per image and memory limit. A call takes an idle sandbox (or
// makes one), writes its input files, runs with its limits, collects output
// and files, and hands the sandbox back to be reset off the call's path; a
// sandbox whose reset fails is destroyed. It imports backend, errdefs and
// storage/layers; never node, control, server or the API packages.
package fncall

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// Images resolves image names to layers. A pool pins its image's layers
// (Acquire) for its lifetime, so that they are not deleted under it.
type Images interface {
	Get(ctx context.Context, name string) (layers.Image, error)
	Acquire(ctx context.Context, name, holder string) (layers.Image, error)
	Release(holder string)
}

// Config configures the service.
type Config struct {
	// Backend makes the sandboxes; they must implement backend.Resetter
	// (the container backend with Spec.Resettable).
	Backend backend.Backend
	Images  Images
	// PoolFloor and PoolCeiling bound each pool's size (default 1 and 16).
	PoolFloor, PoolCeiling int
	// BatchParallel bounds how many calls of one batch run at once
	// (default 8).
	BatchParallel int
	// MaxBatch bounds the calls of one batch (default 1024).
	MaxBatch int
	// CreateTimeout and ResetTimeout bound sandbox creation and reset
	// (default 30s and 5s).
	CreateTimeout, ResetTimeout time.Duration
	// ViewBytes is the writable tmpfs of each sandbox (default 64 MiB).
	ViewBytes int64
	// ColdPython turns the warm python off: every python call then starts
	// python3 afresh.
	ColdPython bool
	// PythonPreload are modules the warm python imports before forking.
	PythonPreload []string
	Logger        *slog.Logger
}

// Service runs calls.
type Service struct {
	cfg  Config
	log  *slog.Logger
	done chan struct{}
	warm warmSet

	mu     sync.Mutex
	pools  map[poolKey]*pool
	closed bool
}

// New returns a service; Close ends it.
func New(cfg Config) (*Service, error) {
	if cfg.Backend == nil || cfg.Images == nil {
		return nil, errdefs.InvalidArgument("fncall: Backend and Images are required")
	}
	if cfg.PoolCeiling <= 0 {
		cfg.PoolCeiling = 16
	}
	cfg.PoolFloor = min(max(cfg.PoolFloor, 0), cfg.PoolCeiling)
	if cfg.BatchParallel <= 0 {
		cfg.BatchParallel = 8
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1024
	}
	if cfg.CreateTimeout <= 0 {
		cfg.CreateTimeout = 30 * time.Second
	}
	if cfg.ResetTimeout <= 0 {
		cfg.ResetTimeout = 5 * time.Second
	}
	if cfg.ViewBytes <= 0 {
		cfg.ViewBytes = 64 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{cfg: cfg, log: cfg.Logger, done: make(chan struct{}), pools: map[poolKey]*pool{},
		warm: warmSet{zyg: map[string]*zygote{}}}, nil
}

// Call runs one call.
func (s *Service) Call(ctx context.Context, req Request) (*Result, error) {
	argv, err := normalize(&req)
	if err != nil {
		return nil, err
	}
	p, err := s.pool(ctx, poolKey{req.Image, req.MemoryBytes})
	if err != nil {
		return nil, err
	}
	req.Env = withDefaults(req.Env, p.env)
	for attempt := 0; ; attempt++ {
		sb, since, err := p.get(ctx)
		if err != nil {
			return nil, fmt.Errorf("fncall: get a sandbox: %w", err)
		}
		res, err := s.run(ctx, sb, &req, argv)
		p.release(sb, since)
		if errors.Is(err, errGoneBeforeStart) && attempt == 0 {
			// The sandbox died between its reset and this call (the
			// release destroys it): nothing of the call ran, so it runs
			// once more on another.
			s.log.Warn("fncall: the pooled sandbox died before the call started; running it on another", "sandbox", sb.ID(), "err", err)
			continue
		}
		return res, err
	}
}

// CallBatch runs calls concurrently (up to Config.BatchParallel) and
// returns their results in order. Every request is checked first: one bad
// request fails the batch before anything runs.
func (s *Service) CallBatch(ctx context.Context, reqs []Request) ([]*Result, error) {
	if len(reqs) == 0 || len(reqs) > s.cfg.MaxBatch {
		return nil, errdefs.InvalidArgument("calls: %d calls is outside 1 .. %d", len(reqs), s.cfg.MaxBatch)
	}
	for i := range reqs {
		r := reqs[i]
		if _, err := normalize(&r); err != nil {
			return nil, fmt.Errorf("calls[%d]: %w", i, err)
		}
	}
	out := make([]*Result, len(reqs))
	errs := make([]error, len(reqs))
	sem := make(chan struct{}, s.cfg.BatchParallel)
	var wg sync.WaitGroup
	for i := range reqs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i], errs[i] = s.Call(ctx, reqs[i])
			if errs[i] != nil {
				errs[i] = fmt.Errorf("calls[%d]: %w", i, errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// pool returns the pool of key, checking the image on first use.
func (s *Service) pool(ctx context.Context, key poolKey) (*pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errdefs.Unavailable("fncall: shutting down")
	}
	if p := s.pools[key]; p != nil {
		return p, nil
	}
	img, err := s.cfg.Images.Acquire(ctx, key.image, key.holder())
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	p := newPool(s, key)
	for _, kv := range img.Env {
		if strings.HasPrefix(kv, "SSL_CERT_FILE=") {
			p.env = append(p.env, kv)
		}
	}
	s.pools[key] = p
	return p, nil
}

// create makes one resettable sandbox for key.
func (s *Service) create(ctx context.Context, key poolKey) (backend.Sandbox, error) {
	img, err := s.cfg.Images.Get(ctx, key.image)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	buf := make([]byte, 6)
	if _, err := rand.Read(buf); err != nil {
		return nil, fmt.Errorf("sandbox id: %w", err)
	}
	sb, err := s.cfg.Backend.Create(ctx, backend.Spec{
		ID:         "fn-" + hex.EncodeToString(buf),
		Layers:     img.Layers,
		Hostname:   "sandbox",
		Resettable: true,
		Resources: backend.Resources{CPUMillis: 1000, MemoryBytes: key.memory,
			DiskBytes: s.cfg.ViewBytes, Pids: 256},
	})
	if err != nil {
		return nil, fmt.Errorf("fncall: create sandbox: %w", err)
	}
	if _, ok := sb.(backend.Resetter); !ok {
		s.destroy(sb)
		return nil, errdefs.NotSupported("fncall: backend %s makes no resettable sandboxes", s.cfg.Backend.Name())
	}
	return sb, nil
}

// destroy stops a sandbox and removes everything of it.
func (s *Service) destroy(sb backend.Sandbox) {
	s.warm.drop(sb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := errors.Join(sb.Stop(ctx), s.cfg.Backend.Cleanup(ctx, sb.ID(), sb.Record()))
	if err != nil {
		s.log.Warn("fncall: destroy sandbox", "sandbox", sb.ID(), "err", err)
	}
}

// Close destroys every pooled sandbox, waiting for those in use (their
// calls are cancelled by the caller's contexts) up to ctx.
func (s *Service) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	pools := s.pools
	s.mu.Unlock()
	for _, p := range pools {
		p.close()
	}
	for _, p := range pools {
		for !p.drained() {
			select {
			case <-ctx.Done():
				return fmt.Errorf("fncall: close: sandboxes still in use: %w", ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	for key := range pools {
		s.cfg.Images.Release(key.holder())
	}
	return nil
}
