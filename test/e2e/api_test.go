package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

func TestBadInputsGetClearErrors(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	c := srv.Client
	huge := int64(1) << 50
	// A backend corral knows that this node does not run (which one
	// depends on the host: microvm needs its agent beside the test, vm qemu).
	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes: %v %v", nodes, err)
	}
	absent := ""
	for _, b := range []string{"microvm", "vm"} {
		if !slices.Contains(nodes[0].Backends, b) {
			absent = b
			break
		}
	}
	cases := []struct {
		name    string
		opts    client.CreateOptions
		code    client.Code
		mention string
	}{
		{"unknown backend", client.CreateOptions{Backend: "docker"}, client.CodeInvalidArgument, "backend"},
		{"negative memory", client.CreateOptions{Resources: client.Resources{MemoryBytes: -1}}, client.CodeInvalidArgument, "memory_bytes"},
		{"huge memory", client.CreateOptions{Resources: client.Resources{MemoryBytes: huge}}, client.CodeInvalidArgument, "memory_bytes"},
		{"negative cpu", client.CreateOptions{Resources: client.Resources{CPUMillis: -5}}, client.CodeInvalidArgument, "cpu_millis"},
		{"huge cpu", client.CreateOptions{Resources: client.Resources{CPUMillis: 1 << 40}}, client.CodeInvalidArgument, "cpu_millis"},
		{"huge pids", client.CreateOptions{Resources: client.Resources{Pids: 1 << 40}}, client.CodeInvalidArgument, "pids"},
		{"huge disk", client.CreateOptions{Resources: client.Resources{DiskBytes: huge}}, client.CodeInvalidArgument, "disk_bytes"},
		{"unknown image", client.CreateOptions{Image: "nosuchimage"}, client.CodeNotFound, "nosuchimage"},
		{"relative workdir", client.CreateOptions{Workdir: "tmp"}, client.CodeInvalidArgument, "workdir"},
		{"bad env", client.CreateOptions{Env: map[string]string{"": "x"}}, client.CodeInvalidArgument, "env"},
	}
	if absent != "" {
		cases = append(cases, struct {
			name    string
			opts    client.CreateOptions
			code    client.Code
			mention string
		}{"backend not here", client.CreateOptions{Backend: absent}, client.CodeUnimplemented, absent})
	} else {
		t.Logf("this node runs every known backend (%v): no backend-not-here case to try", nodes[0].Backends)
	}
	for _, tc := range cases {
		_, err := c.Create(ctx, tc.opts)
		if client.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("%s: err = %v, want %s mentioning %q", tc.name, err, tc.code, tc.mention)
		}
	}
	sbs, err := c.List(ctx, client.ListOptions{})
	if err != nil || len(sbs) != 0 {
		t.Errorf("failed creates left sandboxes: %v %v", sbs, err)
	}

	sb := testenv.NewSandbox(t, c, client.CreateOptions{})
	execCases := []struct {
		name    string
		cmd     client.Command
		code    client.Code
		mention string
	}{
		{"empty argv", client.Command{}, client.CodeInvalidArgument, "argv"},
		{"empty argv[0]", client.Command{Args: []string{""}}, client.CodeInvalidArgument, "argv"},
		{"huge argv", client.Command{Args: []string{"echo", strings.Repeat("a", 2<<20)}}, client.CodeInvalidArgument, "argv"},
		{"relative cwd", client.Command{Args: []string{"true"}, Dir: "tmp"}, client.CodeInvalidArgument, "cwd"},
		{"negative timeout", client.Command{Args: []string{"true"}, Timeout: -time.Second}, client.CodeInvalidArgument, "timeout"},
		{"huge output limit", client.Command{Args: []string{"true"}, OutputLimit: 1 << 40}, client.CodeInvalidArgument, "output_limit"},
		{"missing program", client.Command{Args: []string{"/no/such/program"}}, client.CodeNotFound, "/no/such/program"},
	}
	for _, tc := range execCases {
		_, err := sb.Run(ctx, tc.cmd)
		if client.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("%s: err = %v, want %s mentioning %q", tc.name, err, tc.code, tc.mention)
		}
	}
	if _, err := c.Get(ctx, "not-an-id"); client.CodeOf(err) != client.CodeNotFound && client.CodeOf(err) != client.CodeInvalidArgument {
		t.Errorf("get bad id: %v", err)
	}
	if _, err := c.Get(ctx, srv.NodeID()+"-000000000000"); !client.IsNotFound(err) {
		t.Errorf("get missing sandbox: %v", err)
	}
	if err := c.Delete(ctx, srv.NodeID()+"-000000000000"); err != nil {
		t.Errorf("delete of a missing sandbox must succeed: %v", err)
	}
}

