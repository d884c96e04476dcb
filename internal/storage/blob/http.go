package blob

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// HTTPPrefix is the path under which Handler serves blobs:
// GET|HEAD <prefix><key>, GET with one "Range: bytes=a-b".
const HTTPPrefix = "/v1/blobs/"

// Handler serves a node's blobs to its peers, read-only; log nil discards.
func Handler(s Store, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &handler{s: s, log: log}
}

type handler struct {
	s   Store
	log *slog.Logger
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, ok := strings.CutPrefix(r.URL.Path, HTTPPrefix)
	if !ok || CheckKey(key) != nil {
		http.Error(w, "no such blob path", http.StatusNotFound)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "blobs are read-only", http.StatusMethodNotAllowed)
		return
	}
	size, err := h.s.Stat(r.Context(), key)
	if err != nil {
		httpError(w, err)
		return
	}
	off, n, partial, err := parseRange(r.Header.Get("Range"), size)
	if err != nil {
		w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
		http.Error(w, err.Error(), http.StatusRequestedRangeNotSatisfiable)
		return
	}
	w.Header().Set("Accept-Ranges", "bytes")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.Header().Set("Content-Type", "application/octet-stream")
	status := http.StatusOK
	if partial {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, off+n-1, size))
		status = http.StatusPartialContent
	}
	if r.Method == http.MethodHead {
		w.WriteHeader(status)
		return
	}
	rc, err := h.s.GetRange(r.Context(), key, off, n)
	if err != nil {
		httpError(w, err)
		return
	}
	defer rc.Close()
	w.WriteHeader(status)
	if _, err := io.Copy(w, rc); err != nil && r.Context().Err() == nil {
		h.log.Warn("serve blob", "key", key, "err", err)
	}
}

func httpError(w http.ResponseWriter, err error) {
	switch {
	case errdefs.IsNotFound(err):
		http.Error(w, err.Error(), http.StatusNotFound)
	case errdefs.IsInvalidArgument(err):
		http.Error(w, err.Error(), http.StatusBadRequest)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// parseRange reads one "bytes=a-b" or "bytes=a-" range; no header means the
// whole blob. Suffix and multiple ranges are not used by peers.
func parseRange(h string, size int64) (off, n int64, partial bool, err error) {
	if h == "" {
		return 0, size, false, nil
	}
	spec, ok := strings.CutPrefix(h, "bytes=")
	first, last, ok2 := strings.Cut(spec, "-")
	if !ok || !ok2 || strings.Contains(spec, ",") {
		return 0, 0, false, fmt.Errorf("range %q: want bytes=FIRST-LAST", h)
	}
	a, err := strconv.ParseInt(first, 10, 64)
	if err != nil || a < 0 || a >= size {
		return 0, 0, false, fmt.Errorf("range %q: first byte outside 0..%d", h, size-1)
	}
	b := size - 1
	if last != "" {
		if b, err = strconv.ParseInt(last, 10, 64); err != nil || b < a {
			return 0, 0, false, fmt.Errorf("range %q: bad last byte", h)
		}
		b = min(b, size-1)
	}
	return a, b - a + 1, true, nil
}

// HTTP is a read-only Store backed by another node's Handler (peer fetch).
type HTTP struct {
	base   string
	client *http.Client
}

// NewHTTP returns a store reading from the peer at base (e.g.
// "http://10.0.0.2:7070"); client nil means http.DefaultClient. Deadlines
// come from the contexts of the calls.
func NewHTTP(base string, client *http.Client) *HTTP {
	if client == nil {
		client = http.DefaultClient
	}
	return &HTTP{base: strings.TrimSuffix(base, "/") + HTTPPrefix, client: client}
}

func (p *HTTP) do(ctx context.Context, method, key, rng string) (*http.Response, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, p.base+key, nil)
	if err != nil {
		return nil, err
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, errdefs.Unavailable("peer blob %s: %v", key, err)
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusPartialContent:
		return resp, nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	text := strings.TrimSpace(string(msg))
	switch resp.StatusCode {
	case http.StatusNotFound:
		return nil, errdefs.NotFound("peer blob %s: %s", key, text)
	case http.StatusBadRequest, http.StatusRequestedRangeNotSatisfiable:
		return nil, errdefs.InvalidArgument("peer blob %s: %s", key, text)
	}
	return nil, errdefs.Unavailable("peer blob %s: %s: %s", key, resp.Status, text)
}

// Stat implements Store.
func (p *HTTP) Stat(ctx context.Context, key string) (int64, error) {
	resp, err := p.do(ctx, http.MethodHead, key, "")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	if resp.ContentLength < 0 {
		return 0, errdefs.Unavailable("peer blob %s: no Content-Length", key)
	}
	return resp.ContentLength, nil
}

// GetRange implements Store.
func (p *HTTP) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n < 0 {
		return nil, errdefs.InvalidArgument("range: %d bytes at %d", n, off)
	}
	if n == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	resp, err := p.do(ctx, http.MethodGet, key, fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusPartialContent && resp.ContentLength >= 0 && resp.ContentLength < n {
		resp.Body.Close() // the peer clamped the range to the blob's end
		return nil, errdefs.InvalidArgument("range: %d bytes at %d is outside peer blob %s (%d bytes there)", n, off, key, resp.ContentLength)
	}
	if resp.StatusCode != http.StatusPartialContent || resp.ContentLength != n {
		resp.Body.Close()
		return nil, errdefs.Unavailable("peer blob %s: asked %d bytes at %d, got %s of %d bytes", key, n, off, resp.Status, resp.ContentLength)
	}
	return &exactReader{rc: resp.Body, left: n, what: "peer blob " + key}, nil
}

// Put implements Store: peers are read-only (a node publishes to its own
// store or to the shared S3 store, never into another node).
func (p *HTTP) Put(context.Context, string, io.Reader, int64) error {
	return errdefs.NotSupported("put: peer blob stores are read-only; publish to the local or S3 store")
}
