package agentclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/hashicorp/yamux"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// The file operations run in the guest, where the agent applies safefs to
// its own root. Errors carry no sandbox or path: the backend adds them.

func (c *Client) fileCall(ctx context.Context, op string, f agentproto.File) (agentproto.Reply, error) {
	return c.Call(ctx, agentproto.Request{Op: op, File: &f})
}

// WriteFile streams r into path and returns the bytes written.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, opts backend.WriteOptions) (int64, error) {
	st, fs, err := c.Stream(ctx, agentproto.Request{Op: agentproto.OpWrite,
		File: &agentproto.File{Path: path, Mode: opts.Mode, Append: opts.Append, Parents: opts.MakeParents}})
	if err != nil {
		return 0, err
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
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
			return 0, fmt.Errorf("read input: %w", rerr)
		}
	}
	var rep agentproto.Reply
	if err := fs.ReadJSON(agentproto.KindReply, &rep); err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, errdefs.Unavailable("corral-agent: %v", err)
	}
	if err := rep.Err(); err != nil {
		return 0, err
	}
	return rep.Written, nil
}

// ReadFile streams limit bytes (0: all) of path from offset.
func (c *Client) ReadFile(ctx context.Context, path string, offset, limit int64) (io.ReadCloser, error) {
	st, fs, _, err := c.Open(ctx, agentproto.Request{Op: agentproto.OpRead,
		File: &agentproto.File{Path: path, Offset: offset, Limit: limit}})
	if err != nil {
		return nil, err
	}
	return &reader{st: st, fs: fs}, nil
}

// reader reads KindData frames until KindEOF; an error reply midway
// becomes the read error.
type reader struct {
	st   *yamux.Stream
	fs   *agentproto.Stream
	buf  []byte
	done bool
}

func (r *reader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.done {
			return 0, io.EOF
		}
		kind, data, err := r.fs.Read()
		if err != nil {
			return 0, fmt.Errorf("read from corral-agent: %w", err)
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

func (r *reader) Close() error { return r.st.Close() }

func decodeReply(p []byte, r *agentproto.Reply) error {
	if err := json.Unmarshal(p, r); err != nil {
		return fmt.Errorf("decode corral-agent reply: %w", err)
	}
	return nil
}

// ListDir lists a directory.
func (c *Client) ListDir(ctx context.Context, path string) ([]backend.FileInfo, error) {
	r, err := c.fileCall(ctx, agentproto.OpList, agentproto.File{Path: path})
	if err != nil {
		return nil, err
	}
	out := make([]backend.FileInfo, len(r.Entries))
	for i, e := range r.Entries {
		out[i] = fromProto(e)
	}
	return out, nil
}

// Stat describes one file.
func (c *Client) Stat(ctx context.Context, path string) (backend.FileInfo, error) {
	r, err := c.fileCall(ctx, agentproto.OpStat, agentproto.File{Path: path})
	if err != nil {
		return backend.FileInfo{}, err
	}
	if r.Info == nil {
		return backend.FileInfo{}, errors.New("corral-agent sent no info")
	}
	return fromProto(*r.Info), nil
}

// Remove removes path, and its tree when recursive.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	_, err := c.fileCall(ctx, agentproto.OpRemove, agentproto.File{Path: path, Recursive: recursive})
	return err
}

// MakeDir makes a directory, and its parents when asked.
func (c *Client) MakeDir(ctx context.Context, path string, mode fs.FileMode, parents bool) error {
	_, err := c.fileCall(ctx, agentproto.OpMkdir, agentproto.File{Path: path, Mode: mode, Parents: parents})
	return err
}

func fromProto(fi agentproto.FileInfo) backend.FileInfo {
	return backend.FileInfo{Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: fi.Mode,
		ModTime: fi.ModTime, UID: fi.UID, GID: fi.GID, LinkTarget: fi.LinkTarget}
}
