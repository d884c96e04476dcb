package microvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

var _ backend.Trees = (*sandbox)(nil)

// treeStream opens a stream for a tree op and sends its request; nothing
// is read back yet (the replies come after or among the data).
func (s *sandbox) treeStream(ctx context.Context, op, path string) (*yamux.Stream, *agentproto.Stream, error) {
	if err := s.live(); err != nil {
		return nil, nil, err
	}
	sess, err := s.session(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, err := sess.OpenStream()
	if err != nil {
		return nil, nil, errdefs.Unavailable("sandbox %s: agent stream: %v", s.m.id, err)
	}
	fs := agentproto.NewStream(st)
	req := agentproto.Request{Version: agentproto.MinVersion(op), Secret: s.m.Secret, Op: op,
		File: &agentproto.File{Path: path}}
	if err := fs.WriteJSON(agentproto.KindRequest, req); err != nil {
		st.Close()
		return nil, nil, errdefs.Unavailable("sandbox %s: %s %s: %v", s.m.id, op, path, err)
	}
	return st, fs, nil
}

// CopyIn implements backend.Trees: the tar stream goes to the agent in
// KindData frames, and the agent extracts it with the same safefs code a
// container sandbox uses. The reply is read while sending, so a refusal
// midway (a bad entry, a full disk) stops the upload at once.
func (s *sandbox) CopyIn(ctx context.Context, dir string, r io.Reader) (entries, bytes int64, err error) {
	st, fs, err := s.treeStream(ctx, agentproto.OpExtract, dir)
	if err != nil {
		return 0, 0, fmt.Errorf("sandbox %s: copy into %s: %w", s.m.id, dir, err)
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()); st.Close() })
	defer stop()
	sent := make(chan error, 1)
	go func() {
		err := sendFrames(fs, r)
		if err != nil {
			st.Close() // the agent's extract ends on the cut stream and replies
		}
		sent <- err
	}()
	var rep agentproto.Reply
	rerr := fs.ReadJSON(agentproto.KindReply, &rep)
	st.Close() // unblocks a sender the agent no longer reads from
	serr := <-sent
	var in inputError
	switch {
	case ctx.Err() != nil:
		return 0, 0, ctx.Err()
	case errors.As(serr, &in):
		return 0, 0, fmt.Errorf("sandbox %s: copy into %s: %w", s.m.id, dir, in.err)
	case rerr != nil:
		return 0, 0, errdefs.Unavailable("sandbox %s: copy into %s: agent: %v", s.m.id, dir, rerr)
	}
	if err := rep.Err(); err != nil {
		return rep.Count, rep.Written, fmt.Errorf("sandbox %s: copy into %s: %w", s.m.id, dir, err)
	}
	return rep.Count, rep.Written, nil
}

// inputError is a failure reading the caller's tar stream (not the
// agent's doing).
type inputError struct{ err error }

func (e inputError) Error() string { return e.err.Error() }

// sendFrames sends r as KindData frames and then KindEOF. An error
// reading r is an inputError; a write error means the agent stopped
// reading (its reply says why).
func sendFrames(fs *agentproto.Stream, r io.Reader) error {
	buf := make([]byte, agentproto.ChunkSize)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := fs.Write(agentproto.KindData, buf[:n]); err != nil {
				return err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return fs.Write(agentproto.KindEOF, nil)
		}
		if rerr != nil {
			return inputError{fmt.Errorf("read tar stream: %w", rerr)}
		}
	}
}

// CopyOut implements backend.Trees: the agent archives path with safefs
// and streams the tar back; an error reply before or among the data is
// the error.
func (s *sandbox) CopyOut(ctx context.Context, path string, w io.Writer) error {
	st, fs, err := s.treeStream(ctx, agentproto.OpArchive, path)
	if err != nil {
		return fmt.Errorf("sandbox %s: copy out %s: %w", s.m.id, path, err)
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()); st.Close() })
	defer stop()
	_, err = io.Copy(w, &fileReader{st: st, fs: fs})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("sandbox %s: copy out %s: %w", s.m.id, path, err)
	}
	return nil
}
