package redteam

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/probeproto"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestProbeFnCall makes the probe's in-sandbox attempts as one fncall: the
// probe travels as an input file of the call and runs in a pooled sandbox
// (chrooted view, reset after the call). Another sandbox holds a secret in
// its environment, a file and a running process, as in TestProbe.
func TestProbeFnCall(t *testing.T) {
	testenv.RequireRoot(t)
	srv, c := startServer(t)
	bin, err := os.ReadFile(probeBin)
	if err != nil {
		t.Fatal(err)
	}
	secretB := testenv.UniqueName("CANARY-SANDBOX-B") + testenv.UniqueName("")
	b := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Env: map[string]string{"B_SECRET": secretB}})
	testenv.Sh(t, b, "echo "+secretB+" > /root-secret; sleep 1000 >/dev/null 2>&1 &")
	stdin, _ := json.Marshal(probeproto.Input{
		Canaries: append(c.list(), secretB),
		Sockets:  hostSockets(srv),
		Pids:     hostPids(srv.Config.CgroupParent, b.ID()),
	})
	res, err := srv.Client.Call(context.Background(), client.CallOptions{
		// Input files are written 0644: make the probe executable first.
		Args:        []string{"/bin/sh", "-c", "chmod 755 /tmp/corral-probe && exec /tmp/corral-probe"},
		Files:       map[string][]byte{"/tmp/corral-probe": bin},
		Stdin:       stdin,
		WallTimeout: 2 * time.Minute,
		OutputLimit: 4 << 20,
	})
	if err != nil {
		t.Fatalf("fncall of the probe: %v", err)
	}
	if len(res.Stderr) > 0 {
		t.Logf("probe stderr: %s", res.Stderr)
	}
	results := parseProbeOutput(t, res.Stdout)
	if len(results) < 40 {
		t.Fatalf("probe reported %d results (verdict %s, exit %d): %s", len(results), res.Verdict, res.ExitCode, res.Stdout)
	}
	judge(t, "fncall", results)
}
