package control

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/node"
)

func (s *Service) UploadFile(ctx context.Context, stream *connect.ClientStream[corralv1.WriteFileRequest]) (*connect.Response[corralv1.WriteFileResponse], error) {
	m, r, err := streamData(stream, func(m *corralv1.WriteFileRequest) []byte { return m.Content })
	if err != nil {
		return nil, err
	}
	return s.writeFile(ctx, m, r)
}

// writeFile writes r to the file m names, as WriteFile (content in m) and
// UploadFile (content streamed) do alike.
func (s *Service) writeFile(ctx context.Context, m *corralv1.WriteFileRequest, r io.Reader) (*connect.Response[corralv1.WriteFileResponse], error) {
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
	n, first, er, stdin, _, err := s.streamedExec(stream.Receive, false)
	if err != nil {
		return err
	}
	defer stdin.Close() // unblocks the feeder when the command ends first
	res, err := n.Exec(ctx, first.Exec.SandboxId, er, sendOutput(stream.Send))
	if err != nil {
		return err
	}
	return stream.Send(&corralv1.ExecResponse{Event: &corralv1.ExecResponse_Result{Result: resultToProto(res)}})
}

// RunStream is Run with stdin streamed as in ExecStream. Stdin the command
// left unread is drained before the answer, so that a client sending its
// whole body first (HTTP/1.1) never sees the stream cut under it.
func (s *Service) RunStream(ctx context.Context, in *connect.ClientStream[corralv1.ExecStreamRequest]) (*connect.Response[corralv1.RunResponse], error) {
	receive := func() (*corralv1.ExecStreamRequest, error) {
		if !in.Receive() {
			if err := in.Err(); err != nil {
				return nil, err
			}
			return nil, io.EOF
		}
		return in.Msg(), nil
	}
	n, first, er, stdin, fed, err := s.streamedExec(receive, true)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	res, err := n.Exec(ctx, first.Exec.SandboxId, er, func(st backend.Stream, p []byte) error {
		if st == backend.Stderr {
			stderr.Write(p)
		} else {
			stdout.Write(p)
		}
		return nil
	})
	stdin.Close()
	if err == nil {
		<-fed // the rest of the client's stdin, unread, drained
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.RunResponse{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), Result: resultToProto(res)}), nil
}

// streamedExec reads the first message of a streamed-stdin exec, checks
// it and routes it, and starts feeding the following messages' stdin to
// the exec request it returns. The caller closes stdin when the command
// has ended; the feeder then stops, or with drain reads the client's side
// to its end first. fed is closed when the feeder is done.
func (s *Service) streamedExec(receive func() (*corralv1.ExecStreamRequest, error), drain bool) (
	n *node.Node, first *corralv1.ExecStreamRequest, er node.ExecRequest, stdin io.Closer, fed chan struct{}, err error) {
	first, err = receive()
	if errors.Is(err, io.EOF) {
		err = errdefs.InvalidArgument("exec: the first message must carry the command")
	}
	switch {
	case err != nil:
	case first.Exec == nil:
		err = errdefs.InvalidArgument("exec: required in the first message")
	case len(first.Exec.Stdin) > 0:
		err = errdefs.InvalidArgument("exec.stdin: must be empty in a streamed exec; send stdin in the stdin field of the messages")
	case first.Exec.IdempotencyKey != "":
		err = errdefs.InvalidArgument("exec.idempotency_key: not allowed on a streamed exec (streamed stdin cannot be compared on a repeat); use Exec or Run")
	}
	if err != nil {
		return nil, nil, er, nil, nil, err
	}
	if n, err = s.route(first.Exec.SandboxId); err != nil {
		return nil, nil, er, nil, nil, err
	}
	if er, err = execFromProto(first.Exec); err != nil {
		return nil, nil, er, nil, nil, err
	}
	pr, pw := io.Pipe()
	fed = make(chan struct{})
	go func() {
		defer close(fed)
		_, err := pw.Write(first.Stdin)
		for err == nil {
			var m *corralv1.ExecStreamRequest
			if m, err = receive(); err == nil {
				_, err = pw.Write(m.Stdin)
			}
		}
		for drain && errors.Is(err, io.ErrClosedPipe) { // the command ended first
			_, err = receive()
			if err == nil {
				err = io.ErrClosedPipe
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil // the client closed its side: end of stdin
		}
		pw.CloseWithError(err)
	}()
	er.StdinReader = pr
	return n, first, er, pr, fed, nil
}
