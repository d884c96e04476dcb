package e2b

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corral-dev/corral/internal/backend"
	filesystempb "github.com/corral-dev/corral/internal/e2b/envdpb/filesystem"
	"github.com/corral-dev/corral/internal/e2b/envdpb/filesystem/filesystempbconnect"
	"github.com/corral-dev/corral/internal/errdefs"
)

const (
	// maxListEntries bounds one ListDir answer (all depths together).
	maxListEntries = 10000
	// maxListDepth bounds ListDir's depth.
	maxListDepth = 32
	// maxWatchers bounds the polling watchers of one sandbox, and
	// maxWatcherEvents the events one holds between polls.
	maxWatchers      = 64
	maxWatcherEvents = 10000
)

// filesystemService implements envd's filesystem.Filesystem on the node's
// file calls.
type filesystemService struct {
	s *Server

	mu       sync.Mutex
	watchers map[string]*pollWatcher
}

var _ filesystempbconnect.FilesystemHandler = (*filesystemService)(nil)

// resolve makes an envd path absolute: relative paths (and ~) are taken
// from the sandbox's working directory, where commands start too.
func (s *Server) resolve(ctx context.Context, id, p string) (string, error) {
	if p == "" {
		return "", errdefs.InvalidArgument("path: required")
	}
	if strings.HasPrefix(p, "/") {
		return path.Clean(p), nil
	}
	dir := "/"
	if sb, err := s.lookup(ctx, id); err == nil && sb.Workdir != "" {
		dir = sb.Workdir
	} else if err != nil {
		return "", err
	}
	p = strings.TrimPrefix(strings.TrimPrefix(p, "~"), "/")
	return path.Join(dir, p), nil
}

// owners maps ids to names from the sandbox's /etc/passwd and /etc/group
// (read as files; an unreadable one leaves ids as numbers).
type owners struct{ users, groups map[uint32]string }

func (s *Server) owners(ctx context.Context, id string) owners {
	return owners{users: s.idNames(ctx, id, "/etc/passwd"), groups: s.idNames(ctx, id, "/etc/group")}
}

func (s *Server) idNames(ctx context.Context, id, file string) map[uint32]string {
	names := map[uint32]string{}
	s.scanColon(ctx, id, file, func(f []string) bool {
		if n, err := strconv.ParseUint(f[2], 10, 32); err == nil {
			if _, dup := names[uint32(n)]; !dup {
				names[uint32(n)] = f[0]
			}
		}
		return false
	})
	return names
}

// passwd calls fn for each entry of the sandbox's /etc/passwd until it
// returns true.
func (s *Server) passwd(ctx context.Context, id string, fn func(fields []string) bool) {
	s.scanColon(ctx, id, "/etc/passwd", fn)
}

// scanColon reads a colon-separated file of the sandbox (at most 1 MiB;
// lines of fewer than 3 fields are skipped).
func (s *Server) scanColon(ctx context.Context, id, file string, fn func(fields []string) bool) {
	rc, err := s.cfg.Node.ReadFile(ctx, id, file, 0, 1<<20)
	if err != nil {
		return
	}
	defer rc.Close()
	sc := bufio.NewScanner(rc)
	for sc.Scan() {
		if f := strings.Split(sc.Text(), ":"); len(f) >= 3 && fn(f) {
			return
		}
	}
}

func (o owners) name(m map[uint32]string, id uint32) string {
	if n, ok := m[id]; ok {
		return n
	}
	return strconv.FormatUint(uint64(id), 10)
}

func (o owners) entry(fi backend.FileInfo) *filesystempb.EntryInfo {
	e := &filesystempb.EntryInfo{
		Name:         fi.Name,
		Path:         fi.Path,
		Size:         fi.Size,
		Mode:         uint32(fi.Mode),
		Permissions:  fi.Mode.String(),
		Owner:        o.name(o.users, fi.UID),
		Group:        o.name(o.groups, fi.GID),
		ModifiedTime: timestamppb.New(fi.ModTime),
		Type:         filesystempb.FileType_FILE_TYPE_FILE,
	}
	switch {
	case fi.Mode&fs.ModeSymlink != 0:
		e.Type = filesystempb.FileType_FILE_TYPE_SYMLINK
		e.SymlinkTarget = &fi.LinkTarget
	case fi.Mode.IsDir():
		e.Type = filesystempb.FileType_FILE_TYPE_DIRECTORY
	}
	return e
}

