package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/seaweed"
	lazyblob "github.com/corral-dev/corral/internal/storage/lazy"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestLazyLayerFromSharedStore: node A makes a layer and publishes it to
// a real S3 store (SeaweedFS); node B, with its own data dir and an empty
// cache, learns only the layer's metadata, starts a sandbox on it and
// reads files byte for byte, fetching less than the blob. With the store
// stopped, a read of an unfetched file fails with EIO within the fetch
// timeout and the sandbox is reported degraded while others keep working;
// a restart of B serves the fetched files from its cache. Nothing is left
// behind: no mounts (the FUSE mount included), cgroups or processes.
func TestLazyLayerFromSharedStore(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	s3, err := seaweed.Start(ctx, t.TempDir(), "corral-e2e")
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			s3.Stop()
		}
	})
	const timeout = 2 * time.Second
	store := []string{"--blob-store", "s3://corral-e2e?endpoint=" + s3.Endpoint,
		"--blob-fetch-timeout", timeout.String(), "--cleanup-on-exit"}
	nodeA, nodeB := lazyNodes(t)
	a := nodeA.start(store...)

	// Eight 2 MiB random files: the blob is 16 MiB, 32 fetch chunks.
	files, want := map[string][]byte{}, map[string]string{}
	for i := range 8 {
		b := make([]byte, 2<<20+i*4099)
		rand.Read(b)
		name := fmt.Sprintf("f%d", i)
		files["data/"+name] = b
		sum := sha256.Sum256(b)
		want[name] = hex.EncodeToString(sum[:])
	}
	src := testenv.Tree(t, files)
	made, err := a.CreateLayer(ctx, src, "data@1")
	if err != nil {
		t.Fatal(err)
	}

	b := nodeB.start(store...)
	pulled, err := b.PullLayer(ctx, made.Digest, "")
	if err != nil {
		t.Fatal(err)
	}
	if pulled.Ref != "data@1" || pulled.Digest != made.Digest || pulled.BlobDigest != made.BlobDigest {
		t.Fatalf("pulled %+v, made %+v", pulled, made)
	}
	if _, err := os.Stat(filepath.Join(nodeB.dataDir, "images", "blobs", "sha256-"+strings.TrimPrefix(made.BlobDigest, "sha256:")+".blob")); !os.IsNotExist(err) {
		t.Fatalf("node B has the blob locally after a pull: %v", err)
	}
	if _, err := b.PullLayer(ctx, "sha256:"+strings.Repeat("0", 64), ""); !client.IsNotFound(err) {
		t.Errorf("pull of an unpublished layer: %v, want not found", err)
	}
	if _, err := b.CreateComposition(ctx, client.Composition{Ref: "env@1", Layers: []string{"busybox@1", "data@1"}}); err != nil {
		t.Fatal(err)
	}
	lazy := testenv.NewSandbox(t, b, client.CreateOptions{Image: "env@1"})
	other := testenv.NewSandbox(t, b, client.CreateOptions{})
	if got := sha256Of(t, lazy, "f0"); got != want["f0"] {
		t.Fatalf("f0 through the lazy layer: sha256 %s, want %s", got, want["f0"])
	}
	if got := sha256Of(t, lazy, "f1"); got != want["f1"] {
		t.Fatalf("f1 through the lazy layer: sha256 %s, want %s", got, want["f1"])
	}
	l := layerOn(t, b, "data@1")
	if l.Lazy == nil || l.Lazy.BytesFetched == 0 || l.Lazy.BytesFetched >= l.BlobSize || l.Lazy.ChunksPresent == 0 || l.Lazy.ChunksPresent >= l.Lazy.ChunksTotal {
		t.Fatalf("lazy figures after reading 2 of 8 files: %+v (blob %d bytes)", l.Lazy, l.BlobSize)
	}
	t.Logf("fetched %d of %d bytes, chunks %d/%d", l.Lazy.BytesFetched, l.BlobSize, l.Lazy.ChunksPresent, l.Lazy.ChunksTotal)
	info, err := lazy.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.LazyReads == nil || info.LazyReads.BytesRead < 4<<20 || info.LazyReads.BytesFetched == 0 || info.Degraded != "" {
		t.Errorf("sandbox figures: %+v degraded %q", info.LazyReads, info.Degraded)
	}
	if l := layerOn(t, a, "data@1"); l.Lazy != nil {
		t.Errorf("node A reads its own layer lazily: %+v", l.Lazy)
	}

	// The store goes away: an unfetched file fails, the fetched ones and
	// other sandboxes keep working.
	stopped = true
	s3.Stop()
	start := time.Now()
	res := testenv.Run(t, lazy, client.Command{Args: []string{"cat", "/data/f7"}, Timeout: time.Minute})
	took := time.Since(start)
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "Input/output error") {
		t.Fatalf("read with the store down: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	// Each of the lazy server's 3 attempts is bounded by the timeout.
	if took > 3*timeout+5*time.Second {
		t.Errorf("EIO after %v, want within the fetch timeout (%v per attempt)", took, timeout)
	}
	t.Logf("EIO after %v", took)
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := lazy.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Degraded != "" {
			if !strings.Contains(info.Degraded, "data@1") {
				t.Errorf("degraded reason %q does not name the layer", info.Degraded)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sandbox not reported degraded 10 s after a failed fetch")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if info, err := other.Info(ctx); err != nil || info.Degraded != "" {
		t.Errorf("sandbox without the layer: degraded %q (%v)", info.Degraded, err)
	}
	if out := testenv.Sh(t, other, "echo fine"); out != "fine\n" {
		t.Errorf("other sandbox: %q", out)
	}
	if got := sha256Of(t, lazy, "f0"); got != want["f0"] {
		t.Errorf("cached f0 with the store down: %s", got)
	}
	if l := layerOn(t, b, "data@1"); l.Lazy == nil || l.Lazy.Fault == "" {
		t.Errorf("layer figures do not show the fault: %+v", l.Lazy)
	}

	// A restart of B (store still down) serves the fetched files from its cache.
	lazyPid := lazyServerPid(t, nodeB.dataDir)
	nodeB.stop(syscall.SIGTERM)
	waitGone(t, lazyPid)
	b = nodeB.start(store...)
	again := testenv.NewSandbox(t, b, client.CreateOptions{Image: "env@1"})
	if got := sha256Of(t, again, "f1"); got != want["f1"] {
		t.Errorf("f1 after a restart with the store down: sha256 %s, want %s", got, want["f1"])
	}
	if l := layerOn(t, b, "data@1"); l.Lazy == nil || l.Lazy.ChunksPresent == 0 || l.Lazy.BytesFetched != 0 {
		t.Errorf("figures after the restart (cache kept, nothing fetched): %+v", l.Lazy)
	}

	lazyPid = lazyServerPid(t, nodeB.dataDir)
	nodeB.stop(syscall.SIGTERM)
	nodeA.stop(syscall.SIGTERM)
	waitGone(t, lazyPid)
	for _, d := range []*daemon{nodeA, nodeB} {
		testenv.AssertNoLeaks(t, d.dataDir, d.parent)
		testenv.RemoveCgroupParent(d.parent)
	}
}

// TestLazyLayerFromPeer: node B reads a layer node A made straight from
// A's --blob-listen (peer fetch with range requests, no shared store), and
// the lazy figures appear on B's /metrics.
func TestLazyLayerFromPeer(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peerAddr := ln.Addr().String()
	ln.Close()
	nodeA, nodeB := lazyNodes(t)
	a := nodeA.start("--blob-store", "dir:"+t.TempDir(), "--blob-listen", peerAddr, "--cleanup-on-exit")
	b := nodeB.start("--blob-store", "http://"+peerAddr, "--cleanup-on-exit")

	big := make([]byte, 6<<20)
	rand.Read(big)
	src := testenv.Tree(t, map[string][]byte{"data/big": big, "data/small": []byte("hello from A\n")})
	made, err := a.CreateLayer(ctx, src, "peer@1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.PullLayer(ctx, made.Digest, "from-a@1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateComposition(ctx, client.Composition{Ref: "env@1", Layers: []string{"busybox@1", "from-a@1"}}); err != nil {
		t.Fatal(err)
	}
	sb := testenv.NewSandbox(t, b, client.CreateOptions{Image: "env@1"})
	if out := testenv.Sh(t, sb, "cat /data/small"); out != "hello from A\n" {
		t.Errorf("small file from the peer: %q", out)
	}
	l := layerOn(t, b, "from-a@1")
	if l.Lazy == nil || l.Lazy.BytesFetched == 0 || l.Lazy.BytesFetched >= l.BlobSize {
		t.Errorf("after reading the small file only: %+v (blob %d bytes)", l.Lazy, l.BlobSize)
	}
	sum := sha256.Sum256(big)
	if got := sha256Of(t, sb, "big"); got != hex.EncodeToString(sum[:]) {
		t.Errorf("big file from the peer: sha256 %s", got)
	}

	// B's /metrics (on its API socket) has the blob's figures.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", filepath.Join(nodeB.dataDir, "corral.sock"))
	}}}
	resp, err := hc.Get("http://corral/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `corral_lazyblob_bytes_fetched_total{blob="`+made.BlobDigest+`"}`) {
		t.Errorf("metrics: %s\n%s", resp.Status, body)
	}

	// A crashed daemon's lazy blob server keeps serving its sandbox; the
	// next start reattaches to it.
	pid := lazyServerPid(t, nodeB.dataDir)
	nodeB.stop(syscall.SIGKILL)
	nodeB.start("--blob-store", "http://"+peerAddr, "--cleanup-on-exit")
	if again := lazyServerPid(t, nodeB.dataDir); again != pid {
		t.Errorf("lazy blob server after a daemon crash: pid %d, want the running %d", again, pid)
	}
	if got := sha256Of(t, sb, "big"); got != hex.EncodeToString(sum[:]) {
		t.Errorf("big file after a daemon crash: sha256 %s", got)
	}

	// The lazy blob server dies under a running daemon: the sandbox on the
	// lazy layer is degraded; the daemon still cleans up everything.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := sb.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info.Degraded, "lazy blob server") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox not degraded 10 s after its lazy blob server died: %q", info.Degraded)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The event stream says so too.
	ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	zero := uint64(0)
	var degraded client.Event
	for e, err := range b.Events(ectx, client.EventOptions{After: &zero, SandboxIDs: []string{sb.ID()}, Types: []string{client.EventDegraded}}) {
		if err != nil {
			t.Errorf("degraded event: %v", err)
		}
		degraded = e
		break
	}
	if !strings.Contains(degraded.Reason, "lazy blob server") {
		t.Errorf("degraded event: %+v", degraded)
	}

	nodeB.stop(syscall.SIGTERM)
	nodeA.stop(syscall.SIGTERM)
	for _, d := range []*daemon{nodeA, nodeB} {
		testenv.AssertNoLeaks(t, d.dataDir, d.parent)
		testenv.RemoveCgroupParent(d.parent)
	}
}

