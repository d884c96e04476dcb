// Package e2b serves E2B's API on one listener so that the unchanged e2b
// SDKs drive corral: the REST control API (sandboxes, timeouts, pause and
// connect, listing) and envd, the in-sandbox agent protocol of every
// sandbox (Connect services process.Process and filesystem.Filesystem, HTTP
// /files and /health). envd calls are routed by their E2b-Sandbox-Id header
// or by a Host of the form <port>-<sandbox id>.<domain> (other ports of
// such hosts are proxied to servers on the sandbox's loopback); nothing
// runs inside the sandbox to serve them: the node does the work from
// outside.
//
// Control calls go through internal/control (so its checks apply); envd
// calls use internal/node directly once the sandbox's access token checks
// out. The package must not import the server, CLI or client packages.
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/e2b/envdpb/filesystem/filesystempbconnect"
	"github.com/corral-dev/corral/internal/e2b/envdpb/process/processpbconnect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/node"
	"github.com/corral-dev/corral/internal/state"
)

// EnvdVersion is the envd version reported for every sandbox: the newest
// whose features the SDKs gate on are all implemented here (default user,
// stdin control and closeStdin, recursive watch, octet-stream uploads).
// 0.6.2 would promise file metadata in xattrs, which is not implemented.
const EnvdVersion = "0.5.7"

// EnvdPort is the port the SDKs address envd on.
const EnvdPort = 49983

// Config configures the E2B API.
type Config struct {
	Node    *node.Node
	Control *control.Service
	// Authenticate maps an X-API-KEY value to the caller (see KeyAuth).
	Authenticate Authenticator
	// Authorize applies the corral API's rule for procedure to msg for the
	// caller in ctx (role, project scoping, images); nil allows all.
	Authorize func(ctx context.Context, procedure string, msg any) error
	// Secret keys the per-sandbox envd access tokens (HMAC); it must stay
	// the same across restarts for tokens handed out earlier to work.
	Secret []byte
	// Domain is returned as each sandbox's domain: clients that build
	// hosts as <port>-<id>.<domain> reach this listener when that name
	// resolves to it.
	Domain string
	// Templates lists the images and compositions sandboxes can start from.
	Templates func(ctx context.Context) ([]Template, error)
	Logger    *slog.Logger
}

// Template is one image or composition offered as an E2B template.
type Template struct {
	Name      string
	SizeBytes int64
}

// Server is the E2B API; it is an http.Handler.
type Server struct {
	cfg  Config
	envd http.Handler
	api  http.Handler
	log  *slog.Logger
}

// New returns the E2B API server.
func New(cfg Config) (*Server, error) {
	if cfg.Node == nil || cfg.Control == nil || cfg.Authenticate == nil || len(cfg.Secret) < 16 {
		return nil, errors.New("e2b: Node, Control, Authenticate and a Secret of at least 16 bytes are required")
	}
	if cfg.Domain == "" {
		cfg.Domain = "localhost"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	envd := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithInterceptors(control.ErrorInterceptor{}), connect.WithReadMaxBytes(16 << 20)}
	path, h := processpbconnect.NewProcessHandler(&processService{s: s}, opts...)
	envd.Handle(path, h)
	path, h = filesystempbconnect.NewFilesystemHandler(&filesystemService{s: s, watchers: map[string]*pollWatcher{}}, opts...)
	envd.Handle(path, h)
	envd.HandleFunc("GET /files", s.signed("read", s.getFile))
	envd.HandleFunc("POST /files", s.signed("write", s.postFiles))
	envd.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	s.envd = envd
	s.api = s.controlMux()
	return s, nil
}

type sandboxKey struct{}

// ServeHTTP routes envd calls (by header or host) to the sandbox's envd and
// everything else to the control API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port := s.sandboxOf(r)
	if id == "" && r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" && r.Header.Get("X-Access-Token") == "" {
		// A signed URL built on a shared sandbox URL names no sandbox:
		// the signature, made with one sandbox's token, picks it.
		id, port = s.signedBy(r), EnvdPort
		if id == "" {
			writeError(w, http.StatusUnauthorized, "the signature matches no sandbox")
			return
		}
	}
	if id == "" {
		s.api.ServeHTTP(w, r)
		return
	}
	if port != EnvdPort {
		s.proxyPort(w, r, id, port)
		return
	}
	if !s.envdAuthorized(r, id) {
		writeError(w, http.StatusUnauthorized, "invalid or missing X-Access-Token for sandbox "+id)
		return
	}
	// As E2B's proxy: a sandbox that is not running answers 502 (the SDKs'
	// isRunning and their "sandbox is not running" errors key on it).
	if sb, err := s.cfg.Node.Get(r.Context(), id); err != nil || sb.Phase == state.PhaseStopped {
		writeError(w, http.StatusBadGateway, "sandbox "+id+" is not running")
		return
	}
	s.envd.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxKey{}, id)))
}

