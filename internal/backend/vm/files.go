package vm

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// fileChunk is the size of one guest-file-read or -write (base64 in one
// JSON message each way).
const fileChunk = 1 << 20

// Contents move through guest-file-open/read/write/close, which any
// qemu-ga speaks; listing, stat, remove and mkdir have no guest agent
// command and run as small shell commands (Linux guests). The whole guest
// is the sandbox, so every guest path is the sandbox's.

func checkPath(field, p string) error {
	if !path.IsAbs(p) || strings.ContainsRune(p, 0) {
		return errdefs.InvalidArgument("%s: %q must be an absolute path", field, p)
	}
	return nil
}

func (s *sandbox) openFile(ctx context.Context, p, mode string) (int64, error) {
	var h int64
	if err := s.qga.call(ctx, "guest-file-open", map[string]any{"path": p, "mode": mode}, &h); err != nil {
		if qe, ok := err.(*qgaError); ok {
			return 0, fileError(qe.Desc)
		}
		return 0, err
	}
	return h, nil
}

func (s *sandbox) closeFile(h int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.qga.call(ctx, "guest-file-close", map[string]any{"handle": h}, nil)
}

// WriteFile implements backend.Files.
func (s *sandbox) WriteFile(ctx context.Context, p string, r io.Reader, opts backend.WriteOptions) (int64, error) {
	if err := s.Serving(); err != nil {
		return 0, err
	}
	if s.agent != nil {
		return s.agentWriteFile(ctx, p, r, opts)
	}
	if err := checkPath("path", p); err != nil {
		return 0, err
	}
	if s.m.Linux {
		// A new file gets opts.Mode (qemu-ga would create it 0666 &^ umask);
		// an existing one keeps its own.
		mode := opts.Mode.Perm()
		if mode == 0 {
			mode = 0o644
		}
		parents := "0"
		if opts.MakeParents {
			parents = "1"
		}
		if _, err := s.sh(ctx, `[ "$3" = 1 ] && mkdir -p -- "$(dirname -- "$1")"; [ -e "$1" ] || { : > "$1" && chmod "$2" -- "$1"; }`,
			p, strconv.FormatUint(uint64(mode), 8), parents); err != nil {
			return 0, fmt.Errorf("sandbox %s: write %s: %w", s.m.id, p, err)
		}
	}
	mode := "w"
	if opts.Append {
		mode = "a"
	}
	h, err := s.openFile(ctx, p, mode)
	if err != nil {
		return 0, fmt.Errorf("sandbox %s: write %s: %w", s.m.id, p, err)
	}
	defer s.closeFile(h)
	var n int64
	buf := make([]byte, fileChunk)
	for {
		k, rerr := io.ReadFull(r, buf)
		if k > 0 {
			var w struct {
				Count int `json:"count"`
			}
			if err := s.qga.call(ctx, "guest-file-write", map[string]any{"handle": h, "buf-b64": base64.StdEncoding.EncodeToString(buf[:k])}, &w); err != nil {
				if qe, ok := err.(*qgaError); ok {
					err = fileError(qe.Desc)
				}
				return n, fmt.Errorf("sandbox %s: write %s: %w", s.m.id, p, err)
			}
			n += int64(w.Count)
			if w.Count != k {
				return n, errdefs.ResourceExhausted("sandbox %s: write %s: short write (%d of %d bytes): disk full?", s.m.id, p, w.Count, k)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return n, nil
		}
		if rerr != nil {
			return n, fmt.Errorf("sandbox %s: write %s: read input: %w", s.m.id, p, rerr)
		}
	}
}

// ReadFile implements backend.Files: the reader pulls chunks from the
// guest as it is read.
func (s *sandbox) ReadFile(ctx context.Context, p string, offset, limit int64) (io.ReadCloser, error) {
	if err := s.Serving(); err != nil {
		return nil, err
	}
	if s.agent != nil {
		return s.agentReadFile(ctx, p, offset, limit)
	}
	if err := checkPath("path", p); err != nil {
		return nil, err
	}
	if offset < 0 || limit < 0 {
		return nil, errdefs.InvalidArgument("offset, limit: must not be negative")
	}
	if s.m.Linux {
		// guest-file-open of a directory succeeds and reads fail later.
		if fi, err := s.Stat(ctx, p); err != nil {
			return nil, err
		} else if fi.Mode.IsDir() {
			return nil, errdefs.FailedPrecondition("sandbox %s: read %s: is a directory", s.m.id, p)
		}
	}
	h, err := s.openFile(ctx, p, "r")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: read %s: %w", s.m.id, p, err)
	}
	if offset > 0 {
		if err := s.qga.call(ctx, "guest-file-seek", map[string]any{"handle": h, "offset": offset, "whence": "set"}, nil); err != nil {
			s.closeFile(h)
			return nil, fmt.Errorf("sandbox %s: read %s: seek: %w", s.m.id, p, err)
		}
	}
	return &guestReader{s: s, ctx: ctx, h: h, left: limit, unlimited: limit == 0, path: p}, nil
}

