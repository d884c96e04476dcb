package lazy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/blob"
)

// A node runs its FS in a server process of its own (Serve), reached over
// a unix socket (Client): the FUSE mount then outlives a daemon restart,
// and the daemon, which forks and execs sandbox processes, never serves
// FUSE itself (see the package doc).

// ServerConfig is what a lazy blob server runs with; it is passed as JSON
// on the server's standard input (it may hold S3 keys).
type ServerConfig struct {
	Config
	Store  blob.Config `json:"store"`
	Socket string      `json:"socket"` // the control socket (mode 0600)
	// AttributeCgroups attributes reads to the reader's cgroup (CgroupOf):
	// GroupStats(cgroup path).
	AttributeCgroups bool `json:"attribute_cgroups,omitempty"`
}

// ServeStdin reads a ServerConfig from r and runs Serve.
func ServeStdin(ctx context.Context, r io.Reader, log *slog.Logger) error {
	var sc ServerConfig
	if err := json.NewDecoder(r).Decode(&sc); err != nil {
		return errdefs.InvalidArgument("lazy blob server config: %v", err)
	}
	return Serve(ctx, sc, log)
}

// Serve mounts the FS and answers on sc.Socket until a Shutdown request
// finds no layer using it (then the FS is closed) or ctx ends (then the
// FS is closed once no layer uses it, retried every second).
func Serve(ctx context.Context, sc ServerConfig, log *slog.Logger) error {
	if sc.Socket == "" {
		return errdefs.InvalidArgument("socket: empty")
	}
	store, err := blob.Open(sc.Store)
	if err != nil {
		return err
	}
	cfg := sc.Config
	cfg.Log = log
	if sc.AttributeCgroups {
		cfg.Attribute = CgroupOf
	}
	f, err := New(ctx, cfg, store)
	if err != nil {
		return err
	}
	if err := os.Remove(sc.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		f.Close()
		return err
	}
	ln, err := net.Listen("unix", sc.Socket)
	if err == nil {
		err = os.Chmod(sc.Socket, 0o600)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("lazy blob server socket: %w", err)
	}
	done := make(chan struct{})
	var once sync.Once
	h := &handler{f: f, log: log, recs: map[string]func() error{}, shutdown: func() { once.Do(func() { close(done) }) }}
	srv := &http.Server{Handler: h.mux(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	log.Info("lazy blob server", "mountpoint", cfg.Mountpoint, "socket", sc.Socket)
	select {
	case <-done: // Shutdown closed the FS already
	case <-ctx.Done():
		for { // Close is idempotent: a Shutdown meanwhile is fine
			err := f.Close()
			if err == nil {
				break
			}
			log.Warn("lazy blob server: waiting for layers to let go", "err", err)
			time.Sleep(time.Second)
		}
	}
	// Gracefully: the shutdown call's own reply is still being written
	// when done closes, and Close would cut it off (the client saw EOF).
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	srv.Close()
	os.Remove(sc.Socket)
	return nil
}

type handler struct {
	f        *FS
	log      *slog.Logger
	mu       sync.Mutex
	recs     map[string]func() error
	nextRec  int
	shutdown func()
}

func (h *handler) mux() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("GET /v1/ping", func(w http.ResponseWriter, r *http.Request) {
		reply(w, map[string]int{"pid": os.Getpid()}, nil)
	})
	decoded(m, "POST /v1/register", func(w http.ResponseWriter, r *http.Request, req struct {
		Digest string `json:"digest"`
		Size   int64  `json:"size"`
	}) {
		path, err := h.f.Register(r.Context(), req.Digest, req.Size)
		reply(w, map[string]string{"path": path}, err)
	})
	m.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		if d := r.URL.Query().Get("digest"); d != "" {
			st, err := h.f.Stats(d)
			reply(w, st, err)
			return
		}
		reply(w, h.f.AllStats(), nil)
	})
	m.HandleFunc("GET /v1/groups", func(w http.ResponseWriter, r *http.Request) {
		reply(w, h.f.GroupStats(r.URL.Query().Get("group")), nil)
	})
	m.HandleFunc("DELETE /v1/groups", func(w http.ResponseWriter, r *http.Request) {
		h.f.ForgetGroup(r.URL.Query().Get("group"))
		reply(w, struct{}{}, nil)
	})
	m.HandleFunc("GET /v1/faults", func(w http.ResponseWriter, r *http.Request) {
		after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
		reply(w, h.f.Faults(after), nil)
	})
	decoded(m, "POST /v1/record", func(w http.ResponseWriter, r *http.Request, req struct {
		Digest string `json:"digest"`
	}) {
		stop, err := h.f.Record(req.Digest)
		if err != nil {
			reply(w, nil, err)
			return
		}
		h.mu.Lock()
		h.nextRec++
		token := strconv.Itoa(h.nextRec)
		h.recs[token] = stop
		h.mu.Unlock()
		reply(w, map[string]string{"token": token}, nil)
	})
	decoded(m, "POST /v1/record/stop", func(w http.ResponseWriter, r *http.Request, req struct {
		Token string `json:"token"`
	}) {
		h.mu.Lock()
		stop, ok := h.recs[req.Token]
		delete(h.recs, req.Token)
		h.mu.Unlock()
		if !ok {
			reply(w, nil, errdefs.NotFound("token: no recording %q", req.Token))
			return
		}
		reply(w, struct{}{}, stop())
	})
	decoded(m, "POST /v1/prefetch", func(w http.ResponseWriter, r *http.Request, req struct {
		Digest string       `json:"digest"`
		Mode   PrefetchMode `json:"mode"`
	}) {
		if _, err := h.f.blob(req.Digest); err != nil {
			reply(w, nil, err)
			return
		}
		h.f.StartPrefetch(req.Digest, req.Mode)
		reply(w, struct{}{}, nil)
	})
	m.HandleFunc("GET /v1/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		if err := h.f.WriteMetrics(w); err != nil {
			h.log.Warn("lazy blob server: metrics", "err", err)
		}
	})
	m.HandleFunc("POST /v1/shutdown", func(w http.ResponseWriter, r *http.Request) {
		err := h.f.Close()
		reply(w, struct{}{}, err)
		if err == nil {
			h.shutdown()
		}
	})
	return m
}

// decoded handles pattern with fn once the request body is decoded into a
// Req (a malformed one is refused).
func decoded[Req any](m *http.ServeMux, pattern string, fn func(w http.ResponseWriter, r *http.Request, req Req)) {
	m.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if decode(w, r, &req) {
			fn(w, r, req)
		}
	})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(v); err != nil {
		reply(w, nil, errdefs.InvalidArgument("request: %v", err))
		return false
	}
	return true
}

// reply writes v as JSON, or err with a status that names its class.
func reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		status := http.StatusInternalServerError
		for _, c := range errorClasses {
			if errors.Is(err, c.class) {
				status = c.status
				break
			}
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

// errorClasses carry errdefs classes across the socket.
var errorClasses = []struct {
	class  error
	status int
	make   func(format string, args ...any) error
}{
	{errdefs.ErrInvalidArgument, http.StatusBadRequest, errdefs.InvalidArgument},
	{errdefs.ErrNotFound, http.StatusNotFound, errdefs.NotFound},
	{errdefs.ErrFailedPrecondition, http.StatusConflict, errdefs.FailedPrecondition},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, errdefs.Unavailable},
}
