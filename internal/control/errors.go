package control

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/corral-dev/corral/internal/errdefs"
)

// connectCodes maps corral's error classes to Connect codes, the first
// class an error is of deciding; this is the one place that mapping lives.
var connectCodes = []struct {
	class error
	code  connect.Code
}{
	{errdefs.ErrInvalidArgument, connect.CodeInvalidArgument},
	{errdefs.ErrNotFound, connect.CodeNotFound},
	{errdefs.ErrAlreadyExists, connect.CodeAlreadyExists},
	{errdefs.ErrFailedPrecondition, connect.CodeFailedPrecondition},
	{errdefs.ErrResourceExhausted, connect.CodeResourceExhausted},
	{errdefs.ErrUnavailable, connect.CodeUnavailable},
	{errdefs.ErrPermissionDenied, connect.CodePermissionDenied},
	{errdefs.ErrUnauthenticated, connect.CodeUnauthenticated},
	{errdefs.ErrNotSupported, connect.CodeUnimplemented},
	{errdefs.ErrDeadlineExceeded, connect.CodeDeadlineExceeded},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
	{context.Canceled, connect.CodeCanceled},
}

func codeOf(err error) connect.Code {
	for _, c := range connectCodes {
		if errors.Is(err, c.class) {
			return c.code
		}
	}
	return connect.CodeInternal
}

func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(codeOf(err), err)
}

// ErrorInterceptor turns errdefs-classed errors into Connect errors at the
// edge, so handlers and everything below them return plain Go errors.
type ErrorInterceptor struct{}

var _ connect.Interceptor = ErrorInterceptor{}

func (ErrorInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		return resp, toConnect(err)
	}
}

func (ErrorInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (ErrorInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return toConnect(next(ctx, conn))
	}
}
