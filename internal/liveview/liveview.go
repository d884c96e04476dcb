// Package liveview owns the live view of a sandbox's screen: one-time
// tokens bound to a sandbox, and the websocket endpoint that checks them
// and relays binary frames to and from the sandbox's VNC (RFB) server. It
// knows nothing of backends or nodes (the caller passes a dial function)
// and must not import the control, server or CLI packages.
package liveview

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/corral-dev/corral/internal/errdefs"
)

// PathPrefix is where the endpoint is mounted: PathPrefix + sandbox id.
const PathPrefix = "/v1/liveview/"

// TTL bounds: how long a token may wait for its one connection.
const (
	DefaultTTL = time.Minute
	MaxTTL     = time.Hour
	// maxTokens bounds the tokens waiting to be used, so that callers
	// cannot grow the node's memory by asking for tokens.
	maxTokens = 10000
)

// Path is the endpoint of sandbox id.
func Path(id string) string { return PathPrefix + id }

type grant struct {
	sandbox string
	sum     [sha256.Size]byte // of the whole token
	expires time.Time
}

// Tokens are the outstanding one-time tokens. A token is a lookup key and
// a secret; only the token's SHA-256 is kept, compared in constant time.
type Tokens struct {
	mu     sync.Mutex
	grants map[string]grant // by lookup key
	now    func() time.Time
}

// NewTokens returns an empty token store.
func NewTokens() *Tokens { return &Tokens{grants: map[string]grant{}, now: time.Now} }

// CheckTTL turns a requested TTL (0: the default) into the one used, or
// an error naming the field and its limits.
func CheckTTL(ttl time.Duration) (time.Duration, error) {
	switch {
	case ttl == 0:
		return DefaultTTL, nil
	case ttl < 0 || ttl > MaxTTL:
		return 0, errdefs.InvalidArgument("ttl_seconds: %d must be between 1 and %d (0 means %d)",
			int64(ttl/time.Second), int64(MaxTTL/time.Second), int64(DefaultTTL/time.Second))
	}
	return ttl, nil
}

// Issue makes a token that opens one live view of sandbox within ttl.
func (t *Tokens) Issue(sandbox string, ttl time.Duration) (token string, expires time.Time, err error) {
	ttl, err = CheckTTL(ttl)
	if err != nil {
		return "", time.Time{}, err
	}
	var key [9]byte
	var secret [32]byte
	_, _ = rand.Read(key[:])
	_, _ = rand.Read(secret[:])
	k := hex.EncodeToString(key[:])
	token = k + "." + base64.RawURLEncoding.EncodeToString(secret[:])
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.grants) >= maxTokens {
		// Unused tokens are dropped here, when they crowd new ones out
		// (Redeem drops used and expired ones it meets).
		for k, g := range t.grants {
			if !now.Before(g.expires) {
				delete(t.grants, k)
			}
		}
	}
	if len(t.grants) >= maxTokens {
		return "", time.Time{}, errdefs.ResourceExhausted("live view: %d tokens are waiting to be used on this server; try again when some expired", maxTokens)
	}
	expires = now.Add(ttl)
	t.grants[k] = grant{sandbox: sandbox, sum: sha256.Sum256([]byte(token)), expires: expires}
	return token, expires, nil
}

// errRefused is every reason a token does not open a view: unknown, used,
// expired or for another sandbox look alike to the caller.
var errRefused = errors.New("live view token refused (unknown, used, expired or for another sandbox)")

// Redeem uses up token for sandbox. A token for another sandbox is left
// unused (its holder may still use it).
func (t *Tokens) Redeem(sandbox, token string) error {
	k, _, ok := strings.Cut(token, ".")
	if !ok {
		return errRefused
	}
	sum := sha256.Sum256([]byte(token))
	t.mu.Lock()
	defer t.mu.Unlock()
	g, found := t.grants[k]
	if !found || subtle.ConstantTimeCompare(g.sum[:], sum[:]) != 1 {
		return errRefused
	}
	if !t.now().Before(g.expires) {
		delete(t.grants, k)
		return errRefused
	}
	if subtle.ConstantTimeCompare([]byte(g.sandbox), []byte(sandbox)) != 1 {
		return errRefused
	}
	delete(t.grants, k)
	return nil
}

// Dial opens a connection to sandbox's VNC server; closing it ends the
// node's hold on the sandbox.
type Dial func(ctx context.Context, sandbox string) (net.Conn, error)

// Open checks token for sandbox and returns the stream to relay; a
// *StatusError says which HTTP status refuses the websocket.
type Open func(ctx context.Context, sandbox, token string) (net.Conn, error)

