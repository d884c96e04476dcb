package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// uploadChunk is the data carried by each message of a streamed upload.
const uploadChunk = 1 << 20

// clientStream is the part of a Connect client stream an upload uses.
type clientStream[Req, Res any] interface {
	Send(*Req) error
	CloseAndReceive() (*connect.Response[Res], error)
}

// upload opens a client stream, sends first, then r in chunks (data is a
// message's bytes field: first's, then fresh messages'), and returns the server's
// answer. A server that stops reading early (an error) is heard through
// CloseAndReceive; a failing r cancels the call, so that the server never
// takes a cut stream for a whole one.
func upload[Req, Res any](ctx context.Context, open func(context.Context) clientStream[Req, Res], first *Req, r io.Reader, data func(*Req) *[]byte) (*Res, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := open(ctx)
	buf := make([]byte, uploadChunk)
	msg := first
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 || msg == first {
			if msg == nil {
				msg = new(Req)
			}
			*data(msg) = buf[:n]
			if serr := stream.Send(msg); serr != nil {
				break // the answer says why
			}
			msg = nil
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			cancel()
			_, _ = stream.CloseAndReceive()
			return nil, rerr
		}
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, wrapErr(err)
	}
	return resp.Msg, nil
}

// tarOf returns a tar stream of the local directory dir, made as it is read.
func tarOf(ctx context.Context, dir string) (io.ReadCloser, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dir)
	}
	pr, pw := io.Pipe()
	go func() {
		// Buffered: the tar writer's many small writes (headers, padding,
		// small files) would each be a handoff through the pipe.
		bw := bufio.NewWriterSize(pw, uploadChunk)
		err := writeTar(ctx, dir, bw)
		if err == nil {
			err = bw.Flush()
		}
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// CopyStats says what a tree copy into a sandbox wrote.
type CopyStats struct {
	Entries int64 // files, directories, links
	Bytes   int64 // file content
}

// UploadDir copies the tree of the local directory local into the sandbox
// directory dest (created when missing; dest takes local's mode, owner and
// mtime): files, directories, symlinks, hard links, modes, owners, mtimes
// and user.* xattrs. Nothing resolves outside the sandbox.
func (f *Files) UploadDir(ctx context.Context, local, dest string) (CopyStats, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r, err := tarOf(ctx, local)
	if err != nil {
		return CopyStats{}, err
	}
	defer r.Close()
	return f.UploadTar(ctx, dest, r)
}

// UploadTar extracts a tar stream into the sandbox directory dest
// (created when missing).
func (f *Files) UploadTar(ctx context.Context, dest string, r io.Reader) (CopyStats, error) {
	resp, err := upload(ctx, func(ctx context.Context) clientStream[corralv1.CopyInRequest, corralv1.CopyInResponse] {
		return f.s.c.svc.CopyIn(ctx)
	}, &corralv1.CopyInRequest{SandboxId: f.s.id, Path: dest}, r,
		func(m *corralv1.CopyInRequest) *[]byte { return &m.Data })
	if err != nil {
		return CopyStats{}, err
	}
	return CopyStats{Entries: resp.Entries, Bytes: resp.Bytes}, nil
}

// DownloadTar streams a tar of path in the sandbox to w: path's last
// element first, then a directory's whole tree.
func (f *Files) DownloadTar(ctx context.Context, path string, w io.Writer) error {
	stream, err := f.s.c.bulk.CopyOut(ctx, connect.NewRequest(&corralv1.CopyOutRequest{SandboxId: f.s.id, Path: path}))
	if err != nil {
		return wrapErr(err)
	}
	defer stream.Close()
	for stream.Receive() {
		if _, err := w.Write(stream.Msg().Data); err != nil {
			return err
		}
	}
	return wrapErr(stream.Err())
}

// DownloadDir makes the local directory local (created when missing) a
// copy of the sandbox directory path. The copy never writes outside local,
// whatever the sandbox's tree holds; owners are kept when this process is
// root.
func (f *Files) DownloadDir(ctx context.Context, path, local string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := extractTar(ctx, pr, local, 1)
		pr.CloseWithError(err)
		done <- err
	}()
	err := f.DownloadTar(ctx, path, pw)
	pw.CloseWithError(err)
	if xerr := <-done; err == nil {
		err = xerr
	}
	return err
}

// WriteFrom streams r into path in one call (mode 0 means 0644), creating
// missing parent directories, and returns the bytes written. Nothing but
// the sandbox's disk quota caps the size.
func (f *Files) WriteFrom(ctx context.Context, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	resp, err := upload(ctx, func(ctx context.Context) clientStream[corralv1.WriteFileRequest, corralv1.WriteFileResponse] {
		return f.s.c.svc.UploadFile(ctx)
	}, &corralv1.WriteFileRequest{
		SandboxId: f.s.id, Path: path, Mode: uint32(mode.Perm()), MakeParents: true,
	}, r, func(m *corralv1.WriteFileRequest) *[]byte { return &m.Content })
	if err != nil {
		return 0, err
	}
	return resp.Size, nil
}

// execStream runs cmd with cmd.StdinReader streamed as its stdin (a
// bidirectional stream, over HTTP/2); collect keeps the output that has
// no writer in the result, as Run does.
func (s *Sandbox) execStream(ctx context.Context, cmd Command, collect bool) (*Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := cmd.request(s)
	req.Stdin = nil
	stream := s.c.h2.ExecStream(ctx)
	if err := stream.Send(&corralv1.ExecStreamRequest{Exec: req}); err != nil && !errors.Is(err, io.EOF) {
		return nil, wrapErr(err)
	}
	sendErr := make(chan error, 1)
	go func() {
		buf := make([]byte, uploadChunk)
		var err error
		for err == nil {
			var n int
			n, err = cmd.StdinReader.Read(buf)
			if n > 0 {
				if serr := stream.Send(&corralv1.ExecStreamRequest{Stdin: bytes.Clone(buf[:n])}); serr != nil {
					err = nil // the command ended or the call failed: Receive says which
					break
				}
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		_ = stream.CloseRequest()
		sendErr <- err
	}()
	var res *Result
	var stdout, stderr bytes.Buffer
	outW, errW := cmd.Stdout, cmd.Stderr
	if collect {
		outW, errW = &stdout, &stderr
	}
	for {
		msg, err := stream.Receive()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, wrapErr(err)
		}
		switch ev := msg.Event.(type) {
		case *corralv1.ExecResponse_Stdout:
			err = write(outW, ev.Stdout)
		case *corralv1.ExecResponse_Stderr:
			err = write(errW, ev.Stderr)
		case *corralv1.ExecResponse_Result:
			res = resultFromProto(ev.Result)
		}
		if err != nil {
			return nil, err
		}
	}
	_ = stream.CloseResponse()
	if res == nil {
		return nil, &Error{Code: CodeInternal, Message: "exec stream ended without a result"}
	}
	select {
	case err := <-sendErr:
		if err != nil {
			return nil, fmt.Errorf("read stdin: %w", err)
		}
	default: // the command finished without reading all of stdin
	}
	res.Stdout, res.Stderr = stdout.Bytes(), stderr.Bytes()
	return res, nil
}
