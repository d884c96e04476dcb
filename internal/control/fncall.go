package control

import (
	"context"
	"maps"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/fncall"
)

// FnCallService implements corral.v1.FnCallService over the fncall
// backend of the local node.
type FnCallService struct {
	svc *fncall.Service
}

var _ corralv1connect.FnCallServiceHandler = (*FnCallService)(nil)

// NewFnCallService serves svc.
func NewFnCallService(svc *fncall.Service) *FnCallService { return &FnCallService{svc: svc} }

func (s *FnCallService) Call(ctx context.Context, req *connect.Request[corralv1.CallRequest]) (*connect.Response[corralv1.CallResponse], error) {
	if req.Msg == nil {
		return nil, errdefs.InvalidArgument("request: empty")
	}
	res, err := s.svc.Call(ctx, callFromProto(req.Msg))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.CallResponse{Result: callResultToProto(res)}), nil
}

func (s *FnCallService) CallBatch(ctx context.Context, req *connect.Request[corralv1.CallBatchRequest]) (*connect.Response[corralv1.CallBatchResponse], error) {
	reqs := make([]fncall.Request, len(req.Msg.GetCalls()))
	for i, c := range req.Msg.GetCalls() {
		reqs[i] = callFromProto(c)
	}
	results, err := s.svc.CallBatch(ctx, reqs)
	if err != nil {
		return nil, err
	}
	out := &corralv1.CallBatchResponse{Results: make([]*corralv1.CallResult, len(results))}
	for i, r := range results {
		out.Results[i] = callResultToProto(r)
	}
	return connect.NewResponse(out), nil
}

func callFromProto(m *corralv1.CallRequest) fncall.Request {
	return fncall.Request{
		Image: m.GetImage(), Argv: m.GetArgv(), Language: m.GetLanguage(), Source: m.GetSource(),
		Stdin: m.GetStdin(), Env: m.GetEnv(), Files: m.GetFiles(), OutputFiles: m.GetOutputFiles(),
		WallLimit: m.GetWallTimeLimit().AsDuration(), CPULimit: m.GetCpuTimeLimit().AsDuration(),
		MemoryBytes: m.GetMemoryLimitBytes(), OutputBytes: m.GetOutputLimitBytes(),
	}
}

var verdictToProto = map[fncall.Verdict]corralv1.Verdict{
	fncall.VerdictOK:           corralv1.Verdict_VERDICT_OK,
	fncall.VerdictRuntimeError: corralv1.Verdict_VERDICT_RUNTIME_ERROR,
	fncall.VerdictTimeLimit:    corralv1.Verdict_VERDICT_TIME_LIMIT,
	fncall.VerdictMemoryLimit:  corralv1.Verdict_VERDICT_MEMORY_LIMIT,
	fncall.VerdictOutputLimit:  corralv1.Verdict_VERDICT_OUTPUT_LIMIT,
}

func callResultToProto(r *fncall.Result) *corralv1.CallResult {
	return &corralv1.CallResult{
		Stdout: r.Stdout, Stderr: r.Stderr, ExitCode: int32(r.ExitCode), Signal: int32(r.Signal),
		Verdict: verdictToProto[r.Verdict], CpuTime: durationpb.New(r.CPUTime),
		WallTime: durationpb.New(r.WallTime), PeakMemoryBytes: r.PeakMemory, Files: maps.Clone(r.Files),
	}
}
