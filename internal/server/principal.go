package server

import (
	"context"
	"net"
	"net/http"

	"github.com/corral-dev/corral/internal/iam"
)

// onSocket marks a request's context as having come over the unix socket.
type onSocket struct{}

// markConn is the http.Server's ConnContext: connections on the unix
// socket (root-only, mode 0600) are the node administrator's.
func markConn(ctx context.Context, c net.Conn) context.Context {
	if _, ok := c.(*net.UnixConn); ok {
		return context.WithValue(ctx, onSocket{}, true)
	}
	return ctx
}

// nodeAdminOnSocket gives requests over the unix socket the principal of
// the node administrator and TCP requests none (never the administrator).
// STAND-IN for the tenancy work's authentication, which replaces this one
// function: it gives the socket the same principal and TCP callers their
// token's.
func nodeAdminOnSocket(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(onSocket{}) == true {
			r = r.WithContext(iam.WithPrincipal(r.Context(), iam.Principal{NodeAdmin: true}))
		}
		h.ServeHTTP(w, r)
	})
}
