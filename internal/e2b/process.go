package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	processpb "github.com/corral-dev/corral/internal/e2b/envdpb/process"
	"github.com/corral-dev/corral/internal/e2b/envdpb/process/processpbconnect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/node"
)

// maxKeepalive bounds the keepalive interval a client may ask for.
const maxKeepalive = 5 * time.Minute

// keepaliveTicks ticks at the Keepalive-Ping-Interval (seconds) a stream's
// client asked for in h, at most maxKeepalive apart; nil, never ticking,
// when it asked for none. stop releases the ticker.
func keepaliveTicks(h http.Header) (ticks <-chan time.Time, stop func()) {
	sec, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || sec <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(min(time.Duration(sec)*time.Second, maxKeepalive))
	return t.C, t.Stop
}

// processService implements envd's process.Process on the node's
// long-running processes.
type processService struct{ s *Server }

var _ processpbconnect.ProcessHandler = (*processService)(nil)

// userOf returns the user an envd request selects with
// "Authorization: Basic <base64 user:>" ("" = the sandbox's default).
func userOf(h http.Header) (string, error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", nil
	}
	enc, ok := strings.CutPrefix(v, "Basic ")
	if !ok {
		return "", errdefs.InvalidArgument("authorization: only Basic <user:> selects a user")
	}
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return "", errdefs.InvalidArgument("authorization: not base64: %v", err)
	}
	user, _, _ := strings.Cut(string(raw), ":")
	if user == "root" {
		return "0:0", nil // root needs no /etc/passwd lookup
	}
	return user, nil
}