// Local is the node's Open: Redeem, then dial (nothing is dialled for a
// refused token).
func Local(tokens *Tokens, dial Dial) Open {
	return func(ctx context.Context, sandbox, token string) (net.Conn, error) {
		if err := tokens.Redeem(sandbox, token); err != nil {
			return nil, &StatusError{Code: http.StatusForbidden, Msg: "permission denied: " + err.Error()}
		}
		return dial(ctx, sandbox)
	}
}

// StatusError is a refusal with its HTTP status (a node's answer that a
// control instance passes on).
type StatusError struct {
	Code int
	Msg  string
}

func (e *StatusError) Error() string { return e.Msg }

// Handler serves PathPrefix: a websocket GET with ?token= that Open
// accepts is upgraded, and its binary messages are relayed to and from
// the stream Open returned. Without a token it answers 401; a refused
// token gets Open's status (403).
type Handler struct {
	Open   Open
	Logger *slog.Logger

	mu     sync.Mutex
	closed bool
	live   map[*websocket.Conn]struct{}
}

var upgrader = websocket.Upgrader{
	ReadBufferSize:  32 << 10,
	WriteBufferSize: 64 << 10,
	// noVNC asks for "binary"; other clients ask for nothing.
	Subprotocols: []string{"binary"},
	// The one-time token in the URL is the only credential: no cookie or
	// ambient authority rides along, so a page of another origin gains
	// nothing a token holder does not already have.
	CheckOrigin: func(*http.Request) bool { return true },
}

// maxClientMessage bounds one message from the viewer (RFB client
// messages are small; a clipboard paste is the largest).
const maxClientMessage = 1 << 20

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, PathPrefix)
	if id == "" || strings.Contains(id, "/") {
		http.Error(w, "live view: the path is "+PathPrefix+"<sandbox id>", http.StatusNotFound)
		return
	}
	token := r.URL.Query().Get("token")
	if token == "" {
		http.Error(w, "unauthenticated: live view needs ?token= from the LiveView call", http.StatusUnauthorized)
		return
	}
	if !websocket.IsWebSocketUpgrade(r) {
		http.Error(w, "live view: a websocket upgrade is required", http.StatusBadRequest)
		return
	}
	vnc, err := h.Open(r.Context(), id, token)
	if err != nil {
		http.Error(w, "live view: "+err.Error(), httpStatus(err))
		return
	}
	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		vnc.Close() // Upgrade has answered the client
		return
	}
	if !h.track(ws) {
		ws.Close()
		vnc.Close()
		return
	}
	defer h.untrack(ws)
	h.log().Info("live view opened", "sandbox", id, "remote", r.RemoteAddr)
	err = relay(ws, vnc)
	h.log().Info("live view closed", "sandbox", id, "err", err)
}

func (h *Handler) log() *slog.Logger {
	if h.Logger == nil {
		return slog.Default()
	}
	return h.Logger
}

func (h *Handler) track(ws *websocket.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	if h.live == nil {
		h.live = map[*websocket.Conn]struct{}{}
	}
	h.live[ws] = struct{}{}
	return true
}

func (h *Handler) untrack(ws *websocket.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.live, ws)
}

// Close ends every open live view (hijacked connections outlive the HTTP
// server's Shutdown) and refuses new ones.
func (h *Handler) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for ws := range h.live {
		ws.Close()
	}
}

func httpStatus(err error) int {
	var se *StatusError
	switch {
	case errors.As(err, &se):
		return se.Code
	case errdefs.IsNotFound(err):
		return http.StatusNotFound
	case errdefs.IsNotSupported(err), errdefs.IsFailedPrecondition(err):
		return http.StatusConflict
	case errdefs.IsUnavailable(err):
		return http.StatusServiceUnavailable
	}
	return http.StatusBadGateway
}

// relay copies binary messages to vnc and vnc's bytes back as binary
// messages until either side ends; it then closes both.
func relay(ws *websocket.Conn, vnc net.Conn) error {
	ws.SetReadLimit(maxClientMessage)
	errc := make(chan error, 2)
	go func() {
		for {
			kind, p, err := ws.ReadMessage()
			if err != nil {
				errc <- err
				return
			}
			if kind != websocket.BinaryMessage {
				errc <- errors.New("live view: text message from the viewer (RFB is binary)")
				return
			}
			if _, err := vnc.Write(p); err != nil {
				errc <- err
				return
			}
		}
	}()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := vnc.Read(buf)
			if n > 0 {
				if werr := ws.WriteMessage(websocket.BinaryMessage, buf[:n]); werr != nil {
					errc <- werr
					return
				}
			}
			if err != nil {
				// The VNC server went away (the sandbox ended): tell the
				// viewer why before closing.
				_ = ws.WriteControl(websocket.CloseMessage,
					websocket.FormatCloseMessage(websocket.CloseGoingAway, "the sandbox's screen closed"), time.Now().Add(time.Second))
				errc <- err
				return
			}
		}
	}()
	err := <-errc
	ws.Close()
	vnc.Close()
	<-errc
	return err
}
