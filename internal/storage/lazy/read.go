package lazy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/corral-dev/corral/internal/errdefs"
)

// fileNode is a blob's file on the mount.
type fileNode struct {
	fs.Inode
	b *blobFile
}

var (
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeReader    = (*fileNode)(nil)
	_ fs.NodeGetattrer = (*fileNode)(nil)
)

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return nil, 0, syscall.EROFS
	}
	// Direct I/O: every read comes to us (the chunk cache is the cache;
	// EROFS keeps its own page cache above), and concurrent reads stay
	// concurrent.
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (n *fileNode) Getattr(ctx context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	// Root only: the kernel opens it as the mounting node; sandboxes read
	// through EROFS, never by path (the data may be private to a tenant).
	out.Mode = syscall.S_IFREG | 0o400
	out.Size = uint64(n.b.m.Size)
	out.Blocks = (out.Size + 511) / 512
	out.Nlink = 1
	return 0
}

func (n *fileNode) Read(ctx context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	g := n.b.fs.groups.of(ctx)
	got, err := n.b.readAt(ctx, g, dest, off)
	if g != nil {
		g.bytesRead.Add(int64(got))
	}
	if err != nil {
		n.b.fs.cfg.Log.Debug("lazy blob: read", "blob", n.b.digest, "off", off, "len", len(dest), "err", err)
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:got]), 0
}

// readAt fills p from off: present chunks from the cache file, missing
// ones fetched (and stored) first.
func (b *blobFile) readAt(ctx context.Context, g *groupCounters, p []byte, off int64) (int, error) {
	if off >= b.m.Size {
		return 0, nil
	}
	p = p[:min(int64(len(p)), b.m.Size-off)]
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		i := int(pos / b.m.ChunkSize)
		cOff, cLen := b.m.ChunkRange(i)
		want := p[done:min(len(p), done+int(cOff+cLen-pos))]
		n, err := b.readChunk(ctx, g, i, want, pos-cOff)
		if err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// readChunk copies len(dst) bytes at offset within chunk i into dst,
// counting for group g (nil: unattributed).
func (b *blobFile) readChunk(ctx context.Context, g *groupCounters, i int, dst []byte, within int64) (int, error) {
	cOff, _ := b.m.ChunkRange(i)
	b.touch(i)
	b.mu.RLock()
	if b.has(i) {
		n, err := b.data.ReadAt(dst, cOff+within)
		b.mu.RUnlock()
		if err != nil && !(err == io.EOF && n == len(dst)) {
			return n, fmt.Errorf("cache read chunk %d: %w", i, err)
		}
		b.hits.Add(1)
		if g != nil {
			g.hits.Add(1)
		}
		return n, nil
	}
	b.mu.RUnlock()
	b.misses.Add(1)
	if g != nil {
		g.misses.Add(1)
	}
	b.fs.foreground.Add(1)
	defer b.fs.foreground.Add(-1)
	data, err := b.fetch(ctx, g, i)
	if err != nil {
		return 0, err
	}
	return copy(dst, data[within:]), nil
}

// fetch returns chunk i's verified content, fetching it from the store
// once for all concurrent callers (its bytes count for g, the group of the
// first). The fetch runs under the FS's context and FetchTimeout, not the
// caller's: a reader that gives up does not fail the others.
func (b *blobFile) fetch(ctx context.Context, g *groupCounters, i int) ([]byte, error) {
	ch := b.group.DoChan(strconv.Itoa(i), func() (any, error) {
		data, err := b.fetchOnce(i)
		if err == nil && g != nil { // the group whose read started it
			g.bytesFetched.Add(int64(len(data)))
		}
		return data, err
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.([]byte), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fetchOnce gets chunk i from the store, retrying on a digest mismatch,
// and stores it.
func (b *blobFile) fetchOnce(i int) ([]byte, error) {
	off, n := b.m.ChunkRange(i)
	// A fetch that ended between the caller's look and this one left the
	// chunk in the cache.
	b.mu.RLock()
	if b.has(i) {
		data := make([]byte, n)
		got, err := b.data.ReadAt(data, off)
		b.mu.RUnlock()
		if int64(got) == n {
			return data, nil
		}
		b.fs.cfg.Log.Warn("lazy blob: cache read", "blob", b.digest, "chunk", i, "err", err)
	} else {
		b.mu.RUnlock()
	}
	ctx, cancel := context.WithTimeout(b.fs.ctx, b.fs.cfg.FetchTimeout)
	defer cancel()
	var err error
	for attempt := 0; attempt < b.fs.cfg.Attempts; attempt++ {
		var data []byte
		data, err = b.getRange(ctx, off, n)
		if err == nil {
			if err = b.m.Verify(i, data); err == nil {
				b.fetchedBytes.Add(n)
				if serr := b.store(i, data); serr != nil {
					// Still served: it is verified; the cache just lacks it.
					b.fs.cfg.Log.Warn("lazy blob: cache store", "blob", b.digest, "err", serr)
				}
				b.fault.Store(nil)
				b.fs.maybeEvict()
				return data, nil
			}
			b.corrupt.Add(1)
			b.fs.cfg.Log.Warn("lazy blob: corrupt chunk, fetching again", "blob", b.digest, "chunk", i, "attempt", attempt+1, "err", err)
			continue
		}
		if ctx.Err() != nil || errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) {
			break // out of time, or a retry cannot help
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("fetch timed out after %v: %w", b.fs.cfg.FetchTimeout, err)
	}
	err = errdefs.Unavailable("blob %s chunk %d (%d bytes at %d): %v", b.digest, i, n, off, err)
	b.faults.Add(1)
	b.fault.Store(&Fault{Reason: err.Error(), At: time.Now()})
	b.fs.faults.add(b.digest, err.Error())
	if b.fs.cfg.OnFault != nil {
		b.fs.cfg.OnFault(b.digest, err)
	}
	return nil, err
}

func (b *blobFile) getRange(ctx context.Context, off, n int64) ([]byte, error) {
	rc, err := b.fs.store.GetRange(ctx, b.digest, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data := make([]byte, n)
	if _, err := io.ReadFull(rc, data); err != nil {
		return nil, err
	}
	return data, nil
}
