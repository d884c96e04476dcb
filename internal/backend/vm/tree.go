package vm

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

var _ backend.Trees = (*sandbox)(nil)

// Trees of a vm sandbox are the guest's own tar (GNU tar in the built
// Debian), run through corral-agent with the stream as its streamed stdin
// or stdout: the whole guest is the sandbox, so the guest resolves every
// path. Owners are numeric, as the guest sees them. qemu-ga takes stdin
// whole and returns output at the end, so images without corral-agent
// offer no tree copy.

func (s *sandbox) treesOK() error {
	if err := s.live(); err != nil {
		return err
	}
	if s.agent == nil {
		return errdefs.NotSupported("sandbox %s: copying directory trees needs corral-agent in the VM image (images from vm-image build have it); copy single files", s.m.id)
	}
	return nil
}

// CopyIn implements backend.Trees: tar -x in the guest, fed the stream;
// the node counts the entries and content bytes as they pass.
func (s *sandbox) CopyIn(ctx context.Context, dir string, r io.Reader) (entries, n int64, err error) {
	if err := s.treesOK(); err != nil {
		return 0, 0, err
	}
	if err := checkPath("dir", dir); err != nil {
		return 0, 0, err
	}
	pr, pw := io.Pipe()
	counted := make(chan error, 1)
	go func() {
		tr := tar.NewReader(pr)
		for {
			h, err := tr.Next()
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				_, _ = io.Copy(io.Discard, pr) // let the tee finish
				counted <- err
				return
			}
			entries++
			if h.Typeflag == tar.TypeReg {
				n += h.Size
			}
		}
	}()
	var stderr bytes.Buffer
	res, err := s.agentExec(ctx, backend.ExecSpec{
		Argv: []string{"/bin/sh", "-c", `mkdir -p -- "$1" && exec tar -x -p --numeric-owner --xattrs -f - -C "$1"`, "corral-cp", dir},
		Env:  []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}, StdinReader: io.TeeReader(r, pw),
	}, collect(nil, &stderr))
	pw.Close()
	cerr := <-counted
	if err != nil {
		return 0, 0, fmt.Errorf("sandbox %s: copy into %s: %w", s.m.id, dir, err)
	}
	if res.ExitCode != 0 {
		return 0, 0, fmt.Errorf("sandbox %s: copy into %s: %w", s.m.id, dir, tarError(stderr.String()))
	}
	if cerr != nil {
		return 0, 0, errdefs.InvalidArgument("sandbox %s: copy into %s: the tar stream: %v", s.m.id, dir, cerr)
	}
	return entries, n, nil
}

// CopyOut implements backend.Trees: tar -c in the guest of path's last
// element (then its tree), streamed to w.
func (s *sandbox) CopyOut(ctx context.Context, p string, w io.Writer) error {
	if err := s.treesOK(); err != nil {
		return err
	}
	if err := checkPath("path", p); err != nil {
		return err
	}
	p = path.Clean(p)
	parent, base := path.Split(p)
	if base == "" { // "/"
		parent, base = "/", "."
	}
	var stderr bytes.Buffer
	res, err := s.agentExec(ctx, backend.ExecSpec{
		Argv: []string{"/bin/sh", "-c", `exec tar -c --numeric-owner --xattrs -f - -C "$1" -- "$2"`, "corral-cp", parent, base},
		Env:  []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"},
	}, collect(w, &stderr))
	if err != nil {
		return fmt.Errorf("sandbox %s: copy out %s: %w", s.m.id, p, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("sandbox %s: copy out %s: %w", s.m.id, p, tarError(stderr.String()))
	}
	return nil
}

// collect sends stdout to w (nil: dropped) and keeps stderr, of which
// only the start matters, in errb.
func collect(w io.Writer, errb *bytes.Buffer) backend.OutputFunc {
	return func(st backend.Stream, p []byte) error {
		if st == backend.Stderr {
			if errb.Len() < 4096 {
				errb.Write(p)
			}
			return nil
		}
		if w == nil {
			return nil
		}
		_, err := w.Write(p)
		return err
	}
}

// tarError is the guest tar's complaint in the error vocabulary.
func tarError(msg string) error {
	msg = strings.TrimSpace(msg)
	if msg == "" {
		return errors.New("tar failed")
	}
	if strings.Contains(msg, "This does not look like a tar archive") || strings.Contains(msg, "Unexpected EOF") {
		return errdefs.InvalidArgument("tar stream: %s", msg)
	}
	return fileError(msg)
}
