package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/iam/etcdstore"
	"github.com/corral-dev/corral/internal/node"
	"github.com/corral-dev/corral/internal/state"
	image "github.com/corral-dev/corral/internal/storage/layers"
)

// IAMPath is where the IAM store of a data dir lives: a bbolt file of its
// own, fsynced on every write (the node's state.db is not).
func IAMPath(dataDir string) string { return filepath.Join(dataDir, "iam.db") }

// AuditJournalPath is where the audit journal in front of IAMPath lives.
func AuditJournalPath(dataDir string) string { return filepath.Join(dataDir, "audit.journal") }

// openIAM opens the IAM service over the node's bbolt store with the audit
// journal in front of it, or over the cluster's etcd for a cluster node.
func openIAM(ctx context.Context, cfg Config) (*iam.Service, error) {
	if len(cfg.IAMEtcd) > 0 {
		// The client outlives the start-up context.
		st, err := etcdstore.Open(context.WithoutCancel(ctx), cfg.IAMEtcd, etcdstore.DefaultPrefix)
		if err != nil {
			return nil, err
		}
		return iam.New(iam.Config{Store: st, Logger: cfg.Logger}), nil
	}
	st, err := iam.OpenBolt(IAMPath(cfg.DataDir))
	if err != nil {
		return nil, err
	}
	j, err := iam.OpenAuditJournal(AuditJournalPath(cfg.DataDir), st, cfg.Logger)
	if err != nil {
		st.Close()
		return nil, err
	}
	return iam.New(iam.Config{Store: st, Logger: cfg.Logger, Journal: j}), nil
}

// admitWith checks a create against the quotas of its project and every
// ancestor, with usage summed from the node's live records.
func admitWith(svc *iam.Service) node.AdmitFunc {
	return func(ctx context.Context, rec *state.Record, live func() []*state.Record) error {
		if rec.Project == "" {
			return nil
		}
		recs := live()
		return svc.AdmitSandbox(ctx, rec.Project,
			iam.Usage{Sandboxes: 1, CPUMillis: rec.CPUMillis, MemoryBytes: rec.MemoryBytes, DiskBytes: rec.DiskBytes},
			func(path string) iam.Usage { return usageOf(recs, path) })
	}
}

func usageOf(recs []*state.Record, path string) iam.Usage {
	var u iam.Usage
	for _, r := range recs {
		if r.Project != "" && iam.Within(r.Project, path) {
			u = u.Add(iam.Usage{Sandboxes: 1, CPUMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, DiskBytes: r.DiskBytes})
		}
	}
	return u
}

// projectContents is what a project holds on this node: sandboxes and
// image names.
type projectContents struct {
	node   *node.Node
	images *image.Store
	owners *control.ImageOwners
}

func (c projectContents) sandboxes(ctx context.Context, project string) ([]string, error) {
	var ids []string
	token := ""
	for {
		sbs, next, err := c.node.List(ctx, node.ListFilter{PageSize: 1000, PageToken: token,
			Visible: func(p string) bool { return p == project }})
		if err != nil {
			return nil, err
		}
		for _, sb := range sbs {
			ids = append(ids, sb.ID)
		}
		if next == "" {
			return ids, nil
		}
		token = next
	}
}

// countContents is iam.Contents.Count over a project's sandboxes (listed
// by sandboxes) and image names: "3 sandboxes and 1 image names (a@1)";
// "" for nothing.
func countContents(ctx context.Context, project string, sandboxes func(context.Context, string) ([]string, error), owners *control.ImageOwners) (string, error) {
	ids, err := sandboxes(ctx, project)
	if err != nil {
		return "", err
	}
	names, err := owners.Owned(ctx, project)
	if err != nil {
		return "", err
	}
	var parts []string
	if len(ids) > 0 {
		parts = append(parts, fmt.Sprintf("%d sandboxes", len(ids)))
	}
	if len(names) > 0 {
		parts = append(parts, fmt.Sprintf("%d image names (%s)", len(names), strings.Join(names, ", ")))
	}
	return strings.Join(parts, " and "), nil
}

func (c projectContents) Count(ctx context.Context, project string) (string, error) {
	return countContents(ctx, project, c.sandboxes, c.owners)
}

// deleteSandboxes deletes project's sandboxes (listed by sandboxes) one by
// one with del, then returns the image names it still owns.
func deleteSandboxes(ctx context.Context, project string, sandboxes func(context.Context, string) ([]string, error), del func(id string) error, owners *control.ImageOwners) ([]string, error) {
	ids, err := sandboxes(ctx, project)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if err := del(id); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	return owners.Owned(ctx, project)
}