// command maps a process config onto an exec. E2B's SDKs send
// `/bin/bash -l -c CMD` (and `/bin/bash -i -l` for a PTY); in an image
// without bash the script runs under the node's own shell, and other bash
// invocations under the image's /bin/sh.
func (p *processService) command(ctx context.Context, id string, cfg *processpb.ProcessConfig) (node.ExecRequest, error) {
	if cfg == nil || cfg.Cmd == "" {
		return node.ExecRequest{}, errdefs.InvalidArgument("process.cmd: required")
	}
	req := node.ExecRequest{Argv: append([]string{cfg.Cmd}, cfg.Args...)}
	if cwd := cfg.GetCwd(); cwd != "" {
		// Relative, as for files: from the sandbox's working directory.
		var err error
		if req.Cwd, err = p.s.resolve(ctx, id, cwd); err != nil {
			return node.ExecRequest{}, err
		}
	}
	for _, k := range sortedKeys(cfg.Envs) {
		req.Env = append(req.Env, k+"="+cfg.Envs[k])
	}
	if cfg.Cmd != "/bin/bash" {
		return req, nil
	}
	if _, err := p.s.cfg.Node.Stat(ctx, id, "/bin/bash"); !errdefs.IsNotFound(err) {
		return req, nil
	}
	if len(cfg.Args) == 3 && cfg.Args[0] == "-l" && cfg.Args[1] == "-c" {
		req.Argv, req.Shell = []string{cfg.Args[2]}, true
	} else {
		req.Argv[0] = "/bin/sh" // e.g. a PTY's `bash -i -l`
	}
	return req, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (p *processService) Start(ctx context.Context, req *connect.Request[processpb.StartRequest], stream *connect.ServerStream[processpb.StartResponse]) error {
	id := sandboxFrom(ctx)
	user, err := userOf(req.Header())
	if err != nil {
		return err
	}
	ex, err := p.command(ctx, id, req.Msg.Process)
	if err != nil {
		return err
	}
	ex.User = user
	pr := node.ProcessRequest{ExecRequest: ex, Tag: req.Msg.GetTag(), Stdin: req.Msg.GetStdin()}
	if pty := req.Msg.GetPty(); pty != nil {
		pr.PTY = &backend.TermSize{Cols: clampSize(pty.GetSize().GetCols()), Rows: clampSize(pty.GetSize().GetRows())}
	}
	proc, sub, err := p.s.cfg.Node.StartProcess(ctx, id, pr)
	if err != nil {
		return fmt.Errorf("start %q: %w", ex.Argv[0], err)
	}
	return follow(ctx, req.Header(), proc, sub, func(ev *processpb.ProcessEvent) error {
		return stream.Send(&processpb.StartResponse{Event: ev})
	})
}

func clampSize(v uint32) uint16 { return uint16(min(v, 4096)) }

func (p *processService) Connect(ctx context.Context, req *connect.Request[processpb.ConnectRequest], stream *connect.ServerStream[processpb.ConnectResponse]) error {
	proc, err := p.find(ctx, req.Msg.Process)
	if err != nil {
		return err
	}
	return follow(ctx, req.Header(), proc, proc.Subscribe(), func(ev *processpb.ProcessEvent) error {
		return stream.Send(&processpb.ConnectResponse{Event: ev})
	})
}

// follow streams a process's start, output and end. A stream that ends
// because its deadline passed (the SDKs' timeoutMs) kills the process, as
// envd does; a client that goes away leaves it running.
func follow(ctx context.Context, h http.Header, proc *node.Process, sub *node.Subscription, send func(*processpb.ProcessEvent) error) error {
	defer sub.Close()
	if err := send(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Start{Start: &processpb.ProcessEvent_StartEvent{Pid: uint32(proc.Pid)}}}); err != nil {
		return err
	}
	events := make(chan node.ProcessEvent)
	errc := make(chan error, 1)
	go func() {
		for {
			ev, err := sub.Next(ctx)
			if err != nil {
				errc <- err
				return
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
	}()
	keepalive, stop := keepaliveTicks(h)
	defer stop()
	for {
		select {
		case ev := <-events:
			if err := send(toEvent(ev, proc.Request.PTY != nil)); err != nil {
				return err
			}
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			if deadlinePassed(ctx, err) {
				_ = proc.Signal(int(unix.SIGKILL))
			}
			return err
		case <-keepalive:
			if err := send(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Keepalive{Keepalive: &processpb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		}
	}
}

// deadlinePassed tells a stream that hit its deadline from one the client
// left: the SDKs abort their side at the same moment, so the server may see
// the cancellation first.
func deadlinePassed(ctx context.Context, err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && time.Until(d) < 250*time.Millisecond
}

func toEvent(ev node.ProcessEvent, pty bool) *processpb.ProcessEvent {
	if end := ev.End; end != nil {
		r := end.Result
		e := &processpb.ProcessEvent_EndEvent{ExitCode: int32(r.ExitCode), Exited: r.Signal == 0 && end.Err == nil}
		switch {
		case r.Signal != 0:
			e.Status = "signal: " + unix.SignalName(unix.Signal(r.Signal))
		default:
			e.Status = "exit status " + strconv.Itoa(r.ExitCode)
		}
		if end.Err != nil {
			msg := end.Err.Error()
			e.Error = &msg
		}
		return &processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{End: e}}
	}
	d := &processpb.ProcessEvent_DataEvent{}
	switch {
	case pty:
		d.Output = &processpb.ProcessEvent_DataEvent_Pty{Pty: ev.Data}
	case ev.Stream == backend.Stderr:
		d.Output = &processpb.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}
	default:
		d.Output = &processpb.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}
	}
	return &processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: d}}
}

// find resolves a process selector in the request's sandbox.
func (p *processService) find(ctx context.Context, sel *processpb.ProcessSelector) (*node.Process, error) {
	if sel == nil {
		return nil, errdefs.InvalidArgument("process: a pid or tag selector is required")
	}
	return p.s.cfg.Node.FindProcess(ctx, sandboxFrom(ctx), int(sel.GetPid()), sel.GetTag())
}

