package client

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"

	"connectrpc.com/connect"
)

// A server that dies mid-call resets the connection, which Connect names
// "canceled"; the SDK reports it as unavailable (retry elsewhere), and
// keeps "canceled" for the caller's own cancellation.
func TestWrapErrConnectionLost(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "unix", Err: syscall.ECONNRESET}
	cases := []struct {
		err  error
		want Code
	}{
		{connect.NewError(connect.CodeCanceled, fmt.Errorf("post: %w", reset)), CodeUnavailable},
		{connect.NewError(connect.CodeCanceled, &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}), CodeUnavailable},
		{connect.NewError(connect.CodeCanceled, context.Canceled), CodeCanceled},
		{connect.NewError(connect.CodeUnknown, fmt.Errorf("boom")), CodeInternal},
		{connect.NewError(connect.CodeNotFound, fmt.Errorf("no such sandbox")), CodeNotFound},
	}
	for _, c := range cases {
		if got := CodeOf(wrapErr(c.err)); got != c.want {
			t.Errorf("wrapErr(%v): code %q, want %q", c.err, got, c.want)
		}
	}
}
