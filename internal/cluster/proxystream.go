package cluster

import (
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
)

// forwardClientStream relays a client stream whose first message names the
// sandbox to the node that owns it, message by message (nothing is
// buffered beyond one message), and returns the node's answer.
func forwardClientStream[Req, Resp any](p *Proxy, ctx context.Context, in *connect.ClientStream[Req], sandbox func(*Req) string,
	open func(corralv1connect.SandboxServiceClient, context.Context) *connect.ClientStreamForClient[Req, Resp]) (*connect.Response[Resp], error) {
	if !in.Receive() {
		if err := in.Err(); err != nil {
			return nil, err
		}
		return nil, errdefs.InvalidArgument("stream: no first message naming the sandbox")
	}
	first := in.Msg()
	v, c, err := p.nodeFor(sandbox(first))
	if err != nil {
		return nil, err
	}
	out := open(c, ctx)
	for msg := first; ; {
		if err := out.Send(msg); err != nil && !errors.Is(err, io.EOF) {
			return nil, unreachable(v, err)
		} else if err != nil {
			break // the node answered early: CloseAndReceive has its answer
		}
		if !in.Receive() {
			if err := in.Err(); err != nil {
				return nil, err
			}
			break
		}
		msg = in.Msg()
	}
	resp, err := out.CloseAndReceive()
	return resp, unreachable(v, err)
}

func (p *Proxy) UploadFile(ctx context.Context, in *connect.ClientStream[corralv1.WriteFileRequest]) (*connect.Response[corralv1.WriteFileResponse], error) {
	return forwardClientStream(p, ctx, in, (*corralv1.WriteFileRequest).GetSandboxId, corralv1connect.SandboxServiceClient.UploadFile)
}

func (p *Proxy) CopyIn(ctx context.Context, in *connect.ClientStream[corralv1.CopyInRequest]) (*connect.Response[corralv1.CopyInResponse], error) {
	return forwardClientStream(p, ctx, in, (*corralv1.CopyInRequest).GetSandboxId, corralv1connect.SandboxServiceClient.CopyIn)
}

func (p *Proxy) CopyOut(ctx context.Context, req *connect.Request[corralv1.CopyOutRequest], stream *connect.ServerStream[corralv1.CopyOutResponse]) error {
	return serverStream(p, ctx, req.Msg.SandboxId, req, stream, corralv1connect.SandboxServiceClient.CopyOut)
}

// RunStream is client-streaming, which the node connections carry.
func (p *Proxy) RunStream(ctx context.Context, in *connect.ClientStream[corralv1.ExecStreamRequest]) (*connect.Response[corralv1.RunResponse], error) {
	return forwardClientStream(p, ctx, in, func(m *corralv1.ExecStreamRequest) string { return m.GetExec().GetSandboxId() },
		corralv1connect.SandboxServiceClient.RunStream)
}

// ExecStream relays a bidirectional exec (streamed stdin) to the sandbox's
// node over the control plane's HTTP/2 node connections: stdin messages
// go up as they arrive, output comes back as the node sends it.
func (p *Proxy) ExecStream(ctx context.Context, in *connect.BidiStream[corralv1.ExecStreamRequest, corralv1.ExecResponse]) error {
	first, err := in.Receive()
	if errors.Is(err, io.EOF) {
		return errdefs.InvalidArgument("exec stream: no first message naming the sandbox")
	}
	if err != nil {
		return err
	}
	v, c, err := p.nodeFor(first.GetExec().GetSandboxId())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the node's stream, and so the stdin relay, on any return
	out := c.ExecStream(ctx)
	if err := out.Send(first); err != nil && !errors.Is(err, io.EOF) {
		return unreachable(v, err)
	}
	up := make(chan error, 1)
	go func() {
		for {
			msg, err := in.Receive()
			if errors.Is(err, io.EOF) {
				up <- out.CloseRequest()
				return
			}
			if err != nil {
				up <- err
				cancel()
				return
			}
			if err := out.Send(msg); err != nil {
				// io.EOF: the node ended the stream; its answer
				// comes through Receive below.
				up <- nil
				return
			}
		}
	}()
	for {
		msg, err := out.Receive()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return unreachable(v, err)
		}
		if err := in.Send(msg); err != nil {
			return err
		}
	}
	if err := out.CloseResponse(); err != nil {
		return unreachable(v, err)
	}
	select {
	case err := <-up:
		if err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
			return err
		}
	default: // the command finished before its stdin did
	}
	return nil
}
