package control

import (
	"bufio"
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

func (s *Service) UploadFile(ctx context.Context, stream *connect.ClientStream[corralv1.WriteFileRequest]) (*connect.Response[corralv1.WriteFileResponse], error) {
	m, r, err := streamData(stream, func(m *corralv1.WriteFileRequest) []byte { return m.Content })
	if err != nil {
		return nil, err
	}
	n, err := s.route(m.SandboxId)
	if err != nil {
		return nil, err
	}
	mode, err := modeFromProto("mode", m.Mode, 0o644)
	if err != nil {
		return nil, err
	}
	size, err := n.WriteFile(ctx, m.SandboxId, m.Path, r, backend.WriteOptions{
		Mode: mode, Append: m.Append, MakeParents: m.MakeParents,
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.WriteFileResponse{Size: size}), nil
}

func (s *Service) CopyIn(ctx context.Context, stream *connect.ClientStream[corralv1.CopyInRequest]) (*connect.Response[corralv1.CopyInResponse], error) {
	m, r, err := streamData(stream, func(m *corralv1.CopyInRequest) []byte { return m.Data })
	if err != nil {
		return nil, err
	}
	n, err := s.route(m.SandboxId)
	if err != nil {
		return nil, err
	}
	entries, size, err := n.CopyIn(ctx, m.SandboxId, m.Path, r)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.CopyInResponse{Entries: entries, Bytes: size}), nil
}

func (s *Service) CopyOut(ctx context.Context, req *connect.Request[corralv1.CopyOutRequest], stream *connect.ServerStream[corralv1.CopyOutResponse]) error {
	n, err := s.route(req.Msg.SandboxId)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(sendWriter(func(p []byte) error {
		return stream.Send(&corralv1.CopyOutResponse{Data: p})
	}), readChunk)
	if err := n.CopyOut(ctx, req.Msg.SandboxId, req.Msg.Path, w); err != nil {
		return err
	}
	return w.Flush()
}

// sendWriter sends each write as one stream message.
type sendWriter func(p []byte) error

func (f sendWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		chunk := p[:min(len(p), readChunk)]
		if err := f(chunk); err != nil {
			return 0, err
		}
		p = p[len(chunk):]
	}
	return n, nil
}

func (s *Service) ExecStream(ctx context.Context, stream *connect.BidiStream[corralv1.ExecStreamRequest, corralv1.ExecResponse]) error {
	first, err := stream.Receive()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return errdefs.InvalidArgument("exec: the first message must carry the command")
		}
		return err
	}
	if first.Exec == nil {
		return errdefs.InvalidArgument("exec: required in the first message")
	}
	if len(first.Exec.Stdin) > 0 {
		return errdefs.InvalidArgument("exec.stdin: must be empty in ExecStream; send stdin in the stdin field of the messages")
	}
	if first.Exec.IdempotencyKey != "" {
		return errdefs.InvalidArgument("exec.idempotency_key: not allowed on ExecStream (streamed stdin cannot be compared on a repeat); use Exec or Run")
	}
	n, err := s.route(first.Exec.SandboxId)
	if err != nil {
		return err
	}
	er, err := execFromProto(first.Exec)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	defer pr.Close() // unblocks the feeder when the command ends first
	go func() {
		_, err := pw.Write(first.Stdin)
		for err == nil {
			var m *corralv1.ExecStreamRequest
			if m, err = stream.Receive(); err == nil {
				_, err = pw.Write(m.Stdin)
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil // the client closed its side: end of stdin
		}
		pw.CloseWithError(err)
	}()
	er.StdinReader = pr
	res, err := n.Exec(ctx, first.Exec.SandboxId, er, sendOutput(stream.Send))
	if err != nil {
		return err
	}
	return stream.Send(&corralv1.ExecResponse{Event: &corralv1.ExecResponse_Result{Result: resultToProto(res)}})
}