func (c projectContents) DeleteAll(ctx context.Context, project string) error {
	names, err := deleteSandboxes(ctx, project, c.sandboxes, func(id string) error {
		_, err := c.node.Delete(ctx, id)
		return err
	}, c.owners)
	if err != nil {
		return err
	}
	for _, name := range names {
		refs, err := imageRefs(ctx, c.images, name)
		if err != nil {
			return err
		}
		// Compositions before layers: a composition pins its layers.
		for _, ref := range refs {
			if _, err := c.images.Remove(ctx, ref); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("image %s: %w", ref, err)
			}
		}
		if err := c.owners.Forget(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// imageRefs lists the compositions, then the layers, called name (any
// version).
func imageRefs(ctx context.Context, images *image.Store, name string) ([]string, error) {
	comps, err := images.Compositions(ctx)
	if err != nil {
		return nil, err
	}
	layers, err := images.Layers(ctx)
	if err != nil {
		return nil, err
	}
	var refs []string
	for _, c := range comps {
		refs = append(refs, c.Ref)
	}
	for _, l := range layers {
		refs = append(refs, l.Ref)
	}
	return slices.DeleteFunc(refs, func(ref string) bool {
		n, _, _ := strings.Cut(ref, "@")
		return n != name
	}), nil
}

// imageExists reports whether the image store has name in any form.
func imageExists(images *image.Store) func(ctx context.Context, name string) (bool, error) {
	return func(ctx context.Context, name string) (bool, error) {
		refs, err := imageRefs(ctx, images, name)
		if err != nil || len(refs) > 0 {
			return len(refs) > 0, err
		}
		imgs, err := images.List(ctx)
		if err != nil {
			return false, err
		}
		for _, img := range imgs {
			if img.Name == name {
				return true, nil
			}
		}
		return false, nil
	}
}

// guard builds the interceptor in front of every service.
func (s *Server) guard() *control.Guard {
	owners := &control.ImageOwners{Store: s.iam.Store(), Exists: imageExists(s.images)}
	s.iam.SetContents(projectContents{node: s.node, images: s.images, owners: owners},
		func(project string) iam.Usage { return usageOf(s.node.LiveRecords(), project) })
	return &control.Guard{
		IAM:    s.iam,
		Images: owners,
		SandboxProject: func(ctx context.Context, id string) (string, error) {
			sb, err := s.node.Get(ctx, id)
			if err != nil {
				return "", err
			}
			return sb.Project, nil
		},
	}
}

// serveIAM mounts the IAM service on mux.
func (s *Server) serveIAM(mux *http.ServeMux, images *control.ImageOwners, opts ...connect.HandlerOption) {
	path, h := corralv1connect.NewIAMServiceHandler(control.NewIAMService(s.iam, images), opts...)
	mux.Handle(path, h)
}

// connContext makes every connection on the unix socket (0600, the
// daemon's user: root) the node administrator's; TCP connections carry no
// principal and must send a token.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if c.LocalAddr().Network() == "unix" {
		return control.NodeAdminContext(ctx)
	}
	return ctx
}

// authHTTP guards plain HTTP endpoints (/metrics, the dashboard's event
// stream): the unix socket, or any valid token on TCP, whose principal the
// handler then finds in the request's context. The figures name every sandbox of the node, so give
// scrape tokens to operators only.
func (s *Server) authHTTP(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := iam.FromContext(r.Context()); !ok {
			secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok {
				http.Error(w, "unauthenticated: send Authorization: Bearer <token>", http.StatusUnauthorized)
				return
			}
			p, err := s.iam.Authenticate(r.Context(), strings.TrimSpace(secret))
			if err != nil {
				http.Error(w, err.Error(), http.StatusUnauthorized)
				return
			}
			r = r.WithContext(iam.WithPrincipal(r.Context(), p))
		}
		next(w, r)
	}
}

// checkTLS checks --tls-cert/--tls-key: both or neither, and loadable.
func checkTLS(cfg Config) error {
	if cfg.TLSCert == "" && cfg.TLSKey == "" {
		return nil
	}
	if cfg.TLSCert == "" || cfg.TLSKey == "" {
		return errdefs.InvalidArgument("tls: --tls-cert and --tls-key go together")
	}
	if _, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey); err != nil {
		return errdefs.InvalidArgument("tls: load %s / %s: %v", cfg.TLSCert, cfg.TLSKey, err)
	}
	return nil
}

// serveTCP serves the TCP listener, over TLS when configured.
func (s *Server) serveTCP(ln net.Listener) error {
	if s.cfg.TLSCert != "" {
		return s.http.ServeTLS(ln, s.cfg.TLSCert, s.cfg.TLSKey)
	}
	return s.http.Serve(ln)
}

// IAM is the server's IAM service: other front ends on the node (the E2B
// API's X-API-KEY) authenticate through its Authenticate.
func (s *Server) IAM() *iam.Service { return s.iam }