func (f *filesystemService) stat(ctx context.Context, id, p string) (*filesystempb.EntryInfo, error) {
	fi, err := f.s.cfg.Node.Stat(ctx, id, p)
	if err != nil {
		return nil, err
	}
	return f.s.owners(ctx, id).entry(fi), nil
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystempb.StatRequest]) (*connect.Response[filesystempb.StatResponse], error) {
	id := sandboxFrom(ctx)
	p, err := f.s.resolve(ctx, id, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	e, err := f.stat(ctx, id, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystempb.StatResponse{Entry: e}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystempb.MakeDirRequest]) (*connect.Response[filesystempb.MakeDirResponse], error) {
	id := sandboxFrom(ctx)
	p, err := f.s.resolve(ctx, id, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	if _, err := f.s.cfg.Node.Stat(ctx, id, p); err == nil {
		return nil, errdefs.AlreadyExists("path %q: already exists", p)
	}
	user, err := userOf(req.Header())
	if err != nil {
		return nil, err
	}
	owner, err := f.s.owner(ctx, id, user)
	if err != nil {
		return nil, err
	}
	if err := f.s.cfg.Node.MakeDir(ctx, id, p, 0o755, true); err != nil {
		return nil, err
	}
	if owner != nil {
		if err := f.s.cfg.Node.Chown(ctx, id, p, owner[0], owner[1]); err != nil {
			return nil, err
		}
	}
	e, err := f.stat(ctx, id, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystempb.MakeDirResponse{Entry: e}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystempb.MoveRequest]) (*connect.Response[filesystempb.MoveResponse], error) {
	id := sandboxFrom(ctx)
	from, err := f.s.resolve(ctx, id, req.Msg.Source)
	if err != nil {
		return nil, err
	}
	to, err := f.s.resolve(ctx, id, req.Msg.Destination)
	if err != nil {
		return nil, err
	}
	if err := f.s.cfg.Node.Rename(ctx, id, from, to); err != nil {
		return nil, err
	}
	e, err := f.stat(ctx, id, to)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystempb.MoveResponse{Entry: e}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystempb.ListDirRequest]) (*connect.Response[filesystempb.ListDirResponse], error) {
	id := sandboxFrom(ctx)
	p, err := f.s.resolve(ctx, id, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.Depth)
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, errdefs.InvalidArgument("depth: %d is over the limit of %d", depth, maxListDepth)
	}
	o := f.s.owners(ctx, id)
	resp := &filesystempb.ListDirResponse{}
	dirs := []string{p}
	for level := 0; level < depth && len(dirs) > 0; level++ {
		var next []string
		for _, d := range dirs {
			list, err := f.s.cfg.Node.ListDir(ctx, id, d)
			if err != nil {
				if level > 0 && errdefs.IsNotFound(err) {
					continue // removed while we walked
				}
				return nil, err
			}
			for _, fi := range list {
				if len(resp.Entries) == maxListEntries {
					return nil, errdefs.ResourceExhausted("path %q: more than %d entries within depth %d", p, maxListEntries, depth)
				}
				resp.Entries = append(resp.Entries, o.entry(fi))
				if fi.Mode.IsDir() {
					next = append(next, fi.Path)
				}
			}
		}
		dirs = next
	}
	return connect.NewResponse(resp), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystempb.RemoveRequest]) (*connect.Response[filesystempb.RemoveResponse], error) {
	id := sandboxFrom(ctx)
	p, err := f.s.resolve(ctx, id, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	if err := f.s.cfg.Node.Remove(ctx, id, p, true); err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystempb.RemoveResponse{}), nil
}

var eventTypes = map[backend.WatchOp]filesystempb.EventType{
	backend.WatchCreate: filesystempb.EventType_EVENT_TYPE_CREATE,
	backend.WatchWrite:  filesystempb.EventType_EVENT_TYPE_WRITE,
	backend.WatchRemove: filesystempb.EventType_EVENT_TYPE_REMOVE,
	backend.WatchRename: filesystempb.EventType_EVENT_TYPE_RENAME,
	backend.WatchChmod:  filesystempb.EventType_EVENT_TYPE_CHMOD,
}

// event converts a change; with entry, the changed entry is described when
// it still exists.
func (f *filesystemService) event(ctx context.Context, id, dir string, ev backend.WatchEvent, entry bool) *filesystempb.FilesystemEvent {
	out := &filesystempb.FilesystemEvent{Name: ev.Name, Type: eventTypes[ev.Op]}
	if entry && ev.Op != backend.WatchRemove && ev.Op != backend.WatchRename {
		if e, err := f.stat(ctx, id, path.Join(dir, ev.Name)); err == nil {
			out.Entry = e
		}
	}
	return out
}

