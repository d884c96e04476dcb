package control

import (
	"context"
	"errors"
	"strings"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/metrics"
)

// MetricsInterceptor counts API requests by procedure and code, and fncall
// calls by verdict. Put it outside ErrorInterceptor so it sees Connect codes.
type MetricsInterceptor struct{ M *metrics.Metrics }

var _ connect.Interceptor = MetricsInterceptor{}

func (i MetricsInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		i.M.CountRequest(method(req.Spec().Procedure), codeName(err))
		if err == nil {
			i.countVerdicts(resp.Any())
		}
		return resp, err
	}
}

func (MetricsInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i MetricsInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		err := next(ctx, conn)
		i.M.CountRequest(method(conn.Spec().Procedure), codeName(err))
		return err
	}
}

func (i MetricsInterceptor) countVerdicts(msg any) {
	switch m := msg.(type) {
	case *corralv1.CallResponse:
		i.M.CountVerdict(verdictName(m.GetResult().GetVerdict()))
	case *corralv1.CallBatchResponse:
		for _, r := range m.GetResults() {
			i.M.CountVerdict(verdictName(r.GetVerdict()))
		}
	}
}

// verdictName is VERDICT_TIME_LIMIT as time_limit.
func verdictName(v corralv1.Verdict) string {
	return strings.ToLower(strings.TrimPrefix(v.String(), "VERDICT_"))
}

// method is "/corral.v1.SandboxService/Create" as "SandboxService/Create".
func method(procedure string) string {
	return strings.TrimPrefix(procedure, "/corral.v1.")
}

func codeName(err error) string {
	if err == nil {
		return "ok"
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code().String()
	}
	return codeOf(err).String()
}
