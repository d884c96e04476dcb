package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Dir is a Store in a local directory: one read-only file per key,
// sha256-<hex>.blob for a blob and sha256-<hex>.chunks for its manifest —
// the layout of the image store's blobs directory, so a node can publish
// and serve (Handler) the blobs it builds in place. It is the embedded
// default (corral serve on one node).
type Dir struct{ root string }

// OpenDir returns the store in root, creating the directory.
func OpenDir(root string) (*Dir, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("blob dir %s: %w", root, err)
	}
	return &Dir{root: root}, nil
}

// Path returns the file of key, for callers that can use it in place
// (a fully local layer mounts its blob file directly).
func (d *Dir) Path(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	name := strings.Replace(key, ":", "-", 1)
	if isDigest(key) {
		name += ".blob"
	}
	return filepath.Join(d.root, name), nil
}

// Stat implements Store.
func (d *Dir) Stat(ctx context.Context, key string) (int64, error) {
	p, err := d.Path(key)
	if err != nil {
		return 0, err
	}
	st, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return 0, errdefs.NotFound("blob %s", key)
	}
	if err != nil {
		return 0, fmt.Errorf("blob %s: %w", key, err)
	}
	return st.Size(), ctx.Err()
}

// GetRange implements Store.
func (d *Dir) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	p, err := d.Path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.NotFound("blob %s", key)
	}
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", key, err)
	}
	st, err := f.Stat()
	if err == nil {
		err = checkRange(key, off, n, st.Size())
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &sectionCloser{io.NewSectionReader(f, off, n), f}, nil
}

type sectionCloser struct {
	*io.SectionReader
	f *os.File
}

func (s *sectionCloser) Close() error { return s.f.Close() }

// Put implements Store: the content goes to a temporary file, is checked,
// synced and renamed into place, so a key never names partial content.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	p, err := d.Path(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return errdefs.InvalidArgument("size: %d is negative", size)
	}
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	f, err := os.CreateTemp(d.root, ".tmp-")
	if err != nil {
		return fmt.Errorf("put blob %s: %w", key, err)
	}
	defer os.Remove(f.Name()) // fails harmlessly after the rename
	v := newVerifier(r, key, size)
	_, err = io.Copy(f, &ctxReader{ctx, v})
	if err == nil {
		err = v.result()
	}
	if err == nil {
		err = f.Chmod(0o444)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		return fmt.Errorf("put blob %s: %w", key, err)
	}
	return nil
}

// ContextReader returns r, whose reads fail once ctx ends: an io.Copy
// from it stops with the context.
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return &ctxReader{ctx, r} }

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
