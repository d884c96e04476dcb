package agent

import (
	"context"
	"fmt"
	"io"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// file serves the file operations with safefs on the guest's own root, so
// paths resolve exactly as they do for a container sandbox.
func (s *server) file(fs *agentproto.Stream, op string, f *agentproto.File) {
	if f == nil {
		replyErr(fs, errdefs.InvalidArgument("agent: %s: missing file arguments", op))
		return
	}
	ctx := context.Background()
	switch op {
	case agentproto.OpWrite:
		n, err := s.files.WriteFile(ctx, f.Path, &frameReader{fs: fs},
			backend.WriteOptions{Mode: f.Mode, Append: f.Append, MakeParents: f.Parents})
		if err != nil {
			replyErr(fs, err)
			return
		}
		reply(fs, agentproto.Reply{Op: agentproto.ReplyOK, Written: n})
	case agentproto.OpRead:
		r, err := s.files.ReadFile(ctx, f.Path, f.Offset, f.Limit)
		if err != nil {
			replyErr(fs, err)
			return
		}
		defer r.Close()
		reply(fs, agentproto.Reply{Op: agentproto.ReplyOK})
		buf := make([]byte, agentproto.ChunkSize)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if fs.Write(agentproto.KindData, buf[:n]) != nil {
					return
				}
			}
			if err == io.EOF {
				_ = fs.Write(agentproto.KindEOF, nil)
				return
			}
			if err != nil {
				replyErr(fs, err)
				return
			}
		}
	case agentproto.OpStat:
		fi, err := s.files.Stat(ctx, f.Path)
		if err != nil {
			replyErr(fs, err)
			return
		}
		info := toProto(fi)
		reply(fs, agentproto.Reply{Op: agentproto.ReplyOK, Info: &info})
	case agentproto.OpList:
		ents, err := s.files.ListDir(ctx, f.Path)
		if err != nil {
			replyErr(fs, err)
			return
		}
		r := agentproto.Reply{Op: agentproto.ReplyOK, Entries: make([]agentproto.FileInfo, len(ents))}
		for i, e := range ents {
			r.Entries[i] = toProto(e)
		}
		reply(fs, r)
	case agentproto.OpRemove:
		okOrErr(fs, s.files.Remove(ctx, f.Path, f.Recursive))
	case agentproto.OpMkdir:
		okOrErr(fs, s.files.MakeDir(ctx, f.Path, f.Mode, f.Parents))
	default:
		replyErr(fs, errdefs.InvalidArgument("agent: unknown op %q", op))
	}
}

func okOrErr(fs *agentproto.Stream, err error) {
	if err != nil {
		replyErr(fs, err)
		return
	}
	reply(fs, agentproto.Reply{Op: agentproto.ReplyOK})
}

func toProto(fi backend.FileInfo) agentproto.FileInfo {
	return agentproto.FileInfo{Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: fi.Mode,
		ModTime: fi.ModTime, UID: fi.UID, GID: fi.GID, LinkTarget: fi.LinkTarget}
}

// frameReader reads KindData frames until KindEOF.
type frameReader struct {
	fs   *agentproto.Stream
	buf  []byte
	done bool
}

func (r *frameReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.done {
			return 0, io.EOF
		}
		kind, data, err := r.fs.Read()
		if err != nil {
			return 0, fmt.Errorf("read file data: %w", err)
		}
		switch kind {
		case agentproto.KindData:
			r.buf = data
		case agentproto.KindEOF:
			r.done = true
		default:
			return 0, fmt.Errorf("unexpected frame kind %d in file data", kind)
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}
