package client

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// CallOptions is one stateless function call, run in a warm pooled sandbox
// that is reset afterwards. Set Args, or Language ("python", "sh") and
// Source. Zero limits take the server's defaults (10s wall, CPU = wall,
// 256 MiB, 1 MiB of output).
type CallOptions struct {
	Image    string // default busybox (sh, argv) or debian (python)
	Args     []string
	Language string
	Source   string
	Stdin    []byte
	Env      []string
	// Files are written before the call; relative paths are under /tmp,
	// the call's working directory.
	Files map[string][]byte
	// OutputFiles are read back after the call (missing ones are left out).
	OutputFiles []string
	WallTimeout time.Duration
	CPUTimeout  time.Duration
	MemoryBytes int64
	OutputLimit int64
}

// Verdict is how a call ended: "ok", "runtime_error", "time_limit",
// "memory_limit" or "output_limit".
type Verdict string

const (
	VerdictOK           Verdict = "ok"
	VerdictRuntimeError Verdict = "runtime_error"
	VerdictTimeLimit    Verdict = "time_limit"
	VerdictMemoryLimit  Verdict = "memory_limit"
	VerdictOutputLimit  Verdict = "output_limit"
)

var verdictNames = map[corralv1.Verdict]Verdict{
	corralv1.Verdict_VERDICT_OK:            VerdictOK,
	corralv1.Verdict_VERDICT_RUNTIME_ERROR: VerdictRuntimeError,
	corralv1.Verdict_VERDICT_TIME_LIMIT:    VerdictTimeLimit,
	corralv1.Verdict_VERDICT_MEMORY_LIMIT:  VerdictMemoryLimit,
	corralv1.Verdict_VERDICT_OUTPUT_LIMIT:  VerdictOutputLimit,
}

// CallResult is the outcome of a call.
type CallResult struct {
	Stdout, Stderr []byte
	ExitCode       int // -1 when killed by a signal
	Signal         int
	Verdict        Verdict
	CPUTime        time.Duration
	WallTime       time.Duration
	PeakMemory     int64
	Files          map[string][]byte
}

// Call runs one call.
func (c *Client) Call(ctx context.Context, opts CallOptions) (*CallResult, error) {
	resp, err := c.fn.Call(ctx, connect.NewRequest(callToProto(opts)))
	if err != nil {
		return nil, wrapErr(err)
	}
	return callFromProto(resp.Msg.GetResult()), nil
}

// CallBatch runs many calls in one request (concurrently on the server) and
// returns their results in order.
func (c *Client) CallBatch(ctx context.Context, calls []CallOptions) ([]*CallResult, error) {
	req := &corralv1.CallBatchRequest{Calls: make([]*corralv1.CallRequest, len(calls))}
	for i, o := range calls {
		req.Calls[i] = callToProto(o)
	}
	resp, err := c.fn.CallBatch(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrapErr(err)
	}
	return fromProtos(resp.Msg.GetResults(), callFromProto), nil
}

func callToProto(o CallOptions) *corralv1.CallRequest {
	m := &corralv1.CallRequest{
		Image: o.Image, Argv: o.Args, Language: o.Language, Source: o.Source, Stdin: o.Stdin,
		Env: o.Env, Files: o.Files, OutputFiles: o.OutputFiles,
		MemoryLimitBytes: o.MemoryBytes, OutputLimitBytes: o.OutputLimit,
	}
	if o.WallTimeout != 0 {
		m.WallTimeLimit = durationpb.New(o.WallTimeout)
	}
	if o.CPUTimeout != 0 {
		m.CpuTimeLimit = durationpb.New(o.CPUTimeout)
	}
	return m
}

func callFromProto(r *corralv1.CallResult) *CallResult {
	return &CallResult{
		Stdout: r.GetStdout(), Stderr: r.GetStderr(), ExitCode: int(r.GetExitCode()), Signal: int(r.GetSignal()),
		Verdict: verdictNames[r.GetVerdict()], CPUTime: r.GetCpuTime().AsDuration(),
		WallTime: r.GetWallTime().AsDuration(), PeakMemory: r.GetPeakMemoryBytes(), Files: r.GetFiles(),
	}
}
