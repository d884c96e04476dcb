package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// Headers of a control→node call.
const (
	principalHeader = "Corral-Cluster-Principal"
	timeHeader      = "Corral-Cluster-Time"
	macHeader       = "Corral-Cluster-Mac"
	// maxSkew bounds how old a signed call may be (replay window).
	maxSkew = 5 * time.Minute
)

// Secret is the cluster secret shared by control instances and nodes.
type Secret []byte

// LoadSecret reads the secret from a file (trailing whitespace dropped);
// it must be at least 16 bytes.
func LoadSecret(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster secret: %w", err)
	}
	s := Secret(strings.TrimSpace(string(b)))
	if len(s) < 16 {
		return nil, errdefs.InvalidArgument("cluster secret %s: %d bytes, need at least 16", path, len(s))
	}
	return s, nil
}

func (s Secret) mac(method, principal, ts string) string {
	m := hmac.New(sha256.New, s)
	fmt.Fprintf(m, "%s\n%s\n%s", method, principal, ts)
	return hex.EncodeToString(m.Sum(nil))
}

// sign sets the headers carrying p, signed for the procedure method.
func (s Secret) sign(h http.Header, method string, p iam.Principal) {
	enc := base64.RawURLEncoding.EncodeToString([]byte(marshal(p)))
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	h.Set(principalHeader, enc)
	h.Set(timeHeader, ts)
	h.Set(macHeader, s.mac(method, enc, ts))
}

// verify checks a call's headers and returns the principal they carry.
// With no secret (mutual TLS alone) the principal is taken from a caller
// whose client certificate the cluster's CA verified.
func (s Secret) verify(r *http.Request, method string) (iam.Principal, error) {
	var p iam.Principal
	h := r.Header
	enc, ts, mac := h.Get(principalHeader), h.Get(timeHeader), h.Get(macHeader)
	if len(s) == 0 {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			return p, errdefs.PermissionDenied("cluster call %s: no client certificate of the cluster's CA", method)
		}
		return decodePrincipal(enc, method)
	}
	if mac == "" {
		return p, errdefs.PermissionDenied("cluster call %s: not signed with the cluster secret", method)
	}
	if !hmac.Equal([]byte(mac), []byte(s.mac(method, enc, ts))) {
		return p, errdefs.PermissionDenied("cluster call %s: bad signature", method)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(sec, 0)).Abs() > maxSkew {
		return p, errdefs.PermissionDenied("cluster call %s: signed at %q, outside the %s window", method, ts, maxSkew)
	}
	return decodePrincipal(enc, method)
}

func decodePrincipal(enc, method string) (iam.Principal, error) {
	var p iam.Principal
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	if err == nil {
		err = json.Unmarshal(raw, &p)
	}
	if err != nil {
		return p, errdefs.InvalidArgument("cluster call %s: principal header: %v", method, err)
	}
	return p, nil
}

// ClientInterceptor signs every outgoing call with the principal of its
// context (control instances calling nodes).
type ClientInterceptor struct{ Secret Secret }

var _ connect.Interceptor = ClientInterceptor{}

func principalOf(ctx context.Context) iam.Principal {
	p, _ := iam.FromContext(ctx)
	return p
}

func (c ClientInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		c.Secret.sign(req.Header(), req.Spec().Procedure, principalOf(ctx))
		return next(ctx, req)
	}
}

func (c ClientInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		c.Secret.sign(conn.RequestHeader(), spec.Procedure, principalOf(ctx))
		return conn
	}
}

func (ClientInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// verifier remembers the headers it verified lately. A control instance
// signs a (procedure, caller) pair alike for a whole second, so most calls
// repeat headers verified before and skip the HMAC and the decoding of the
// principal; the signing time is still checked on every call.
type verifier struct {
	s    Secret
	mu   sync.Mutex
	seen map[signedCall]iam.Principal
}

type signedCall struct{ method, enc, ts, mac string }

// maxVerified bounds the remembered headers (emptied when full).
const maxVerified = 4096

func (v *verifier) verify(r *http.Request, method string) (iam.Principal, error) {
	if len(v.s) == 0 {
		// Mutual TLS alone: the connection, not the headers, is the proof.
		return v.s.verify(r, method)
	}
	h := r.Header
	k := signedCall{method, h.Get(principalHeader), h.Get(timeHeader), h.Get(macHeader)}
	v.mu.Lock()
	p, ok := v.seen[k]
	v.mu.Unlock()
	if ok {
		if sec, err := strconv.ParseInt(k.ts, 10, 64); err == nil && time.Since(time.Unix(sec, 0)).Abs() <= maxSkew {
			return p, nil
		}
	}
	p, err := v.s.verify(r, method)
	if err != nil {
		return p, err
	}
	v.mu.Lock()
	if len(v.seen) >= maxVerified {
		clear(v.seen)
	}
	v.seen[k] = p
	v.mu.Unlock()
	return p, nil
}

// RequireSigned serves only calls signed with the secret (with no secret:
// only calls over mutual TLS), with the principal they carry in the
// request's context (the node then scopes the call as the control
// instance's caller).
func RequireSigned(s Secret, next http.Handler) http.Handler {
	v := &verifier{s: s, seen: map[signedCall]iam.Principal{}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := v.verify(r, r.URL.Path)
		if err != nil {
			// Connect clients read the code from this JSON body.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintf(w, `{"code":"permission_denied","message":%q}`, err.Error())
			return
		}
		next.ServeHTTP(w, r.WithContext(iam.WithPrincipal(r.Context(), p)))
	})
}
