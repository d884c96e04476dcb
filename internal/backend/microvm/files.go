package microvm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"

	"github.com/hashicorp/yamux"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// The file operations run in the guest: the agent applies safefs to its
// own root, so paths resolve exactly as for a container sandbox.

func decodeReply(p []byte, r *agentproto.Reply) error {
	if err := json.Unmarshal(p, r); err != nil {
		return fmt.Errorf("decode agent reply: %w", err)
	}
	return nil
}

func (s *sandbox) fileCall(ctx context.Context, op string, f agentproto.File) (agentproto.Reply, error) {
	if err := s.live(); err != nil {
		return agentproto.Reply{}, err
	}
	r, err := s.call(ctx, agentproto.Request{Op: op, File: &f})
	if err != nil {
		return r, fmt.Errorf("sandbox %s: %s %s: %w", s.m.id, op, f.Path, err)
	}
	return r, nil
}

func (s *sandbox) WriteFile(ctx context.Context, path string, r io.Reader, opts backend.WriteOptions) (int64, error) {
	if err := s.live(); err != nil {
		return 0, err
	}
	sess, err := s.session(ctx)
	if err != nil {
		return 0, err
	}
	st, err := sess.OpenStream()
	if err != nil {
		return 0, errdefs.Unavailable("sandbox %s: agent stream: %v", s.m.id, err)
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	fs := agentproto.NewStream(st)
	req := agentproto.Request{Version: agentproto.MinVersion(agentproto.OpWrite), Secret: s.m.Secret, Op: agentproto.OpWrite,
		File: &agentproto.File{Path: path, Mode: opts.Mode, Append: opts.Append, Parents: opts.MakeParents}}
	if err := fs.WriteJSON(agentproto.KindRequest, req); err != nil {
		return 0, errdefs.Unavailable("sandbox %s: write %s: %v", s.m.id, path, err)
	}
	// The agent replies early only to refuse; its reply is read after the
	// data, so a refusal mid-stream surfaces as the reply's error.
	buf := make([]byte, agentproto.ChunkSize)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := fs.Write(agentproto.KindData, buf[:n]); err != nil {
				break
			}
		}
		if rerr == io.EOF {
			_ = fs.Write(agentproto.KindEOF, nil)
			break
		}
		if rerr != nil {
			return 0, fmt.Errorf("sandbox %s: write %s: read input: %w", s.m.id, path, rerr)
		}
	}
	var rep agentproto.Reply
	if err := fs.ReadJSON(agentproto.KindReply, &rep); err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, errdefs.Unavailable("sandbox %s: write %s: %v", s.m.id, path, err)
	}
	if err := rep.Err(); err != nil {
		return 0, fmt.Errorf("sandbox %s: write %s: %w", s.m.id, path, err)
	}
	return rep.Written, nil
}

func (s *sandbox) ReadFile(ctx context.Context, path string, offset, limit int64) (io.ReadCloser, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	st, fs, _, err := s.open(ctx, agentproto.Request{Op: agentproto.OpRead,
		File: &agentproto.File{Path: path, Offset: offset, Limit: limit}})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: read %s: %w", s.m.id, path, err)
	}
	return &fileReader{st: st, fs: fs}, nil
}

// fileReader reads KindData frames until KindEOF; an error reply midway
// becomes the read error.
type fileReader struct {
	st   *yamux.Stream
	fs   *agentproto.Stream
	buf  []byte
	done bool
}

func (r *fileReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.done {
			return 0, io.EOF
		}
		kind, data, err := r.fs.Read()
		if err != nil {
			return 0, fmt.Errorf("read from agent: %w", err)
		}
		switch kind {
		case agentproto.KindData:
			r.buf = data
		case agentproto.KindEOF:
			r.done = true
		case agentproto.KindReply:
			var rep agentproto.Reply
			if err := decodeReply(data, &rep); err != nil {
				return 0, err
			}
			if err := rep.Err(); err != nil {
				return 0, err
			}
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *fileReader) Close() error { return r.st.Close() }

func (s *sandbox) ListDir(ctx context.Context, path string) ([]backend.FileInfo, error) {
	r, err := s.fileCall(ctx, agentproto.OpList, agentproto.File{Path: path})
	if err != nil {
		return nil, err
	}
	out := make([]backend.FileInfo, len(r.Entries))
	for i, e := range r.Entries {
		out[i] = fromProto(e)
	}
	return out, nil
}

func (s *sandbox) Stat(ctx context.Context, path string) (backend.FileInfo, error) {
	r, err := s.fileCall(ctx, agentproto.OpStat, agentproto.File{Path: path})
	if err != nil {
		return backend.FileInfo{}, err
	}
	if r.Info == nil {
		return backend.FileInfo{}, fmt.Errorf("sandbox %s: stat %s: agent sent no info", s.m.id, path)
	}
	return fromProto(*r.Info), nil
}

func (s *sandbox) Remove(ctx context.Context, path string, recursive bool) error {
	_, err := s.fileCall(ctx, agentproto.OpRemove, agentproto.File{Path: path, Recursive: recursive})
	return err
}

func (s *sandbox) MakeDir(ctx context.Context, path string, mode fs.FileMode, parents bool) error {
	_, err := s.fileCall(ctx, agentproto.OpMkdir, agentproto.File{Path: path, Mode: mode, Parents: parents})
	return err
}

func fromProto(fi agentproto.FileInfo) backend.FileInfo {
	return backend.FileInfo{Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: fi.Mode,
		ModTime: fi.ModTime, UID: fi.UID, GID: fi.GID, LinkTarget: fi.LinkTarget}
}
