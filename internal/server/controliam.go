package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// controlGuard is a control instance's guard: the IAM records are the
// cluster's (in etcd, alike on every control instance and node), a
// sandbox's project is asked of its node, image names are owned in the
// same etcd and exist when a node recorded them for the cluster.
func controlGuard(svc *iam.Service, proxy *cluster.Proxy, images ClusterImageService) *control.Guard {
	owners := &control.ImageOwners{Store: svc.Store(), Exists: images.exists}
	cc := clusterContents{proxy: proxy, owners: owners}
	svc.SetContents(cc, cc.usage)
	projects := &projectCache{m: map[string]string{}}
	return &control.Guard{
		IAM:    svc,
		Images: owners,
		SandboxProject: func(ctx context.Context, id string) (string, error) {
			if p, ok := projects.get(id); ok {
				return p, nil
			}
			resp, err := proxy.Get(control.NodeAdminContext(ctx), connect.NewRequest(&corralv1.GetRequest{Id: id}))
			if err != nil {
				return "", err
			}
			sb := resp.Msg.GetSandbox()
			if sb.GetState() != corralv1.SandboxState_SANDBOX_STATE_LOST { // a lost node's answer has no project
				projects.put(id, sb.GetProject())
			}
			return sb.GetProject(), nil
		},
	}
}

// projectCache remembers sandboxes' projects, which never change (ids are
// not reused), so that a token's calls into a sandbox cost no extra round
// trip to its node after the first. It is emptied when full.
type projectCache struct {
	mu sync.Mutex
	m  map[string]string
}

const maxCachedProjects = 200_000

func (c *projectCache) get(id string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.m[id]
	return p, ok
}

func (c *projectCache) put(id, project string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCachedProjects {
		clear(c.m)
	}
	c.m[id] = project
}

// exists reports whether a node recorded an image called name (any
// version) for the cluster.
func (s ClusterImageService) exists(ctx context.Context, name string) (bool, error) {
	resp, err := s.ListImages(ctx, connect.NewRequest(&corralv1.ListImagesRequest{}))
	if err != nil {
		return false, err
	}
	for _, l := range resp.Msg.Layers {
		if imageNameOf(l.Ref) == name {
			return true, nil
		}
	}
	for _, c := range resp.Msg.Compositions {
		if imageNameOf(c.Ref) == name {
			return true, nil
		}
	}
	return false, nil
}

func imageNameOf(ref string) string {
	name, _, _ := strings.Cut(ref, "@")
	return name
}

// clusterContents is what a project holds across the cluster's nodes.
type clusterContents struct {
	proxy  *cluster.Proxy
	owners *control.ImageOwners
}

// each calls fn with every sandbox project (or a subproject) has, asking
// every node as a viewer of project; a node that cannot answer fails the
// walk (its sandboxes would go uncounted).
func (c clusterContents) each(ctx context.Context, project string, fn func(*corralv1.Sandbox)) error {
	vctx := iam.WithPrincipal(ctx, iam.Principal{Project: project, Role: iam.RoleViewer})
	token := ""
	for {
		resp, err := c.proxy.List(vctx, connect.NewRequest(&corralv1.ListRequest{PageSize: 1000, PageToken: token}))
		if err != nil {
			return fmt.Errorf("list the sandboxes of project %s: %w", project, err)
		}
		if len(resp.Msg.UnavailableNodes) > 0 {
			return errdefs.Unavailable("list the sandboxes of project %s: nodes unavailable: %s", project, strings.Join(resp.Msg.UnavailableNodes, "; "))
		}
		for _, sb := range resp.Msg.Sandboxes {
			fn(sb)
		}
		if token = resp.Msg.NextPageToken; token == "" {
			return nil
		}
	}
}

func (c clusterContents) sandboxes(ctx context.Context, project string) ([]string, error) {
	var ids []string
	err := c.each(ctx, project, func(sb *corralv1.Sandbox) {
		if sb.Project == project {
			ids = append(ids, sb.Id)
		}
	})
	return ids, err
}

func (c clusterContents) Count(ctx context.Context, project string) (string, error) {
	return countContents(ctx, project, c.sandboxes, c.owners)
}

// DeleteAll deletes the project's sandboxes on every node. Image names
// live in the stores of the nodes that made them, which a control
// instance does not manage: a project still owning some is refused (its
// administrator removes them on those nodes), rather than leaving the
// images behind without an owner, where every project could use them.
func (c clusterContents) DeleteAll(ctx context.Context, project string) error {
	actx := control.NodeAdminContext(ctx)
	names, err := deleteSandboxes(ctx, project, c.sandboxes, func(id string) error {
		_, err := c.proxy.Delete(actx, connect.NewRequest(&corralv1.DeleteRequest{Id: id}))
		return err
	}, c.owners)
	if err != nil {
		return err
	}
	if len(names) > 0 {
		return errdefs.FailedPrecondition("project %s: owns image names %s, kept in node image stores: remove them on the nodes holding them first", project, strings.Join(names, ", "))
	}
	return nil
}

// usage sums project's live sandboxes across the nodes (for listings;
// admission counts on each node).
func (c clusterContents) usage(project string) iam.Usage {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var u iam.Usage
	_ = c.each(ctx, project, func(sb *corralv1.Sandbox) {
		if sb.State == corralv1.SandboxState_SANDBOX_STATE_STOPPED {
			return
		}
		r := sb.GetResources()
		u = u.Add(iam.Usage{Sandboxes: 1, CPUMillis: r.GetCpuMillis(), MemoryBytes: r.GetMemoryBytes(), DiskBytes: r.GetDiskBytes()})
	})
	return u
}
