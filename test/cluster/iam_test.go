package cluster_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/corral-dev/corral/client"
)

// TestClusterIAM: the control plane authenticates like a single node. TCP
// without a token is refused; projects and tokens made through one
// control instance's socket (records in etcd) work through the other's
// TCP listener; a project's token cannot see another project's sandbox;
// a project's sandbox quota is enforced on creates through the control
// plane (one node, so the node's count is the project's).
func TestClusterIAM(t *testing.T) {
	r := startRig(t, false, 2, 1)
	ctx := context.Background()
	tcp1 := fmt.Sprintf("127.0.0.1:%d", controlBase+1)

	anon, err := client.New(tcp1)
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.List(ctx, client.ListOptions{}); !client.IsUnauthenticated(err) {
		t.Fatalf("list without a token over TCP: %v, want unauthenticated", err)
	}
	if _, err := anon.ClusterNodes(ctx); !client.IsUnauthenticated(err) {
		t.Fatalf("list nodes without a token over TCP: %v, want unauthenticated", err)
	}

	admin := r.cli[0] // control 0's socket
	if _, err := admin.CreateProject(ctx, "ta", client.Quota{MaxSandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateProject(ctx, "tb", client.Quota{}); err != nil {
		t.Fatal(err)
	}
	token := func(project string) *client.Client {
		_, secret, err := admin.CreateToken(ctx, client.TokenOptions{Project: project})
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(tcp1, client.WithToken(secret))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := token("ta"), token("tb")

	who, err := a.WhoAmI(ctx)
	if err != nil || who.Project != "ta" {
		t.Fatalf("whoami through control 1 with a token made on control 0: %+v, %v", who, err)
	}
	sb, err := a.Create(ctx, client.CreateOptions{Resources: small})
	if err != nil {
		t.Fatalf("create with project ta's token: %v", err)
	}
	id := sb.ID()
	if in, err := admin.Get(ctx, id); err != nil || in.Project != "ta" {
		t.Fatalf("sandbox made with ta's token: %+v, %v; want project ta", in, err)
	}
	run(t, a, id, "mine")

	if _, err := b.Get(ctx, id); !client.IsNotFound(err) {
		t.Fatalf("project tb gets ta's sandbox: %v, want not found", err)
	}
	if _, err := b.Sandbox(id).Run(ctx, client.Command{Args: []string{"true"}}); !client.IsNotFound(err) {
		t.Fatalf("project tb runs in ta's sandbox: %v, want not found", err)
	}
	if listed, err := b.List(ctx, client.ListOptions{}); err != nil || len(listed) != 0 {
		t.Fatalf("project tb lists %+v, %v; want none of ta's", listed, err)
	}

	if _, err := a.Create(ctx, client.CreateOptions{Resources: small}); !client.IsResourceExhausted(err) {
		t.Fatalf("second create over ta's max_sandboxes 1: %v, want resource exhausted", err)
	}
	if _, err := b.Create(ctx, client.CreateOptions{Resources: small}); err != nil {
		t.Fatalf("create in tb (no quota) after ta's refusal: %v", err)
	}

	// Usage summed over the nodes; the audit log (etcd) has ta's create,
	// made through control 1, read through control 0.
	if pr, err := admin.GetProject(ctx, "ta"); err != nil || pr.Usage.Sandboxes != 1 {
		t.Fatalf("project ta through control 0: %+v, %v; want 1 sandbox in use", pr, err)
	}
	entries, err := admin.Audit(ctx, client.AuditFilter{Project: "ta"})
	if err != nil {
		t.Fatal(err)
	}
	creates := 0
	for _, e := range entries {
		if e.Procedure == "/corral.v1.SandboxService/Create" && e.Project == "ta" {
			creates++
		}
	}
	if creates != 2 { // one made, one refused by the quota
		t.Fatalf("audit of project ta has %d creates, want 2: %+v", creates, entries)
	}

	// Draining is the cluster administrator's.
	nodes, err := a.ClusterNodes(ctx)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("list nodes with a token: %+v, %v", nodes, err)
	}
	if _, err := a.DrainNode(ctx, nodes[0].ID, false); !client.IsPermissionDenied(err) {
		t.Fatalf("drain with a member token: %v, want permission denied", err)
	}
}