func TestFilesStayInsideTheSandbox(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	f := sb.Files()

	// A canary on the host that no file call may read, change or delete.
	canaryDir := t.TempDir()
	canary := filepath.Join(canaryDir, "canary")
	if err := os.WriteFile(canary, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	escapes := []string{
		"/../../../../../../.." + canary,
		"../../../../../../.." + canary,
		"/escape" + canary,
		"/up/../../../../../.." + canary,
	}
	testenv.Sh(t, sb, "ln -s / /escape; ln -s ../../../../../../../../ /up")
	for _, p := range escapes {
		if data, err := f.Read(ctx, p); err == nil && bytes.Contains(data, []byte("host secret")) {
			t.Errorf("read %s returned the host canary", p)
		}
		_ = f.Write(ctx, p, []byte("overwritten"))
		_ = f.Remove(ctx, p, true)
	}
	if data, err := os.ReadFile(canary); err != nil || string(data) != "host secret" {
		t.Fatalf("host canary changed: %q %v", data, err)
	}
	if _, err := f.Read(ctx, "../../etc/shadow"); err != nil && !client.IsNotFound(err) && !client.IsInvalidArgument(err) {
		t.Errorf("traversal read: unexpected error class %v", err)
	}

	// Round trip of a large file, streamed both ways.
	big := make([]byte, 9<<20+123)
	_, _ = rand.Read(big)
	if _, err := f.WriteFrom(ctx, "/data/deep/big.bin", bytes.NewReader(big), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := f.Read(ctx, "/data/deep/big.bin")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big file round trip: %d bytes, err %v", len(got), err)
	}
	if out := testenv.Sh(t, sb, "md5sum < /data/deep/big.bin | cut -c1-32; stat -c %a /data/deep/big.bin"); !strings.HasSuffix(out, "600\n") {
		t.Errorf("inside view of the written file: %q", out)
	}
	st, err := f.Stat(ctx, "/data/deep/big.bin")
	if err != nil || st.Size != int64(len(big)) || st.IsDir {
		t.Errorf("stat = %+v, %v", st, err)
	}
	if err := f.MakeDir(ctx, "/data/a/b/c", true); err != nil {
		t.Fatal(err)
	}
	entries, err := f.List(ctx, "/data")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	if fmt.Sprint(names) != "[a deep]" {
		t.Errorf("list /data = %v", names)
	}
	if err := f.Remove(ctx, "/data", false); err == nil {
		t.Errorf("non-recursive remove of a full dir succeeded")
	}
	if err := f.Remove(ctx, "/data", true); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stat(ctx, "/data"); !client.IsNotFound(err) {
		t.Errorf("stat after remove: %v", err)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	c := srv.Client
	for i := range 5 {
		testenv.NewSandbox(t, c, client.CreateOptions{Labels: map[string]string{"job": "a", "n": fmt.Sprint(i)}})
	}
	other := testenv.NewSandbox(t, c, client.CreateOptions{Labels: map[string]string{"job": "b"}})
	all, err := c.List(ctx, client.ListOptions{Labels: map[string]string{"job": "a"}, PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 5 {
		t.Fatalf("job=a: %d sandboxes, want 5", len(all))
	}
	for i, info := range all {
		if info.Labels["n"] != fmt.Sprint(i) {
			t.Errorf("page order: entry %d has n=%s", i, info.Labels["n"])
		}
	}
	if err := other.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	paused, err := c.List(ctx, client.ListOptions{State: client.StatePaused})
	if err != nil || len(paused) != 1 || paused[0].ID != other.ID() {
		t.Errorf("paused filter: %v %v", paused, err)
	}
}

func TestIdleTimeoutStopsSandbox(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	idle := time.Second
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{IdleTimeout: &idle})
	waitStopped(t, sb, "idle_timeout")
	_, err := sb.Run(ctx, client.Command{Args: []string{"true"}})
	if !client.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("exec on a stopped sandbox: %v", err)
	}
	if procs := testenv.SandboxProcesses(srv.Config.CgroupParent); len(procs) != 0 {
		t.Errorf("stopped sandbox still has processes %v", procs)
	}
}

func TestDeleteLeavesNothing(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	var sbs []*client.Sandbox
	for range 4 {
		sb, err := srv.Client.Create(ctx, client.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		testenv.Sh(t, sb, "sleep 1000 >/dev/null 2>&1 & echo x > /tmp/x")
		sbs = append(sbs, sb)
	}
	if err := sbs[0].Pause(ctx); err != nil {
		t.Fatal(err)
	}
	netns := testenv.NetNamespaces(testenv.SandboxProcesses(srv.Config.CgroupParent))
	if len(netns) != len(sbs) {
		t.Fatalf("%d sandboxes live in %d network namespaces, want one each", len(sbs), len(netns))
	}
	for _, sb := range sbs {
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sb.Delete(ctx); err != nil {
			t.Errorf("second delete: %v", err)
		}
	}
	left, err := srv.Client.List(ctx, client.ListOptions{})
	if err != nil || len(left) != 0 {
		t.Errorf("list after delete: %v %v", left, err)
	}
	if procs := testenv.SandboxProcesses(srv.Config.CgroupParent); len(procs) != 0 {
		t.Errorf("processes left: %v", procs)
	}
	if holders := testenv.NamespaceHolders(netns); len(holders) != 0 {
		t.Errorf("network namespaces of deleted sandboxes still held: %v", holders)
	}
	for _, dir := range testenv.CgroupDirs(srv.Config.CgroupParent) {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				t.Errorf("cgroup left: %s/%s", dir, e.Name())
			}
		}
	}
	for _, sb := range sbs {
		if m := findUnder(srv.Config.DataDir, sb.ID()); len(m) > 0 {
			t.Errorf("files left for %s: %v", sb.ID(), m)
		}
	}
}

func TestMaxLifetimeStopsABusySandbox(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	never, lifetime := time.Duration(0), 2*time.Second
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{IdleTimeout: &never, MaxLifetime: &lifetime})
	// A command still running at the deadline does not keep it alive.
	res, err := sb.Run(ctx, client.Command{Args: []string{"sleep", "30"}})
	if err == nil && !res.TimedOut && res.Signal == 0 {
		t.Errorf("sleep 30 finished normally past a 2s lifetime: %+v", res)
	}
	waitStopped(t, sb, "max_lifetime")
}

// waitStopped waits (up to 30 s: the TTLs under test are 1–2 s) until the
// reaper has stopped sb, and checks the reason names the TTL.
func waitStopped(t *testing.T, sb *client.Sandbox, reason string) {
	t.Helper()
	waitStoppedWithin(t, sb, reason, 30*time.Second)
}

// waitStoppedWithin is waitStopped with another bound (microVMs boot slowly
// under TCG).
func waitStoppedWithin(t *testing.T, sb *client.Sandbox, reason string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		info, err := sb.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.State == client.StateStopped {
			if !strings.Contains(info.StopReason, reason) {
				t.Errorf("stop reason = %q, want one naming %s", info.StopReason, reason)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s %v later, waiting for its %s", info.State, within, reason)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
