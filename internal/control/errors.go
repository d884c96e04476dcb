package control

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/corral-dev/corral/internal/errdefs"
)

// codeOf maps corral's error classes to Connect codes; this is the one place
// that mapping lives.
func codeOf(err error) connect.Code {
	switch {
	case errdefs.IsInvalidArgument(err):
		return connect.CodeInvalidArgument
	case errdefs.IsNotFound(err):
		return connect.CodeNotFound
	case errdefs.IsAlreadyExists(err):
		return connect.CodeAlreadyExists
	case errdefs.IsFailedPrecondition(err):
		return connect.CodeFailedPrecondition
	case errdefs.IsResourceExhausted(err):
		return connect.CodeResourceExhausted
	case errdefs.IsUnavailable(err):
		return connect.CodeUnavailable
	case errdefs.IsPermissionDenied(err):
		return connect.CodePermissionDenied
	case errdefs.IsUnauthenticated(err):
		return connect.CodeUnauthenticated
	case errdefs.IsNotSupported(err):
		return connect.CodeUnimplemented
	case errors.Is(err, errdefs.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
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