type guestReader struct {
	s         *sandbox
	ctx       context.Context
	h         int64
	path      string
	buf       []byte
	eof       bool
	left      int64
	unlimited bool
	closed    bool
}

func (g *guestReader) Read(p []byte) (int, error) {
	for len(g.buf) == 0 {
		if g.eof || (!g.unlimited && g.left <= 0) {
			return 0, io.EOF
		}
		count := int64(fileChunk)
		if !g.unlimited {
			count = min(count, g.left)
		}
		var r struct {
			Count  int    `json:"count"`
			BufB64 string `json:"buf-b64"`
			EOF    bool   `json:"eof"`
		}
		if err := g.s.qga.call(g.ctx, "guest-file-read", map[string]any{"handle": g.h, "count": count}, &r); err != nil {
			return 0, fmt.Errorf("sandbox %s: read %s: %w", g.s.m.id, g.path, err)
		}
		b, err := base64.StdEncoding.DecodeString(r.BufB64)
		if err != nil {
			return 0, fmt.Errorf("sandbox %s: read %s: %w", g.s.m.id, g.path, err)
		}
		g.buf, g.eof = b, r.EOF || r.Count == 0
		g.left -= int64(len(b))
	}
	n := copy(p, g.buf)
	g.buf = g.buf[n:]
	return n, nil
}

func (g *guestReader) Close() error {
	if !g.closed {
		g.closed = true
		g.s.closeFile(g.h)
	}
	return nil
}

// statFormat is find's -printf of one entry: NUL-separated fields, one
// record per line-free NUL-terminated group of eight.
const statFormat = `%f\0%s\0%m\0%y\0%T@\0%U\0%G\0%l\0`

func (s *sandbox) find(ctx context.Context, p string, depth string) ([]backend.FileInfo, error) {
	out, err := s.sh(ctx, `exec find "$1" -mindepth "$2" -maxdepth "$2" -printf "$3"`, p, depth, statFormat)
	if err != nil {
		return nil, err
	}
	f := bytes.Split(out, []byte{0})
	var infos []backend.FileInfo
	for i := 0; i+8 <= len(f); i += 8 {
		size, _ := strconv.ParseInt(string(f[i+1]), 10, 64)
		perm, _ := strconv.ParseUint(string(f[i+2]), 8, 32)
		mtime, _ := strconv.ParseFloat(string(f[i+4]), 64)
		uid, _ := strconv.ParseUint(string(f[i+5]), 10, 32)
		gid, _ := strconv.ParseUint(string(f[i+6]), 10, 32)
		mode := fs.FileMode(perm)
		switch f[i+3][0] {
		case 'd':
			mode |= fs.ModeDir
		case 'l':
			mode |= fs.ModeSymlink
		case 'p':
			mode |= fs.ModeNamedPipe
		case 's':
			mode |= fs.ModeSocket
		case 'c':
			mode |= fs.ModeDevice | fs.ModeCharDevice
		case 'b':
			mode |= fs.ModeDevice
		}
		name := string(f[i])
		full := p
		if depth == "1" {
			full = path.Join(p, name)
		}
		sec, frac := int64(mtime), mtime-float64(int64(mtime))
		infos = append(infos, backend.FileInfo{Name: name, Path: full, Size: size, Mode: mode,
			ModTime: time.Unix(sec, int64(frac*1e9)), UID: uint32(uid), GID: uint32(gid), LinkTarget: string(f[i+7])})
	}
	return infos, nil
}

