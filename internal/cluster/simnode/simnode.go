// Package simnode runs simulated cluster nodes for `corral bench cluster`
// and placement tests: each is the real NodeAgent (admission, request-id
// dedupe, load measurement) and Registrar over an in-memory sandbox table
// with a modelled create latency, served over the real node API (many
// nodes on one listener, each under its own path). No sandbox is real. It
// imports cluster, iam, errdefs and the API; it must not import node,
// backend or server.
package simnode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// Spec describes one simulated node.
type Spec struct {
	ID       string
	Labels   map[string]string
	Capacity cluster.Capacity
	// Latency is the modelled create time (uniform in [Latency/2, 3/2 Latency]).
	Latency time.Duration
	// Refuse makes the node refuse every create with this reason while
	// advertising free capacity (an admission the control plane cannot
	// predict).
	Refuse string
}

// Fleet is a set of simulated nodes behind one listener.
type Fleet struct {
	srv   *http.Server
	addr  string
	nodes []*Node
	etcd  *clientv3.Client
}

// Node is one simulated node.
type Node struct {
	Spec
	agent     *cluster.NodeAgent
	registrar *cluster.Registrar
	table     *table
}

// Start serves the nodes on listen (host:port) and registers each in etcd
// with the given lease TTL and report interval.
func Start(ctx context.Context, listen string, endpoints []string, secret cluster.Secret, specs []Spec, ttl, report time.Duration, log *slog.Logger) (*Fleet, error) {
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("simulated nodes: listen %s: %w", listen, err)
	}
	cli, err := cluster.Dial(endpoints)
	if err != nil {
		ln.Close()
		return nil, err
	}
	f := &Fleet{addr: ln.Addr().String(), etcd: cli}
	mux := http.NewServeMux()
	for _, s := range specs {
		t := &table{node: s.ID, latency: s.Latency, refuse: s.Refuse, sandboxes: map[string]*corralv1.Sandbox{}}
		agent, err := cluster.NewNodeAgent(ctx, cluster.AgentConfig{Sandboxes: t, Capacity: s.Capacity,
			DefaultCPUMillis: 1000, DefaultMemoryBytes: 512 << 20, Logger: log,
			// Many agents share one process: listing every table at every
			// report would be the harness's cost, not the control plane's.
			RecountInterval: 10 * report})
		if err != nil {
			f.Close(ctx)
			return nil, err
		}
		n := &Node{Spec: s, agent: agent, table: t}
		prefix := "/" + s.ID
		_, h := agent.Handler(secret, connect.WithInterceptors(errorCodes{}), connect.WithCompressMinBytes(64<<10))
		mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
		f.nodes = append(f.nodes, n)
	}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	f.srv = &http.Server{Handler: mux, Protocols: protocols}
	go f.srv.Serve(ln)
	for _, n := range f.nodes {
		n.registrar, err = cluster.StartRegistrar(ctx, cluster.RegistrarConfig{
			Etcd: cli,
			Record: cluster.NodeRecord{ID: n.ID, Address: f.addr + "/" + n.ID, Version: "simulated",
				Labels: n.Labels, Backends: []string{"container"}, Capacity: n.Capacity},
			LoadFunc: n.agent.Measure, Summary: n.agent.Summary, TTL: ttl, Interval: report, Logger: log,
		})
		if err != nil {
			f.Close(ctx)
			return nil, err
		}
	}
	return f, nil
}

// Nodes are the fleet's nodes.
func (f *Fleet) Nodes() []*Node { return f.nodes }

// Live is the number of sandboxes on the node.
func (n *Node) Live() int { return n.table.count() }

// LiveWith is the number of sandboxes on the node with label k=v.
func (n *Node) LiveWith(k, v string) int {
	n.table.mu.Lock()
	defer n.table.mu.Unlock()
	c := 0
	for _, sb := range n.table.sandboxes {
		if sb.Labels[k] == v {
			c++
		}
	}
	return c
}

// Created is how many creates the node admitted in all.
func (n *Node) Created() int {
	n.table.mu.Lock()
	defer n.table.mu.Unlock()
	return n.table.created
}

// Reset deletes every sandbox of the node.
func (n *Node) Reset(ctx context.Context) error {
	n.table.mu.Lock()
	n.table.sandboxes = map[string]*corralv1.Sandbox{}
	n.table.mu.Unlock()
	// The agent counts what it served since its last recount; without a
	// recount now the next reports would still carry the removed sandboxes.
	_, err := n.agent.Recount(ctx)
	return err
}

// Kill stops the node's registration without revoking its lease, as a
// crash would: it is lost when the lease expires.
func (n *Node) Kill() { n.registrar.Abandon() }

