package redteam

import (
	"context"
	"encoding/json"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/probeproto"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestProbe runs every in-sandbox attempt: the probe in sandbox A, while
// sandbox B (same image) holds a secret in its environment, a file and a
// running process, and its host pids are handed to the probe.
func TestProbe(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		srv, c := startServer(t)
		img := image(t, srv)
		secretB := testenv.UniqueName("CANARY-SANDBOX-B") + testenv.UniqueName("")
		a := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend, Image: img})
		b := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend, Image: img, Env: map[string]string{"B_SECRET": secretB}})
		testenv.Sh(t, b, "echo "+secretB+" > /root-secret; sleep 1000 >/dev/null 2>&1 &")
		installProbe(t, a)

		in := probeproto.Input{
			Canaries: append(c.list(), secretB),
			Sockets:  hostSockets(srv),
			Pids:     hostPids(srv.Config.CgroupParent, b.ID()),
		}
		stdin, _ := json.Marshal(in)
		results := runProbe(t, a, stdin)
		if len(results) < 40 {
			t.Fatalf("probe reported %d results, want every attempt: %+v", len(results), results)
		}
		judge(t, backend, results)

		overwriteAndCheck(t, backend, srv, img, a, b)
		after := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend})
		res := testenv.Run(t, after, client.Command{Shell: "dd if=/dev/zero of=/after bs=1M count=4 2>&1 && sync && stat -c %s /after"})
		judge(t, backend, []Result{check("ioctl/no-host-fs-shutdown", res.ExitCode == 0 && strings.HasSuffix(trim(res.Stdout), strconv.Itoa(4<<20)),
			"a new sandbox writes and syncs 4 MiB after the ioctls: exit %d %q", res.ExitCode, res.Stdout)})
	})
}

// hostSockets are the node's socket paths on the host: the API socket and
// whatever sockets live in its data dir (init control sockets).
func hostSockets(srv *testenv.Server) []string {
	socks := []string{strings.TrimPrefix(srv.Addr, "unix://")}
	_ = filepath.WalkDir(srv.Config.DataDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSocket != 0 && !containsName(socks, p) {
			socks = append(socks, p)
		}
		return nil
	})
	return socks
}

// hostPids are the host pids of a sandbox's processes.
func hostPids(cgroupParent, id string) []int {
	var pids []int
	for _, p := range sandboxPids(cgroupParent, id) {
		pids = append(pids, p.pid)
	}
	return pids
}

// overwriteAndCheck replaces the shells and python of sandbox A with the
// probe and writes into a shared layer, then checks the node's next argv
// exec, a shell exec, and that B and a new sandbox see the original bytes.
func overwriteAndCheck(t *testing.T, backend string, srv *testenv.Server, img string, a, b *client.Sandbox) {
	const digest = "for f in /bin/sh /bin/bash /usr/bin/python3 /bin/busybox; do [ -e $f ] && md5sum $f; done; ls /usr/lib/corral-probe-shared-layer 2>&1; true"
	before := testenv.Sh(t, b, digest)
	judge(t, backend, runProbe(t, a, nil, "overwrite"))

	// The node's next exec with argv: runs exactly what was asked.
	res := testenv.Run(t, a, client.Command{Args: []string{"/corral-probe/corral-probe", "noop"}})
	ok := res.ExitCode == 0 && !strings.Contains(string(res.Stdout), "HIJACKED")
	res2 := testenv.Run(t, a, client.Command{Args: []string{"env"}})
	ok = ok && res2.ExitCode == 0 && !strings.Contains(string(res2.Stdout), "HIJACKED")
	judge(t, backend, []Result{check("overwrite/next-argv-exec", ok, "argv exec after the overwrite: %q %q", res.Stdout, trim(res2.Stdout))})
	// A shell exec: the node runs "sh -c" from the sandbox's own root.
	res = testenv.Run(t, a, client.Command{Shell: "echo shell-ok"})
	judge(t, backend, []Result{check("overwrite/next-shell-exec", trim(res.Stdout) == "shell-ok",
		"Shell exec after /bin/sh was replaced: exit %d stdout %q", res.ExitCode, res.Stdout)})

	during := testenv.Sh(t, b, digest)
	c := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend, Image: img})
	fresh := testenv.Sh(t, c, digest)
	judge(t, backend, []Result{
		check("overwrite/other-sandbox-digest", during == before && fresh == before,
			"digests in B before %q, while A is hijacked %q, in a new sandbox %q", before, during, fresh),
		check("shared-layer/other-sandbox", !strings.Contains(during, "corral-probe-shared-layer\n") && !strings.Contains(fresh, "corral-probe-shared-layer\n"),
			"B: %q new: %q", during, fresh),
	})
}

// TestKill runs `kill -9 -1` and `kill 1` in a sandbox with a background
// process, beside another sandbox: only the first sandbox's processes die,
// the node marks or keeps it, the other keeps serving.
func TestKill(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		srv, _ := startServer(t)
		k := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend})
		other := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: backend})
		testenv.Sh(t, k, "sleep 1000 >/dev/null 2>&1 &")
		testenv.Sh(t, other, "sleep 1000 >/dev/null 2>&1 &")
		installProbe(t, k)
		judge(t, backend, runProbe(t, k, nil, "kill"))

		ctx := context.Background()
		var state string
		var killedOwn bool
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			info, err := k.Info(ctx)
			if err != nil {
				state = "get: " + err.Error()
				break
			}
			if info.State != client.StateRunning {
				state = string(info.State) + " (" + info.StopReason + ")"
				killedOwn = true
				break
			}
			res, err := k.Run(ctx, client.Command{Shell: "ps -o comm | grep -c sleep"})
			if err == nil && trim(res.Stdout) == "0" {
				state, killedOwn = "running, own processes gone", true
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		out := testenv.Sh(t, other, "ps -o comm | grep -c sleep; echo alive")
		_, listErr := srv.Client.List(ctx, client.ListOptions{})
		judge(t, backend, []Result{
			check("kill/own-processes-only", killedOwn, "sandbox after the kills: %s", state),
			check("kill/others-unaffected", out == "1\nalive\n", "other sandbox: %q", out),
			check("kill/node-responsive", listErr == nil, "List: %v", listErr),
		})
		t.Logf("sandbox after kill -9 -1 and kill 1: %s", state)
	})
}