func (p *processService) List(ctx context.Context, _ *connect.Request[processpb.ListRequest]) (*connect.Response[processpb.ListResponse], error) {
	procs, err := p.s.cfg.Node.Processes(ctx, sandboxFrom(ctx))
	if err != nil {
		return nil, err
	}
	resp := &processpb.ListResponse{}
	for _, pr := range procs {
		info := &processpb.ProcessInfo{Pid: uint32(pr.Pid), Config: processConfig(pr.Request)}
		if pr.Tag != "" {
			info.Tag = &pr.Tag
		}
		resp.Processes = append(resp.Processes, info)
	}
	return connect.NewResponse(resp), nil
}

// processConfig reports a process as it was asked for.
func processConfig(r node.ProcessRequest) *processpb.ProcessConfig {
	cfg := &processpb.ProcessConfig{Envs: map[string]string{}}
	if r.Shell {
		cfg.Cmd, cfg.Args = "/bin/bash", []string{"-l", "-c", r.Argv[0]}
	} else {
		cfg.Cmd, cfg.Args = r.Argv[0], r.Argv[1:]
	}
	for _, kv := range r.Env {
		k, v, _ := strings.Cut(kv, "=")
		cfg.Envs[k] = v
	}
	if r.Cwd != "" {
		cfg.Cwd = &r.Cwd
	}
	return cfg
}

func (p *processService) Update(ctx context.Context, req *connect.Request[processpb.UpdateRequest]) (*connect.Response[processpb.UpdateResponse], error) {
	proc, err := p.find(ctx, req.Msg.Process)
	if err != nil {
		return nil, err
	}
	if pty := req.Msg.GetPty(); pty != nil {
		size := backend.TermSize{Cols: clampSize(pty.GetSize().GetCols()), Rows: clampSize(pty.GetSize().GetRows())}
		if err := proc.Resize(size); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&processpb.UpdateResponse{}), nil
}

func input(in *processpb.ProcessInput) []byte {
	if in == nil {
		return nil
	}
	if b := in.GetPty(); b != nil {
		return b
	}
	return in.GetStdin()
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[processpb.SendInputRequest]) (*connect.Response[processpb.SendInputResponse], error) {
	return onProcess[processpb.SendInputResponse](ctx, p, req.Msg.Process, func(proc *node.Process) error {
		return proc.Write(input(req.Msg.Input))
	})
}

// onProcess runs op on the selected process and answers with an empty R.
func onProcess[R any](ctx context.Context, p *processService, sel *processpb.ProcessSelector, op func(*node.Process) error) (*connect.Response[R], error) {
	proc, err := p.find(ctx, sel)
	if err != nil {
		return nil, err
	}
	if err := op(proc); err != nil {
		return nil, err
	}
	return connect.NewResponse(new(R)), nil
}

func (p *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[processpb.StreamInputRequest]) (*connect.Response[processpb.StreamInputResponse], error) {
	var proc *node.Process
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *processpb.StreamInputRequest_Start:
			var err error
			if proc, err = p.find(ctx, ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *processpb.StreamInputRequest_Data:
			if proc == nil {
				return nil, errdefs.InvalidArgument("stream input: data before the start event")
			}
			if err := proc.Write(input(ev.Data.GetInput())); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.StreamInputResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[processpb.SendSignalRequest]) (*connect.Response[processpb.SendSignalResponse], error) {
	return onProcess[processpb.SendSignalResponse](ctx, p, req.Msg.Process, func(proc *node.Process) error {
		sig := int(req.Msg.Signal)
		if sig == 0 {
			return errdefs.InvalidArgument("signal: required (SIGTERM or SIGKILL)")
		}
		return proc.Signal(sig)
	})
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[processpb.CloseStdinRequest]) (*connect.Response[processpb.CloseStdinResponse], error) {
	return onProcess[processpb.CloseStdinResponse](ctx, p, req.Msg.Process, func(proc *node.Process) error {
		return proc.CloseStdin()
	})
}
