package server

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/e2b"
	"github.com/corral-dev/corral/internal/iam"
)

// E2BConfig serves E2B's API (control and envd) on a listener of its own.
type E2BConfig struct {
	// Listen is the TCP address; the SDKs take it as E2B_API_URL and
	// E2B_SANDBOX_URL.
	Listen string
	// APIKey is the one X-API-KEY accepted (e2b_<hex>).
	APIKey string
	// Domain is returned as the sandboxes' domain (default "localhost").
	Domain string
}

// listenE2B starts the E2B API when configured.
func (s *Server) listenE2B(sandboxes *control.Service, guard *control.Guard) error {
	cfg := s.cfg.E2B
	if cfg == nil || cfg.Listen == "" {
		return nil
	}
	// X-API-KEY is a corral token (as it is, or e2b_<hex> of it); the
	// optional --e2b-api-key is the operator's single key: it acts as the
	// node administrator does (every project), on the E2B API's calls only.
	var operator e2b.Authenticator
	if cfg.APIKey != "" {
		if err := e2b.CheckKeyFormat(cfg.APIKey); err != nil {
			return fmt.Errorf("--e2b-api-key: %w", err)
		}
		key := e2b.KeyAuth(cfg.APIKey, "")
		operator = func(ctx context.Context, got string) (iam.Principal, error) {
			if _, err := key(ctx, got); err != nil {
				return iam.Principal{}, err
			}
			return iam.Principal{NodeAdmin: true, TokenID: "e2b-api-key"}, nil
		}
	}
	secret, err := e2bSecret(s.cfg.DataDir)
	if err != nil {
		return err
	}
	h, err := e2b.New(e2b.Config{
		Node:         s.node,
		Control:      sandboxes,
		Authenticate: e2b.TokenAuth(s.iam.Authenticate, operator),
		Authorize:    guard.Authorize,
		Secret:       secret,
		Domain:       cfg.Domain,
		Templates:    s.e2bTemplates,
		Logger:       s.cfg.Logger,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("--e2b-listen %s: %w", cfg.Listen, err)
	}
	s.e2bAddr = ln.Addr().String()
	s.e2bHTTP = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { s.served <- s.e2bHTTP.Serve(ln) }()
	s.cfg.Logger.Info("serving the E2B API", "listen", s.e2bAddr)
	return nil
}

// E2BAddr is the E2B API's listening address ("" when not serving it).
func (s *Server) E2BAddr() string { return s.e2bAddr }

// stopE2B ends the E2B listener: streams still open (long-running
// commands, watches) are cut after a grace period.
func (s *Server) stopE2B(ctx context.Context) error {
	if s.e2bHTTP == nil {
		return nil
	}
	shutCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.e2bHTTP.Shutdown(shutCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return s.e2bHTTP.Close()
}

// e2bSecret reads (or makes, once) the key of the sandboxes' envd access
// tokens, so that tokens stay valid across restarts.
func e2bSecret(dataDir string) ([]byte, error) {
	p := filepath.Join(dataDir, "e2b.secret")
	b, err := os.ReadFile(p)
	if err == nil && len(b) >= 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("e2b secret: %w", err)
	}
	b = make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		return nil, fmt.Errorf("e2b secret: %w", err)
	}
	return b, nil
}

func (s *Server) e2bTemplates(ctx context.Context) ([]e2b.Template, error) {
	imgs, err := s.images.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]e2b.Template, 0, len(imgs))
	for _, img := range imgs {
		out = append(out, e2b.Template{Name: img.Name})
	}
	return out, nil
}