// proxyPort forwards a request to a server listening on port on the
// sandbox's loopback. As on E2B (public traffic, the default), it needs
// no token: knowing the sandbox id is enough.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request, id string, port int) {
	if sb, err := s.cfg.Node.Get(r.Context(), id); err != nil || sb.Phase == state.PhaseStopped {
		writeError(w, http.StatusBadGateway, "sandbox "+id+" is not running")
		return
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			pr.Out.Host = r.Host
			pr.Out.Header.Del("E2b-Sandbox-Id")
			pr.Out.Header.Del("E2b-Sandbox-Port")
			pr.Out.Header.Del("X-Access-Token")
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.cfg.Node.DialPort(ctx, id, port)
			},
			DisableKeepAlives: true,
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: port %d: %v", id, port, err))
		},
	}
	p.ServeHTTP(w, r)
}

// sandboxOf returns the sandbox and port an envd request is for: from the
// E2b-Sandbox-Id (and E2b-Sandbox-Port) headers, else from a Host
// <port>-<id>.<domain>. An empty id means a control API request.
func (s *Server) sandboxOf(r *http.Request) (string, int) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		port := EnvdPort
		if p, err := strconv.Atoi(r.Header.Get("E2b-Sandbox-Port")); err == nil {
			port = p
		}
		return id, port
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, rest, ok := strings.Cut(host, ".")
	if !ok || !strings.EqualFold(rest, domainHost(s.cfg.Domain)) {
		return "", 0
	}
	p, id, ok := strings.Cut(label, "-")
	port, err := strconv.Atoi(p)
	if !ok || err != nil || id == "" {
		return "", 0
	}
	return id, port
}

// domainHost is the domain without a port.
func domainHost(d string) string {
	if h, _, err := net.SplitHostPort(d); err == nil {
		return h
	}
	return d
}

// accessToken is sandbox id's envd access token: derived, not stored, so
// it survives restarts and needs no record.
func (s *Server) accessToken(id string) string {
	m := hmac.New(sha256.New, s.cfg.Secret)
	m.Write([]byte("e2b envd access token\x00" + id))
	return hex.EncodeToString(m.Sum(nil)[:20])
}

// envdAuthorized checks X-Access-Token; /files may instead carry a
// signature (checked by the handler).
func (s *Server) envdAuthorized(r *http.Request, id string) bool {
	if tok := r.Header.Get("X-Access-Token"); tok != "" {
		return hmac.Equal([]byte(tok), []byte(s.accessToken(id)))
	}
	return r.URL.Path == "/files" && r.URL.Query().Get("signature") != ""
}

// signedBy returns the sandbox whose token signed a /files URL, or "".
func (s *Server) signedBy(r *http.Request) string {
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	token := ""
	for {
		page, next, err := s.cfg.Node.List(r.Context(), node.ListFilter{PageSize: 1000, PageToken: token})
		if err != nil {
			return ""
		}
		for _, sb := range page {
			if s.checkSignature(r, sb.ID, op) == nil {
				return sb.ID
			}
		}
		if token = next; token == "" {
			return ""
		}
	}
}

// may checks a control call the handler makes on the caller's behalf as
// if the caller had made it on the corral API.
// envd calls carry no API key (their sandbox's access token admitted
// them), so they have no principal and are not checked again here.
func (s *Server) may(ctx context.Context, procedure string, msg any) error {
	if _, ok := iam.FromContext(ctx); !ok || s.cfg.Authorize == nil {
		return nil
	}
	return s.cfg.Authorize(ctx, procedure, msg)
}

func sandboxFrom(ctx context.Context) string {
	id, _ := ctx.Value(sandboxKey{}).(string)
	return id
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apiError{Code: status, Message: msg})
}

// statusOf maps the errdefs classes to HTTP statuses.
func statusOf(err error) int {
	switch {
	case errdefs.IsInvalidArgument(err):
		return http.StatusBadRequest
	case errdefs.IsNotFound(err):
		return http.StatusNotFound
	case errdefs.IsAlreadyExists(err), errdefs.IsFailedPrecondition(err):
		return http.StatusConflict
	case errdefs.IsResourceExhausted(err):
		return http.StatusTooManyRequests
	case errdefs.IsUnavailable(err):
		return http.StatusServiceUnavailable
	case errdefs.IsPermissionDenied(err):
		return http.StatusForbidden
	case errdefs.IsNotSupported(err):
		return http.StatusNotImplemented
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		switch ce.Code() {
		case connect.CodeInvalidArgument:
			return http.StatusBadRequest
		case connect.CodeNotFound:
			return http.StatusNotFound
		case connect.CodeUnauthenticated:
			return http.StatusUnauthorized
		case connect.CodePermissionDenied:
			return http.StatusForbidden
		}
	}
	return http.StatusInternalServerError
}

func writeErr(w http.ResponseWriter, err error) {
	writeError(w, statusOf(err), err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