func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystempb.WatchDirRequest], stream *connect.ServerStream[filesystempb.WatchDirResponse]) error {
	id := sandboxFrom(ctx)
	dir, err := f.s.resolve(ctx, id, req.Msg.Path)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan backend.WatchEvent, 1024)
	ready := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- f.s.cfg.Node.WatchDir(ctx, id, dir, req.Msg.Recursive, func() { close(ready) }, func(ev backend.WatchEvent) {
			select {
			case events <- ev:
			case <-ctx.Done():
			}
		})
	}()
	select {
	case <-ready:
	case err := <-errc:
		return err
	}
	if err := stream.Send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Start{Start: &filesystempb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keepalive, stop := keepaliveTicks(req.Header())
	defer stop()
	for {
		select {
		case ev := <-events:
			fe := f.event(ctx, id, dir, ev, req.Msg.IncludeEntry)
			if err := stream.Send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
				return err
			}
		case <-keepalive:
			if err := stream.Send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Keepalive{Keepalive: &filesystempb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case err := <-errc:
			if err == nil {
				err = ctx.Err()
			}
			return err
		}
	}
}

// pollWatcher is a watch whose events a client fetches (CreateWatcher,
// GetWatcherEvents, RemoveWatcher).
type pollWatcher struct {
	sandbox string
	cancel  context.CancelFunc

	mu     sync.Mutex
	events []*filesystempb.FilesystemEvent
	lost   int
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystempb.CreateWatcherRequest]) (*connect.Response[filesystempb.CreateWatcherResponse], error) {
	id := sandboxFrom(ctx)
	dir, err := f.s.resolve(ctx, id, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	raw := make([]byte, 12)
	_, _ = rand.Read(raw)
	wid := hex.EncodeToString(raw)
	// The watch outlives this request: it ends with RemoveWatcher or the
	// sandbox.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &pollWatcher{sandbox: id, cancel: cancel}
	f.mu.Lock()
	n := 0
	for _, w := range f.watchers {
		if w.sandbox == id {
			n++
		}
	}
	if n >= maxWatchers {
		f.mu.Unlock()
		cancel()
		return nil, errdefs.ResourceExhausted("sandbox %s: %d watchers is the limit; remove one", id, maxWatchers)
	}
	f.watchers[wid] = w
	f.mu.Unlock()
	ready := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		err := f.s.cfg.Node.WatchDir(wctx, id, dir, req.Msg.Recursive, func() { close(ready) }, func(ev backend.WatchEvent) {
			fe := f.event(wctx, id, dir, ev, req.Msg.IncludeEntry)
			w.mu.Lock()
			if len(w.events) < maxWatcherEvents {
				w.events = append(w.events, fe)
			} else {
				w.lost++
			}
			w.mu.Unlock()
		})
		errc <- err
		// The watch ended on its own (the sandbox stopped, the directory
		// went away) or was removed: forget it.
		f.mu.Lock()
		delete(f.watchers, wid)
		f.mu.Unlock()
	}()
	select {
	case <-ready:
	case err := <-errc:
		cancel()
		return nil, err
	}
	return connect.NewResponse(&filesystempb.CreateWatcherResponse{WatcherId: wid}), nil
}

func (f *filesystemService) watcher(ctx context.Context, wid string) (*pollWatcher, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.watchers[wid]
	if !ok || w.sandbox != sandboxFrom(ctx) {
		return nil, errdefs.NotFound("watcher %q not found", wid)
	}
	return w, nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystempb.GetWatcherEventsRequest]) (*connect.Response[filesystempb.GetWatcherEventsResponse], error) {
	w, err := f.watcher(ctx, req.Msg.WatcherId)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	events, lost := w.events, w.lost
	w.events, w.lost = nil, 0
	w.mu.Unlock()
	if lost > 0 {
		return nil, errdefs.ResourceExhausted("watcher %s: %d events dropped (more than %d between polls)", req.Msg.WatcherId, lost, maxWatcherEvents)
	}
	return connect.NewResponse(&filesystempb.GetWatcherEventsResponse{Events: events}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystempb.RemoveWatcherRequest]) (*connect.Response[filesystempb.RemoveWatcherResponse], error) {
	w, err := f.watcher(ctx, req.Msg.WatcherId)
	if err != nil {
		return nil, err
	}
	w.cancel()
	f.mu.Lock()
	delete(f.watchers, req.Msg.WatcherId)
	f.mu.Unlock()
	return connect.NewResponse(&filesystempb.RemoveWatcherResponse{}), nil
}