func sha256Of(t *testing.T, sb *client.Sandbox, name string) string {
	t.Helper()
	out := testenv.Sh(t, sb, "sha256sum /data/"+name)
	sum, _, _ := strings.Cut(out, " ")
	return sum
}

func layerOn(t *testing.T, c *client.Client, ref string) client.Layer {
	t.Helper()
	l, ok := findLayer(t, c, ref)
	if !ok {
		t.Fatalf("no layer %s", ref)
	}
	return l
}

// lazyServerPid asks a node's lazy blob server for its pid.
func lazyServerPid(t *testing.T, dataDir string) int {
	t.Helper()
	pid, err := lazyblob.Dial(filepath.Join(dataDir, "lazyblob", "lazyblob.sock")).Pid(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitGone fails unless process pid ends within 10 s.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("lazy blob server %d still running", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lazyNodes are two daemons for lazy layers. The detach of their
// leftovers is registered before the daemons' own cleanups, so it runs
// after them: a failed test leaves no mount or lazy blob server behind.
func lazyNodes(t *testing.T) (a, b *daemon) {
	t.Helper()
	a, b = newDaemon(t), newDaemon(t)
	t.Cleanup(func() {
		detachLeftovers(a.dataDir)
		detachLeftovers(b.dataDir)
	})
	return a, b
}

// detachLeftovers ends what a failed test left of a node: its layer
// mounts (deepest first), then its lazy blob server and FUSE mount.
func detachLeftovers(dataDir string) {
	mounts := testenv.MountsUnder(dataDir)
	for i := len(mounts) - 1; i >= 0; i-- {
		_ = syscall.Unmount(mounts[i], syscall.MNT_DETACH)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if pid, err := lazyblob.Dial(filepath.Join(dataDir, "lazyblob", "lazyblob.sock")).Pid(ctx); err == nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
