package node

import (
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

func testNode() *Node {
	return &Node{id: "nabc123", cfg: Config{
		Defaults: Defaults{}.withFallbacks(),
		Limits:   Limits{MaxCPUMillis: 2000, MaxMemoryBytes: 4 * gib}.withFallbacks(),
	}}
}

func TestAdmitFillsDefaults(t *testing.T) {
	rec, err := testNode().admit(CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Backend != "container" || rec.Image != "busybox" || rec.CPUMillis != 1000 ||
		rec.MemoryBytes != 512*mib || rec.IdleTimeout != 30*time.Minute || rec.MaxLifetime != 24*time.Hour {
		t.Errorf("defaults not applied: %+v", rec)
	}
	never := time.Duration(0)
	rec, err = testNode().admit(CreateRequest{IdleTimeout: &never})
	if err != nil || rec.IdleTimeout != 0 {
		t.Errorf("explicit idle_timeout 0 (never): %v %v", rec.IdleTimeout, err)
	}
}

func TestAdmitRejectsWithFieldAndLimit(t *testing.T) {
	neg := -time.Second
	zero := time.Duration(0)
	cases := []struct {
		req  CreateRequest
		want string
	}{
		{CreateRequest{Resources: Resources{CPUMillis: 3000}}, "resources.cpu_millis: 3000m is out of range (allowed 10m to 2000m)"},
		{CreateRequest{Resources: Resources{MemoryBytes: 5 * gib}}, "resources.memory_bytes: 5368709120 is out of range (allowed 16MiB to 4GiB)"},
		{CreateRequest{Resources: Resources{MemoryBytes: -1}}, "resources.memory_bytes"},
		{CreateRequest{Resources: Resources{Pids: 1}}, "resources.pids: 1 is out of range (allowed 16 to 32768)"},
		{CreateRequest{Env: []string{"NOEQUALS"}}, `env[0]: "NOEQUALS" is not KEY=VALUE`},
		{CreateRequest{Workdir: "rel"}, "workdir"},
		{CreateRequest{User: "bad user"}, "user"},
		{CreateRequest{Labels: map[string]string{"bad key": "v"}}, "labels: key"},
		{CreateRequest{IdleTimeout: &neg}, "idle_timeout: -1s is out of range"},
		{CreateRequest{MaxLifetime: &zero}, "max_lifetime: must be positive"},
		{CreateRequest{Image: "../etc"}, "image"},
	}
	for _, tc := range cases {
		_, err := testNode().admit(tc.req)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("admit(%+v) = %v, want invalid argument containing %q", tc.req, err, tc.want)
		}
	}
}

func TestPickBackend(t *testing.T) {
	n := testNode()
	if _, err := n.pickBackend("microvm"); !errdefs.IsNotSupported(err) {
		t.Errorf("known but absent backend: %v", err)
	}
	if _, err := n.pickBackend("docker"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unknown backend: %v", err)
	}
}

func TestExecSpec(t *testing.T) {
	n := testNode()
	rec, _ := n.admit(CreateRequest{Env: []string{"A=1", "B=2"}, Workdir: "/work"})
	spec, err := n.execSpec(rec, ExecRequest{Argv: []string{"echo hi"}, Shell: true, Env: []string{"B=3"}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(spec.Argv, "|") != "/bin/sh|-c|echo hi" || spec.Cwd != "/work" || spec.User != "0:0" {
		t.Errorf("spec = %+v", spec)
	}
	if strings.Join(spec.Env, ",") != "A=1,B=3" {
		t.Errorf("env merge = %v", spec.Env)
	}
	for _, bad := range []ExecRequest{
		{},
		{Argv: []string{"a", "b"}, Shell: true},
		{Argv: []string{"x\x00y"}},
		{Argv: []string{"true"}, Cwd: "tmp"},
		{Argv: []string{"true"}, OutputLimit: 1 << 40},
	} {
		if _, err := n.execSpec(rec, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("execSpec(%+v) = %v, want invalid argument", bad, err)
		}
	}
}

func TestPageTokens(t *testing.T) {
	key := "00000000000000000042/nabc123-0123456789ab"
	got, err := decodePageToken(encodePageToken(key))
	if err != nil || got != key {
		t.Errorf("round trip = %q, %v", got, err)
	}
	if _, err := decodePageToken("!!not-a-token"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("garbage token: %v", err)
	}
}

func TestIDs(t *testing.T) {
	n := testNode()
	id, err := n.newID()
	if err != nil || !strings.HasPrefix(id, "nabc123-") || len(id) != len("nabc123-")+12 {
		t.Fatalf("newID = %q, %v", id, err)
	}
	if nodeID, err := NodeOf(id); err != nil || nodeID != "nabc123" {
		t.Errorf("NodeOf(%s) = %q, %v", id, nodeID, err)
	}
	if err := n.checkID("nother-0123"); !errdefs.IsNotFound(err) {
		t.Errorf("other node's id: %v", err)
	}
	if _, err := NodeOf("nodash"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("malformed id: %v", err)
	}
}