// ListDir implements backend.Files.
func (s *sandbox) ListDir(ctx context.Context, p string) ([]backend.FileInfo, error) {
	if err := s.Serving(); err != nil {
		return nil, err
	}
	if s.agent != nil {
		return s.agentListDir(ctx, p)
	}
	if err := checkPath("path", p); err != nil {
		return nil, err
	}
	fi, err := s.Stat(ctx, p)
	if err != nil {
		return nil, err
	}
	if !fi.Mode.IsDir() {
		return nil, errdefs.FailedPrecondition("sandbox %s: list %s: not a directory", s.m.id, p)
	}
	infos, err := s.find(ctx, p, "1")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: list %s: %w", s.m.id, p, err)
	}
	// find lists in directory order; the other backends sort by name.
	slices.SortFunc(infos, func(a, b backend.FileInfo) int { return strings.Compare(a.Name, b.Name) })
	return infos, nil
}

// Stat implements backend.Files.
func (s *sandbox) Stat(ctx context.Context, p string) (backend.FileInfo, error) {
	if err := s.Serving(); err != nil {
		return backend.FileInfo{}, err
	}
	if s.agent != nil {
		return s.agentStat(ctx, p)
	}
	if err := checkPath("path", p); err != nil {
		return backend.FileInfo{}, err
	}
	infos, err := s.find(ctx, p, "0")
	if err != nil {
		return backend.FileInfo{}, fmt.Errorf("sandbox %s: stat %s: %w", s.m.id, p, err)
	}
	if len(infos) != 1 {
		return backend.FileInfo{}, errdefs.NotFound("sandbox %s: stat %s: no such file", s.m.id, p)
	}
	infos[0].Name = path.Base(p)
	return infos[0], nil
}

// Remove implements backend.Files.
func (s *sandbox) Remove(ctx context.Context, p string, recursive bool) error {
	if err := s.Serving(); err != nil {
		return err
	}
	if s.agent != nil {
		return s.agentRemove(ctx, p, recursive)
	}
	if err := checkPath("path", p); err != nil {
		return err
	}
	if path.Clean(p) == "/" {
		return errdefs.InvalidArgument("path: refusing to remove /")
	}
	script := `[ -e "$1" ] || [ -L "$1" ] || { echo "$1: No such file or directory" >&2; exit 1; }; if [ -d "$1" ] && [ ! -L "$1" ]; then rmdir -- "$1"; else rm -f -- "$1"; fi`
	if recursive {
		script = `[ -e "$1" ] || [ -L "$1" ] || { echo "$1: No such file or directory" >&2; exit 1; }; rm -rf -- "$1"`
	}
	if _, err := s.sh(ctx, script, p); err != nil {
		return fmt.Errorf("sandbox %s: remove %s: %w", s.m.id, p, err)
	}
	return nil
}

// MakeDir implements backend.Files.
func (s *sandbox) MakeDir(ctx context.Context, p string, mode fs.FileMode, parents bool) error {
	if err := s.Serving(); err != nil {
		return err
	}
	if s.agent != nil {
		return s.agentMakeDir(ctx, p, mode, parents)
	}
	if err := checkPath("path", p); err != nil {
		return err
	}
	if mode.Perm() == 0 {
		mode = 0o755
	}
	flag := "-m"
	if parents {
		flag = "-pm"
	}
	if _, err := s.sh(ctx, `exec mkdir "$2" "$3" -- "$1"`, p, flag, strconv.FormatUint(uint64(mode.Perm()), 8)); err != nil {
		return fmt.Errorf("sandbox %s: mkdir %s: %w", s.m.id, p, err)
	}
	return nil
}
