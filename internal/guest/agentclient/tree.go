package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// CopyIn sends the tar stream r to the agent in KindData frames, and the
// agent extracts it under dir with safefs. The reply is read while
// sending, so a refusal midway (a bad entry, a full disk) stops the upload
// at once.
func (c *Client) CopyIn(ctx context.Context, dir string, r io.Reader) (entries, bytes int64, err error) {
	req := agentproto.Request{Op: agentproto.OpExtract, File: &agentproto.File{Path: dir}}
	st, fs, err := c.Stream(ctx, req)
	if err != nil {
		return 0, 0, err
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
		return 0, 0, in.err
	case rerr != nil:
		return 0, 0, errdefs.Unavailable("corral-agent: %v", rerr)
	}
	if err := replyErr(&req, rep); err != nil {
		return rep.Count, rep.Written, err
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

// CopyOut has the agent archive path with safefs and streams the tar to
// w; an error reply before or among the data is the error.
func (c *Client) CopyOut(ctx context.Context, path string, w io.Writer) error {
	st, fs, err := c.Stream(ctx, agentproto.Request{Op: agentproto.OpArchive, File: &agentproto.File{Path: path}})
	if err != nil {
		return err
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()); st.Close() })
	defer stop()
	if _, err := io.Copy(w, &reader{st: st, fs: fs}); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	return nil
}
