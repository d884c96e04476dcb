// Package ui serves corral's dashboard at /ui: the pages (from web/src)
// and their bundle (built from web/ by `make ui` with esbuild and committed
// in dist/, so the binary needs no network and no CDN) and a server-sent
// event stream of lifecycle events. The page reads everything else from the public API and
// /metrics. It imports the event log, iam (the caller) and control (for the
// events' API form); never the node or server packages.
package ui

import (
	"embed"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/iam"
)

// The pages are served from their sources; dist holds only what esbuild
// writes (the bundled scripts and styles), so no page is committed twice.
//
//go:embed dist web/src/index.html web/src/liveview.html
var files embed.FS

// site serves a page from web/src and everything else from dist.
type site struct{ pages, bundle fs.FS }

func (s site) Open(name string) (fs.File, error) {
	if strings.HasSuffix(name, ".html") {
		return s.pages.Open(name)
	}
	return s.bundle.Open(name)
}

// Register serves the dashboard on mux under /ui/, with events from log.
// The page itself is public (it holds no data); guard authenticates the
// event stream, which then carries only the events of projects the
// caller sees.
func Register(mux *http.ServeMux, log *events.Log, guard func(http.HandlerFunc) http.HandlerFunc) {
	pages, _ := fs.Sub(files, "web/src")
	bundle, _ := fs.Sub(files, "dist")
	mux.Handle("GET /ui/", http.StripPrefix("/ui/", http.FileServerFS(site{pages, bundle})))
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusFound))
	mux.HandleFunc("GET /ui/api/events", guard(eventStream(log)))
}

// maxRecent bounds ?recent=N.
const maxRecent = 1000

// eventStream serves the event log as text/event-stream: ?since=SEQ replays
// what follows SEQ, ?recent=N the last N kept, then live events follow.
func eventStream(log *events.Log) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var since uint64
		switch q := r.URL.Query(); {
		case q.Has("since"):
			v, err := strconv.ParseUint(q.Get("since"), 10, 64)
			if err != nil {
				http.Error(w, "since: not a sequence number", http.StatusBadRequest)
				return
			}
			since = v
		default:
			n, err := strconv.Atoi(q.Get("recent"))
			if q.Has("recent") && (err != nil || n < 0 || n > maxRecent) {
				http.Error(w, fmt.Sprintf("recent: must be 0 to %d", maxRecent), http.StatusBadRequest)
				return
			}
			since = log.LastSeq() - min(log.LastSeq(), uint64(max(n, 0)))
		}
		flusher, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "streaming unsupported", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		flusher.Flush()
		visible := control.VisibleTo(r.Context())
		if _, ok := iam.FromContext(r.Context()); !ok {
			visible = func(string) bool { return false }
		}
		for e := range log.Watch(r.Context(), &since, events.Filter{}) {
			if visible != nil && !visible(e.Project) {
				continue
			}
			b, err := protojson.Marshal(control.EventToProto(e))
			if err != nil {
				continue
			}
			if _, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", e.Seq, b); err != nil {
				return
			}
			flusher.Flush()
		}
	}
}