// Close stops every node (revoking their leases and forgetting them).
func (f *Fleet) Close(ctx context.Context) {
	for _, n := range f.nodes {
		if n.registrar != nil {
			_ = n.registrar.Stop(ctx, true)
		}
	}
	if f.srv != nil {
		f.srv.Close()
	}
	f.etcd.Close()
}

// errorCodes maps errdefs classes to Connect codes, as the real node does.
type errorCodes struct{}

func (errorCodes) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err != nil {
			if _, ok := err.(*connect.Error); !ok {
				code := connect.CodeInternal
				switch {
				case errdefs.IsResourceExhausted(err):
					code = connect.CodeResourceExhausted
				case errdefs.IsNotFound(err):
					code = connect.CodeNotFound
				case errdefs.IsInvalidArgument(err):
					code = connect.CodeInvalidArgument
				case errdefs.IsFailedPrecondition(err):
					code = connect.CodeFailedPrecondition
				case errdefs.IsPermissionDenied(err):
					code = connect.CodePermissionDenied
				}
				err = connect.NewError(code, err)
			}
		}
		return resp, err
	}
}
func (errorCodes) WrapStreamingClient(n connect.StreamingClientFunc) connect.StreamingClientFunc {
	return n
}
func (errorCodes) WrapStreamingHandler(n connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return n
}

// table is a simulated node's SandboxService: records only.
type table struct {
	corralv1connect.UnimplementedSandboxServiceHandler
	node    string
	latency time.Duration
	refuse  string

	mu        sync.Mutex
	sandboxes map[string]*corralv1.Sandbox
	created   int
}

func (t *table) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sandboxes)
}

func (t *table) Create(ctx context.Context, req *connect.Request[corralv1.CreateRequest]) (*connect.Response[corralv1.CreateResponse], error) {
	if t.refuse != "" {
		return nil, errdefs.ResourceExhausted("node admission: %s", t.refuse)
	}
	if t.latency > 0 {
		d := t.latency/2 + time.Duration(mrand.Int64N(int64(t.latency)+1))
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	m := req.Msg
	backend := m.Backend
	if backend == "" {
		backend = "container"
	}
	caller, _ := iam.FromContext(ctx) // the control instance's caller, as a real node scopes it
	sb := &corralv1.Sandbox{Id: t.node + "-" + hex.EncodeToString(b), NodeId: t.node, Backend: backend, Image: m.Image, Project: caller.Project,
		State: corralv1.SandboxState_SANDBOX_STATE_RUNNING, Resources: m.Resources, Labels: m.Labels, CreatedAt: timestamppb.Now()}
	t.mu.Lock()
	t.sandboxes[sb.Id] = sb
	t.created++
	t.mu.Unlock()
	return connect.NewResponse(&corralv1.CreateResponse{Sandbox: sb}), nil
}

func (t *table) Get(_ context.Context, req *connect.Request[corralv1.GetRequest]) (*connect.Response[corralv1.GetResponse], error) {
	t.mu.Lock()
	sb, ok := t.sandboxes[req.Msg.Id]
	t.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFound("sandbox %s: not found", req.Msg.Id)
	}
	return connect.NewResponse(&corralv1.GetResponse{Sandbox: sb}), nil
}

func (t *table) Delete(_ context.Context, req *connect.Request[corralv1.DeleteRequest]) (*connect.Response[corralv1.DeleteResponse], error) {
	t.mu.Lock()
	_, ok := t.sandboxes[req.Msg.Id]
	delete(t.sandboxes, req.Msg.Id)
	t.mu.Unlock()
	return connect.NewResponse(&corralv1.DeleteResponse{Existed: ok}), nil
}

func (t *table) List(_ context.Context, req *connect.Request[corralv1.ListRequest]) (*connect.Response[corralv1.ListResponse], error) {
	size := int(req.Msg.PageSize)
	if size == 0 {
		size = 100
	}
	t.mu.Lock()
	var ids []string
	for id, sb := range t.sandboxes {
		if id > req.Msg.PageToken && matches(sb, req.Msg.Labels) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	out := &corralv1.ListResponse{}
	for i, id := range ids {
		if i == size {
			out.NextPageToken = ids[i-1]
			break
		}
		out.Sandboxes = append(out.Sandboxes, t.sandboxes[id])
	}
	t.mu.Unlock()
	return connect.NewResponse(out), nil
}

func matches(sb *corralv1.Sandbox, labels map[string]string) bool {
	for k, v := range labels {
		if sb.Labels[k] != v {
			return false
		}
	}
	return true
}

// NodeID makes the id of simulated node i.
func NodeID(i int) string { return fmt.Sprintf("sim%03d", i) }
