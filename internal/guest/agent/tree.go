package agent

import (
	"context"
	"io"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
	"github.com/corral-dev/corral/internal/safefs"
)

// tree serves extract and archive with safefs's tar code on the guest's
// root: the same checks as a container sandbox's tree copy (no entry
// outside the root, no symlink followed out of it, the same refusals and
// error texts). The guest's ids are the sandbox's own, so owners pass
// through unchanged; only user.* xattrs are copied (safefs's default).
func (s *server) tree(fs *agentproto.Stream, op string, f *agentproto.File) {
	if f == nil {
		replyErr(fs, errdefs.InvalidArgument("agent: %s: missing file arguments", op))
		return
	}
	ctx := context.Background()
	if op == agentproto.OpArchive {
		// Errors found before the first byte (no such path) still come
		// as the only reply: the node reads frames until a reply or EOF.
		w := &frameWriter{fs: fs}
		if err := s.files.Archive(ctx, f.Path, w, safefs.TarOptions{}); err != nil {
			replyErr(fs, err)
			return
		}
		if w.flush() == nil {
			_ = fs.Write(agentproto.KindEOF, nil)
		}
		return
	}
	in := &frameReader{fs: fs}
	entries, n, err := s.files.Extract(ctx, f.Path, in, safefs.TarOptions{})
	if err != nil {
		// The node reads the reply while it sends, and stops sending.
		replyErr(fs, err)
		return
	}
	// The tar's trailing padding, up to the node's KindEOF.
	if _, err := io.Copy(io.Discard, in); err != nil {
		replyErr(fs, err)
		return
	}
	reply(fs, agentproto.Reply{Op: agentproto.ReplyOK, Count: entries, Written: n})
}

// frameWriter sends what it is given as KindData frames of ChunkSize
// (tar writes in 512-byte blocks; one frame each would cost a yamux
// header and a lock per block).
type frameWriter struct {
	fs  *agentproto.Stream
	buf []byte
}

func (w *frameWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if w.buf == nil {
			w.buf = make([]byte, 0, agentproto.ChunkSize)
		}
		k := min(len(p), cap(w.buf)-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == cap(w.buf) {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (w *frameWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.fs.Write(agentproto.KindData, w.buf)
	w.buf = w.buf[:0]
	return err
}
