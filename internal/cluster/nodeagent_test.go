package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
)

// records is a node's SandboxService holding records only, counting the
// Lists the agent makes of it.
type records struct {
	corralv1connect.UnimplementedSandboxServiceHandler
	mu    sync.Mutex
	m     map[string]*corralv1.Sandbox
	n     int
	lists int
}

func (r *records) Create(_ context.Context, req *connect.Request[corralv1.CreateRequest]) (*connect.Response[corralv1.CreateResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	sb := &corralv1.Sandbox{Id: fmt.Sprintf("n1-%04d", r.n), Backend: "container", Labels: req.Msg.Labels, Resources: req.Msg.Resources,
		State: corralv1.SandboxState_SANDBOX_STATE_RUNNING}
	r.m[sb.Id] = sb
	return connect.NewResponse(&corralv1.CreateResponse{Sandbox: sb}), nil
}

func (r *records) Get(_ context.Context, req *connect.Request[corralv1.GetRequest]) (*connect.Response[corralv1.GetResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.m[req.Msg.Id]
	if !ok {
		return nil, errdefs.NotFound("sandbox %s", req.Msg.Id)
	}
	return connect.NewResponse(&corralv1.GetResponse{Sandbox: sb}), nil
}

func (r *records) Delete(_ context.Context, req *connect.Request[corralv1.DeleteRequest]) (*connect.Response[corralv1.DeleteResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.m[req.Msg.Id]
	delete(r.m, req.Msg.Id)
	return connect.NewResponse(&corralv1.DeleteResponse{Existed: ok}), nil
}

func (r *records) List(context.Context, *connect.Request[corralv1.ListRequest]) (*connect.Response[corralv1.ListResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lists++
	out := &corralv1.ListResponse{}
	for _, sb := range r.m {
		out.Sandboxes = append(out.Sandboxes, sb)
	}
	return connect.NewResponse(out), nil
}

func (r *records) listCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lists
}

// TestAgentLoadBetweenRecounts: the load the agent reports follows the
// creates and deletes it serves (resources, backends, labels) without
// listing the node's sandboxes; a retried request id is answered from its
// index; a sandbox deleted behind its back shows at the next recount.
func TestAgentLoadBetweenRecounts(t *testing.T) {
	ctx := context.Background()
	tbl := &records{m: map[string]*corralv1.Sandbox{}}
	a, err := NewNodeAgent(ctx, AgentConfig{Sandboxes: tbl, DefaultCPUMillis: 1000, DefaultMemoryBytes: 512 << 20, RecountInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	lists := tbl.listCount()
	var ids []string
	for i := range 3 {
		resp, err := a.Create(ctx, connect.NewRequest(&corralv1.CreateRequest{
			Labels:    map[string]string{"job": "j1"},
			Resources: &corralv1.Resources{CpuMillis: 100, MemoryBytes: 64 << 20},
			Placement: &corralv1.Placement{RequestId: fmt.Sprintf("rid-%d", i)},
		}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Msg.Sandbox.Id)
	}
	if _, err := a.Delete(ctx, connect.NewRequest(&corralv1.DeleteRequest{Id: ids[0]})); err != nil {
		t.Fatal(err)
	}
	l, err := a.Measure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Sandboxes != 2 || l.CPUMillis != 200 || l.MemoryBytes != 128<<20 || l.Backends["container"] != 2 || l.Labels["job=j1"] != 2 {
		t.Fatalf("load after 3 creates and a delete: %+v; want 2 sandboxes, 200 millis, 128 MiB, container 2, job=j1 2", l)
	}
	if _, ok := l.Labels[RequestIDLabel+"=rid-1"]; ok {
		t.Fatalf("load counts the request-id label: %v", l.Labels)
	}
	if got := tbl.listCount(); got != lists {
		t.Fatalf("Measure listed the node's sandboxes %d times before a recount was due", got-lists)
	}
	again, err := a.Create(ctx, connect.NewRequest(&corralv1.CreateRequest{Placement: &corralv1.Placement{RequestId: "rid-2"}}))
	if err != nil || again.Msg.Sandbox.Id != ids[2] {
		t.Fatalf("retried request id: %v, %v; want sandbox %s", again, err, ids[2])
	}

	// Deleted on the node's own socket: the agent learns it by recounting.
	if _, err := tbl.Delete(ctx, connect.NewRequest(&corralv1.DeleteRequest{Id: ids[1]})); err != nil {
		t.Fatal(err)
	}
	if l, _ := a.Measure(ctx); l.Sandboxes != 2 {
		t.Fatalf("before the recount: %d sandboxes; want the 2 the agent knows of", l.Sandboxes)
	}
	a.cfg.RecountInterval = time.Nanosecond
	l, err = a.Measure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Sandboxes != 1 || l.Labels["job=j1"] != 1 || tbl.listCount() == lists {
		t.Fatalf("after the recount: %+v; want 1 sandbox, job=j1 1, and a List made", l)
	}
}

// recordForks is a node's RolloutService over records: a fork is a copy
// of the parent's record.
type recordForks struct {
	corralv1connect.UnimplementedRolloutServiceHandler
	r *records
}

func (f recordForks) Fork(ctx context.Context, req *connect.Request[corralv1.ForkRequest]) (*connect.Response[corralv1.ForkResponse], error) {
	got, err := f.r.Get(ctx, connect.NewRequest(&corralv1.GetRequest{Id: req.Msg.SandboxId}))
	if err != nil {
		return nil, err
	}
	out := &corralv1.ForkResponse{Image: "fork@1"}
	for range req.Msg.Count {
		p := got.Msg.Sandbox
		made, err := f.r.Create(ctx, connect.NewRequest(&corralv1.CreateRequest{Labels: p.Labels, Resources: p.Resources}))
		if err != nil {
			return nil, err
		}
		out.Forks = append(out.Forks, &corralv1.ForkOutcome{Sandbox: made.Msg.Sandbox})
	}
	return connect.NewResponse(out), nil
}

// TestAgentAdmitsForks: forks through the node's edge are admitted
// against its capacity like creates (the rest fail one by one naming what
// ran out, none admitted fails the call) and count in its load at once.
func TestAgentAdmitsForks(t *testing.T) {
	ctx := context.Background()
	tbl := &records{m: map[string]*corralv1.Sandbox{}}
	a, err := NewNodeAgent(ctx, AgentConfig{Sandboxes: tbl, Capacity: Capacity{Sandboxes: 3}, DefaultCPUMillis: 1000, DefaultMemoryBytes: 512 << 20, RecountInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	parent, err := a.Create(ctx, connect.NewRequest(&corralv1.CreateRequest{Labels: map[string]string{"job": "j1"},
		Resources: &corralv1.Resources{CpuMillis: 100, MemoryBytes: 64 << 20}}))
	if err != nil {
		t.Fatal(err)
	}
	r := agentRollouts{RolloutServiceHandler: recordForks{r: tbl}, a: a}
	id := parent.Msg.Sandbox.Id
	resp, err := r.Fork(ctx, connect.NewRequest(&corralv1.ForkRequest{SandboxId: id, Count: 4}))
	if err != nil || len(resp.Msg.Forks) != 4 {
		t.Fatalf("fork × 4 with room for 2: %v, %v", resp, err)
	}
	for i, f := range resp.Msg.Forks {
		if made := f.Sandbox != nil; made != (i < 2) || (!made && !strings.Contains(f.Error, "node admission: sandboxes")) {
			t.Fatalf("fork %d: %+v; want the first 2 made, the others refused naming sandboxes", i, f)
		}
	}
	l, _ := a.Measure(ctx)
	if l.Sandboxes != 3 || l.CPUMillis != 300 || l.Labels["job=j1"] != 3 {
		t.Fatalf("load after the forks: %+v; want 3 sandboxes, 300 millis, job=j1 3", l)
	}
	if _, err := r.Fork(ctx, connect.NewRequest(&corralv1.ForkRequest{SandboxId: id, Count: 1})); connect.CodeOf(err) != connect.CodeResourceExhausted && !errdefs.IsResourceExhausted(err) {
		t.Fatalf("fork on a full node: %v; want resource exhausted", err)
	}
	if len(tbl.m) != 3 {
		t.Fatalf("%d sandboxes on the node; want 3", len(tbl.m))
	}
}
