// Package blob owns corral's blob stores: content-addressed, immutable
// byte strings (EROFS data blobs and their chunk manifests) kept in a local
// directory, fetched from another node over HTTP, or kept in an
// S3-compatible object store. Readers fetch byte ranges, so a node can load
// a layer's data on demand (storage/lazy). It imports nothing from
// corral but errdefs.
package blob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"regexp"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Store keeps blobs by key. A key is a blob digest "sha256:<64 hex>", or
// that digest with ManifestSuffix for the blob's chunk manifest, or a
// layer digest with LayerSuffix for the layer's record (what a node needs
// to learn a layer made elsewhere). Every
// method may block on the network and honours ctx.
type Store interface {
	// Stat returns the size of the blob (errdefs.NotFound when absent).
	Stat(ctx context.Context, key string) (int64, error)
	// GetRange returns a reader of the n bytes at off. Reading it to the
	// end gives exactly n bytes or an error; the caller closes it.
	GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
	// Put stores size bytes from r under key. For a digest key the
	// content must hash to it (else errdefs.InvalidArgument and nothing
	// is stored). Putting an existing key is a no-op success.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
}

// ManifestSuffix turns a blob digest into the key of its chunk manifest.
const ManifestSuffix = ".chunks"

// LayerSuffix turns a layer digest into the key of its layer record.
const LayerSuffix = ".layer"

var keyRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}(\.chunks|\.layer)?$`)

// CheckKey validates a store key (field "key").
func CheckKey(key string) error {
	if !keyRE.MatchString(key) {
		return errdefs.InvalidArgument("key: %q must be sha256:<64 lowercase hex>, optionally followed by %s or %s", key, ManifestSuffix, LayerSuffix)
	}
	return nil
}

// isDigest reports whether key names a blob by its own content hash.
func isDigest(key string) bool { return !strings.Contains(key, ".") }

// checkRange validates [off, off+n) against a blob of size bytes.
func checkRange(key string, off, n, size int64) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return errdefs.InvalidArgument("range: %d bytes at %d is outside blob %s of %d bytes", n, off, key, size)
	}
	return nil
}

// Digest returns "sha256:<hex>" of h's sum.
func Digest(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

// verifier hashes what passes through it and, at EOF, checks the count
// and, for digest keys, the digest; a mismatch turns EOF into an error so
// that a store never commits what it checked wrong.
type verifier struct {
	r    io.Reader
	key  string
	size int64
	n    int64
	h    hash.Hash
	// checked is set once the full content was hashed and compared; err
	// keeps a mismatch, for callers whose copy loop may drop it (io.ReadFull
	// does once it has the bytes it wanted).
	checked bool
	err     error
}

// result is the verdict after the copy: nil only if all size bytes came
// and matched.
func (v *verifier) result() error {
	if v.err != nil {
		return v.err
	}
	if !v.checked {
		return errdefs.InvalidArgument("size: blob %s: only %d of %d bytes read", v.key, v.n, v.size)
	}
	return nil
}

func newVerifier(r io.Reader, key string, size int64) *verifier {
	return &verifier{r: r, key: key, size: size, h: sha256.New()}
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.n += int64(n)
	v.h.Write(p[:n])
	if v.n > v.size {
		v.err = errdefs.InvalidArgument("size: blob %s is longer than the %d bytes given", v.key, v.size)
		return n, v.err
	}
	if err == io.EOF && v.n != v.size {
		v.err = errdefs.InvalidArgument("size: blob %s has %d bytes, %d were given", v.key, v.n, v.size)
		return n, v.err
	}
	// Checked as soon as the last byte is in: an uploader that reads
	// exactly size bytes never asks for the EOF.
	if v.n == v.size && !v.checked {
		v.checked = true
		if got := Digest(v.h); isDigest(v.key) && got != v.key {
			v.err = errdefs.InvalidArgument("key: content hashes to %s, not %s", got, v.key)
			return n, v.err
		}
	}
	return n, err
}

// exactReader turns an early EOF of a range reader into an error.
type exactReader struct {
	rc   io.ReadCloser
	left int64
	what string
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.rc.Read(p)
	e.left -= int64(n)
	if err == io.EOF && e.left > 0 {
		return n, fmt.Errorf("%s: %w", e.what, io.ErrUnexpectedEOF)
	}
	if err == io.EOF {
		err = nil
	}
	return n, err
}

func (e *exactReader) Close() error { return e.rc.Close() }
