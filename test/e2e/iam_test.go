package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// tcpAddr finds a free loopback port for a test server's TCP listener.
func tcpAddr(t *testing.T) string {
	t.Helper()
	for port := 17110; port < 17200; port++ {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			ln.Close()
			return ln.Addr().String()
		}
	}
	t.Fatal("no free port in 17110-17199")
	return ""
}

// startTCP starts a server with a TCP listener; its Client is the node
// administrator on the unix socket.
func startTCP(t *testing.T) (*testenv.Server, string) {
	addr := tcpAddr(t)
	srv := testenv.StartServer(t, func(c *server.Config) { c.Listen = addr })
	return srv, addr
}

// tokenClient makes a project token and a TCP client using it.
func tokenClient(t *testing.T, admin *client.Client, addr, project, role string) *client.Client {
	t.Helper()
	c, _ := tokenClientSecret(t, admin, addr, project, role)
	return c
}

func tokenClientSecret(t *testing.T, admin *client.Client, addr, project, role string) (*client.Client, string) {
	t.Helper()
	_, secret, err := admin.CreateToken(context.Background(), client.TokenOptions{Project: project, Role: role})
	if err != nil {
		t.Fatalf("token for %s: %v", project, err)
	}
	c, err := client.New(addr, client.WithToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, secret
}

// rawDelete calls Delete without the SDK, which reads NotFound as "already
// gone" (so that deletes stay idempotent for token holders).
func rawDelete(ctx context.Context, addr, secret, id string) error {
	c := corralv1connect.NewSandboxServiceClient(http.DefaultClient, "http://"+addr)
	req := connect.NewRequest(&corralv1.DeleteRequest{Id: id})
	req.Header().Set("Authorization", "Bearer "+secret)
	_, err := c.Delete(ctx, req)
	if connect.CodeOf(err) == connect.CodeNotFound {
		return &client.Error{Code: client.CodeNotFound, Message: err.Error()}
	}
	return err
}

func mustProject(t *testing.T, c *client.Client, path string, q client.Quota) {
	t.Helper()
	if _, err := c.CreateProject(context.Background(), path, q); err != nil {
		t.Fatalf("project %s: %v", path, err)
	}
}

// procedures lists every RPC of every corral.v1 service from the
// registered descriptors, so new RPCs are covered without editing this.
func procedures() map[string]protoreflect.MethodDescriptor {
	out := map[string]protoreflect.MethodDescriptor{}
	protoregistry.GlobalFiles.RangeFilesByPackage("corral.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				m := sd.Methods().Get(j)
				out[fmt.Sprintf("/%s/%s", sd.FullName(), m.Name())] = m
			}
		}
		return true
	})
	return out
}

// TestTCPRefusesEveryRPCWithoutAToken: every RPC of every service, with no
// token and with a forged one, is Unauthenticated on TCP; so is /metrics.
func TestTCPRefusesEveryRPCWithoutAToken(t *testing.T) {
	srv, addr := startTCP(t)
	procs := procedures()
	if len(procs) < 30 {
		t.Fatalf("only %d procedures found", len(procs))
	}
	ctx := context.Background()
	h2 := new(http.Protocols)
	h2.SetUnencryptedHTTP2(true)
	h2cClient := &http.Client{Transport: &http.Transport{Protocols: h2}}
	for _, header := range []string{"", "Bearer nope", "Bearer corral_000000000000_forged"} {
		for name, m := range procs {
			if strings.HasPrefix(name, "/corral.v1.ClusterService/") || strings.HasPrefix(name, "/corral.v1.MigrationService/") {
				// Served by a cluster's control instances (through the
				// guard) and nodes' cluster listeners (signed calls only),
				// never on a node's API: test/cluster.
				continue
			}
			c := connect.NewClient[emptypb.Empty, emptypb.Empty](http.DefaultClient, "http://"+addr+name)
			// Client and bidirectional streams go over HTTP/2 (cleartext).
			h2c := connect.NewClient[emptypb.Empty, emptypb.Empty](h2cClient, "http://"+addr+name)
			var err error
			switch {
			case m.IsStreamingServer() && !m.IsStreamingClient():
				req := connect.NewRequest(&emptypb.Empty{})
				if header != "" {
					req.Header().Set("Authorization", header)
				}
				var stream *connect.ServerStreamForClient[emptypb.Empty]
				stream, err = c.CallServerStream(ctx, req)
				if err == nil {
					for stream.Receive() {
						t.Errorf("%s: got a message without a valid token", name)
					}
					err = stream.Err()
					stream.Close()
				}
			case !m.IsStreamingServer() && !m.IsStreamingClient():
				req := connect.NewRequest(&emptypb.Empty{})
				if header != "" {
					req.Header().Set("Authorization", header)
				}
				_, err = c.CallUnary(ctx, req)
			case m.IsStreamingClient() && !m.IsStreamingServer():
				stream := h2c.CallClientStream(ctx)
				if header != "" {
					stream.RequestHeader().Set("Authorization", header)
				}
				_ = stream.Send(&emptypb.Empty{})
				_, err = stream.CloseAndReceive()
			default:
				stream := h2c.CallBidiStream(ctx)
				if header != "" {
					stream.RequestHeader().Set("Authorization", header)
				}
				_ = stream.Send(&emptypb.Empty{})
				_ = stream.CloseRequest()
				for {
					if _, rerr := stream.Receive(); rerr != nil {
						err = rerr
						break
					}
					t.Errorf("%s: got a message without a valid token", name)
				}
				_ = stream.CloseResponse()
			}
			if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("%s with Authorization %q: %v, want unauthenticated", name, header, err)
			}
		}
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: %d, want 401", resp.StatusCode)
	}
	// Nothing was made on the way.
	if sbs, err := srv.Client.List(ctx, client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Errorf("sandboxes after unauthenticated calls: %v %v", sbs, err)
	}
}

// TestReproductionFailsForAnUnprivilegedUser: the issue's reproduction,
// run as the host user nobody against the TCP listener, fails at its first
// line and reads no host file; with a project token it still fails (host
// paths are the node administrator's), and the unix socket is closed to it.
func TestReproductionFailsForAnUnprivilegedUser(t *testing.T) {
	srv, addr := startTCP(t)
	ctx := context.Background()
	// The test binaries live in a 0700 directory.
	bin := nobodyCorral(t)
	asNobody := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append([]string{"HOME=/nonexistent", "PATH=/usr/bin:/bin"}, env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// The content of a layer comes from the client: as nobody, it cannot
	// read /etc, and without a token the server would refuse the upload
	// anyway (TestTCPRefusesEveryRPCWithoutAToken).
	out, err := asNobody(nil, "--addr", addr, "layer", "create", "/etc", "--name", "stolen@1")
	if err == nil || !(strings.Contains(out, "unauthenticated") || strings.Contains(out, "permission denied")) {
		t.Errorf("layer create /etc as nobody over TCP: %v, %q; want a failure (unauthenticated, or the client may not read /etc)", err, out)
	}
	out, err = asNobody(nil, "--addr", "unix://"+filepath.Join(srv.Config.DataDir, "corral.sock"), "layer", "create", "/etc", "--name", "stolen@1")
	if err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("layer create /etc as nobody on the unix socket: %v, %q; want permission denied", err, out)
	}
	mustProject(t, srv.Client, "intruder", client.Quota{})
	_, secret, err := srv.Client.CreateToken(ctx, client.TokenOptions{Project: "intruder", Role: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	// With a token the upload is allowed, but the client, nobody, cannot
	// read what it would send; the node reads nothing for it (a node path
	// named over TCP is refused: TestNoHostPathsOverTCP).
	out, err = asNobody([]string{"CORRAL_TOKEN=" + secret}, "--addr", addr, "layer", "create", "/etc", "--name", "stolen@1")
	if err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("layer create /etc with a project admin token: %v, %q; want permission denied", err, out)
	}
	out, err = asNobody([]string{"CORRAL_TOKEN=" + secret}, "--addr", addr, "image", "import", "docker-archive:/etc/shadow", "--name", "loot@1")
	if err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("import of /etc/shadow with a token: %v, %q; want permission denied", err, out)
	}
	imgs, err := srv.Client.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range imgs.Layers {
		if strings.HasPrefix(l.Ref, "stolen") {
			t.Errorf("layer %s was made", l.Ref)
		}
	}
}

// TestProjectsCannotReachEachOther: project B's token gets NotFound for
// everything about project A's sandbox (as for a sandbox that does not
// exist); a viewer cannot create; a subproject does not see its parent's
// sandboxes, while the parent sees its subproject's.
func TestProjectsCannotReachEachOther(t *testing.T) {
	srv, addr := startTCP(t)
	ctx := context.Background()
	for _, p := range []string{"a", "b", "a/sub"} {
		mustProject(t, srv.Client, p, client.Quota{})
	}
	ca := tokenClient(t, srv.Client, addr, "a", "member")
	cb, sb64 := tokenClientSecret(t, srv.Client, addr, "b", "admin")
	cview := tokenClient(t, srv.Client, addr, "a", "viewer")
	csub, ssub := tokenClientSecret(t, srv.Client, addr, "a/sub", "member")
	sb := testenv.NewSandbox(t, ca, client.CreateOptions{})
	if out := testenv.Sh(t, sb, "echo secret > /tmp/f; cat /tmp/f"); out != "secret\n" {
		t.Fatalf("owner's exec: %q", out)
	}
	missing := ca.Sandbox(strings.Split(sb.ID(), "-")[0] + "-000000000000")
	for _, c := range []struct {
		who, secret string
		c           *client.Client
	}{{"project b", sb64, cb}, {"subproject a/sub", ssub, csub}} {
		for _, target := range []*client.Sandbox{c.c.Sandbox(sb.ID()), c.c.Sandbox(missing.ID())} {
			ops := map[string]error{}
			_, ops["get"] = target.Info(ctx)
			_, ops["run"] = target.Run(ctx, client.Command{Args: []string{"cat", "/tmp/f"}})
			_, ops["exec"] = target.Exec(ctx, client.Command{Args: []string{"cat", "/tmp/f"}})
			_, ops["read"] = target.Files().Read(ctx, "/tmp/f")
			ops["write"] = target.Files().Write(ctx, "/tmp/g", []byte("x"))
			_, ops["list dir"] = target.Files().List(ctx, "/tmp")
			_, ops["stat"] = target.Files().Stat(ctx, "/tmp/f")
			ops["pause"] = target.Pause(ctx)
			ops["resume"] = target.Resume(ctx)
			_, ops["net"] = target.NetworkStats(ctx)
			ops["delete"] = rawDelete(ctx, addr, c.secret, target.ID())
			for op, err := range ops {
				if !client.IsNotFound(err) {
					t.Errorf("%s: %s of %s: %v, want not found", c.who, op, target.ID(), err)
				}
			}
		}
		if sbs, err := c.c.List(ctx, client.ListOptions{}); err != nil || len(sbs) != 0 {
			t.Errorf("%s lists %d sandboxes (%v), want none", c.who, len(sbs), err)
		}
	}
	if info, err := sb.Info(ctx); err != nil || info.State != client.StateRunning {
		t.Errorf("a's sandbox after b's attempts: %+v %v", info, err)
	}
	// The viewer sees, but may not create or change.
	if _, err := cview.Sandbox(sb.ID()).Info(ctx); err != nil {
		t.Errorf("viewer get: %v", err)
	}
	if _, err := cview.Create(ctx, client.CreateOptions{}); !client.IsPermissionDenied(err) {
		t.Errorf("viewer create: %v, want permission denied", err)
	}
	if err := cview.Sandbox(sb.ID()).Pause(ctx); !client.IsPermissionDenied(err) {
		t.Errorf("viewer pause: %v, want permission denied", err)
	}
	// The parent sees its subproject's sandboxes.
	child := testenv.NewSandbox(t, csub, client.CreateOptions{})
	sbs, err := ca.List(ctx, client.ListOptions{})
	var ids []string
	for _, s := range sbs {
		ids = append(ids, s.ID)
	}
	if err != nil || !slices.Contains(ids, child.ID()) || !slices.Contains(ids, sb.ID()) {
		t.Errorf("a lists %v (%v), want its own and a/sub's", ids, err)
	}
	// Compositions of one project are invisible to another.
	if _, err := ca.CreateComposition(ctx, client.Composition{Ref: "a-env@1", Layers: []string{"busybox@1"}}); err != nil {
		t.Fatalf("a composes: %v", err)
	}
	if _, err := cb.Create(ctx, client.CreateOptions{Image: "a-env@1"}); !client.IsNotFound(err) {
		t.Errorf("b creates from a's composition: %v, want not found", err)
	}
	if imgs, err := cb.ListImages(ctx); err != nil {
		t.Error(err)
	} else {
		for _, c := range imgs.Compositions {
			if c.Ref == "a-env@1" {
				t.Errorf("b lists a's composition")
			}
		}
	}
	if _, err := cb.RemoveImage(ctx, "a-env@1"); !client.IsNotFound(err) {
		t.Errorf("b removes a's composition: %v, want not found", err)
	}
	// Shared explicitly, b may use it (not change it); unshared, it is gone again.
	if err := ca.ShareImage(ctx, "a-env", "b"); !client.IsPermissionDenied(err) {
		t.Errorf("a member shares: %v, want permission denied", err)
	}
	caAdmin := tokenClient(t, srv.Client, addr, "a", "admin")
	if err := caAdmin.ShareImage(ctx, "a-env", "b"); err != nil {
		t.Fatalf("share: %v", err)
	}
	testenv.NewSandbox(t, cb, client.CreateOptions{Image: "a-env@1"})
	if _, err := cb.CreateComposition(ctx, client.Composition{Ref: "a-env@2", Layers: []string{"busybox@1"}}); client.CodeOf(err) != client.CodeAlreadyExists {
		t.Errorf("b makes a version of a's shared name: %v, want already exists", err)
	}
	if err := caAdmin.UnshareImage(ctx, "a-env", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Create(ctx, client.CreateOptions{Image: "a-env@1"}); !client.IsNotFound(err) {
		t.Errorf("b creates from an unshared composition: %v, want not found", err)
	}
	testenv.NewSandbox(t, ca, client.CreateOptions{Image: "a-env@1"})
}

// TestQuotaAtEachLevel: a three-level tree, each level's max_sandboxes
// exhausted in turn by real creates; the refusal names the project, quota,
// limit and usage, and nothing is left half-made.
func TestQuotaAtEachLevel(t *testing.T) {
	srv, addr := startTCP(t)
	ctx := context.Background()
	mustProject(t, srv.Client, "top", client.Quota{MaxSandboxes: 4})
	ctop := tokenClient(t, srv.Client, addr, "top", "admin")
	if _, err := ctop.CreateProject(ctx, "top/mid", client.Quota{MaxSandboxes: 3}); err != nil {
		t.Fatal(err)
	}
	cmid := tokenClient(t, ctop, addr, "top/mid", "admin")
	if _, err := cmid.CreateProject(ctx, "top/mid/leaf", client.Quota{MaxSandboxes: 5}); !client.IsResourceExhausted(err) || !strings.Contains(err.Error(), "top/mid has 3 left") {
		t.Errorf("leaf asking more than mid has: %v", err)
	}
	if _, err := cmid.CreateProject(ctx, "top/mid/leaf", client.Quota{MaxSandboxes: 2}); err != nil {
		t.Fatal(err)
	}
	cleaf := tokenClient(t, cmid, addr, "top/mid/leaf", "member")
	create := func(c *client.Client) error {
		sb, err := c.Create(ctx, client.CreateOptions{})
		if err == nil {
			t.Cleanup(func() { _ = sb.Delete(context.Background()) })
		}
		return err
	}
	steps := []struct {
		c    *client.Client
		want string // "" succeeds
	}{
		{cleaf, ""}, {cleaf, ""},
		{cleaf, "project top/mid/leaf: quota max_sandboxes: limit 2, in use 2"},
		{cmid, ""},
		{cleaf, "project top/mid/leaf: quota max_sandboxes: limit 2, in use 2"},
		{cmid, "project top/mid: quota max_sandboxes: limit 3, in use 3"},
		{ctop, ""},
		{ctop, "project top: quota max_sandboxes: limit 4, in use 4"},
		{cmid, "project top/mid: quota max_sandboxes: limit 3, in use 3"},
	}
	for i, s := range steps {
		err := create(s.c)
		if s.want == "" && err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if s.want != "" && (!client.IsResourceExhausted(err) || !strings.Contains(err.Error(), s.want)) {
			t.Errorf("step %d: %v, want resource exhausted %q", i, err, s.want)
		}
	}
	p, err := ctop.GetProject(ctx, "top")
	if err != nil || p.Usage.Sandboxes != 4 {
		t.Errorf("top's usage: %+v %v, want 4 sandboxes", p, err)
	}
	if all, _ := srv.Client.List(ctx, client.ListOptions{}); len(all) != 4 {
		t.Errorf("%d sandboxes on the node, want 4 (refused creates leave nothing)", len(all))
	}
	// Deleting the middle project deletes its sandboxes and the leaf's.
	if err := ctop.DeleteProject(ctx, "top/mid", true); !client.IsFailedPrecondition(err) {
		t.Errorf("delete --keep of a project holding things: %v", err)
	}
	if err := ctop.DeleteProject(ctx, "top/mid", false); err != nil {
		t.Fatal(err)
	}
	if all, _ := srv.Client.List(ctx, client.ListOptions{}); len(all) != 1 {
		t.Errorf("%d sandboxes after deleting top/mid, want top's 1", len(all))
	}
	if _, err := cleaf.List(ctx, client.ListOptions{}); !client.IsUnauthenticated(err) {
		t.Errorf("a deleted project's token: %v, want unauthenticated", err)
	}
}

// TestRevokedAndExpiredTokensFailAtOnce: the first call after a revoke, or
// after the expiry time, fails: nothing caches a token.
func TestRevokedAndExpiredTokensFailAtOnce(t *testing.T) {
	srv, addr := startTCP(t)
	ctx := context.Background()
	mustProject(t, srv.Client, "p", client.Quota{})
	tok, secret, err := srv.Client.CreateToken(ctx, client.TokenOptions{Project: "p"})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := client.New(addr, client.WithToken(secret))
	defer c.Close()
	if _, err := c.WhoAmI(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WhoAmI(ctx); !client.IsUnauthenticated(err) || !strings.Contains(err.Error(), tok.ID) {
		t.Errorf("first call after revoke: %v, want unauthenticated naming %s", err, tok.ID)
	}
	// Long enough for the first call to come before expiry on a loaded host.
	tok, secret, err = srv.Client.CreateToken(ctx, client.TokenOptions{Project: "p", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := client.New(addr, client.WithToken(secret))
	defer c2.Close()
	if id, err := c2.WhoAmI(ctx); err != nil || id.Token.ExpiresAt.IsZero() {
		t.Fatalf("fresh expiring token: %+v %v", id, err)
	}
	time.Sleep(time.Until(tok.ExpiresAt))
	if _, err := c2.List(ctx, client.ListOptions{}); !client.IsUnauthenticated(err) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("first call after expiry: %v, want unauthenticated (expired)", err)
	}
}

// TestAuditSurvivesKill9: management requests are acknowledged only once
// their audit entry is on disk: after a SIGKILL in the middle of a stream
// of requests, every acknowledged one is in the log of the restarted
// daemon, with its principal, project and result; sandboxes keep their
// project across the restart.
func TestAuditSurvivesKill9(t *testing.T) {
	d := newDaemon(t)
	addr := tcpAddr(t)
	ctx := context.Background()
	admin := d.start("--listen", addr)
	mustProject(t, admin, "audited", client.Quota{})
	mustProject(t, admin, "other", client.Quota{})
	ca := tokenClient(t, admin, addr, "audited", "admin")
	cother := tokenClient(t, admin, addr, "other", "member")
	sb, err := ca.Create(ctx, client.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Run(ctx, client.Command{Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var acked []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				path := fmt.Sprintf("audited/w%d-%d", w, i)
				if _, err := ca.CreateProject(ctx, path, client.Quota{}); err != nil {
					return // the daemon is gone
				}
				mu.Lock()
				acked = append(acked, path)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	d.stop(syscall.SIGKILL)
	close(stop)
	wg.Wait()
	t.Logf("%d requests acknowledged before the SIGKILL", len(acked))
	if len(acked) < 5 {
		t.Fatalf("only %d requests acknowledged before the kill", len(acked))
	}
	admin = d.start("--listen", addr)
	entries, err := admin.Audit(ctx, client.AuditFilter{Project: "audited"})
	if err != nil {
		t.Fatal(err)
	}
	logged := map[string]client.AuditEntry{}
	for _, e := range entries {
		logged[e.Summary] = e
	}
	tok, _ := ca.WhoAmI(ctx)
	for _, path := range acked {
		e, ok := logged[fmt.Sprintf("path=%q", path)]
		if !ok {
			t.Errorf("acknowledged CreateProject %s is not in the audit log", path)
			continue
		}
		if e.Result != "ok" || e.Project != "audited" || e.TokenID != tok.Token.ID || !strings.HasSuffix(e.Procedure, "/CreateProject") {
			t.Errorf("entry of %s: %+v", path, e)
		}
	}
	var sawCreate, sawRun bool
	for _, e := range entries {
		sawCreate = sawCreate || (strings.HasSuffix(e.Procedure, "SandboxService/Create") && strings.Contains(e.Summary, sb.ID()))
		sawRun = sawRun || (strings.HasSuffix(e.Procedure, "SandboxService/Run") && strings.Contains(e.Summary, sb.ID()))
	}
	if !sawCreate || !sawRun {
		t.Errorf("audit log lacks the sandbox create (%v) or its exec (%v)", sawCreate, sawRun)
	}
	// Projects, tokens and the sandbox's project survived the crash.
	if _, err := ca.Sandbox(sb.ID()).Run(ctx, client.Command{Args: []string{"true"}}); err != nil {
		t.Errorf("owner's exec after restart: %v", err)
	}
	if info, err := admin.Get(ctx, sb.ID()); err != nil || info.Project != "audited" {
		t.Errorf("sandbox after restart: project %q (%v), want audited", info.Project, err)
	}
	if _, err := cother.Sandbox(sb.ID()).Info(ctx); !client.IsNotFound(err) {
		t.Errorf("other project's get after restart: %v, want not found", err)
	}
	// An admin follows the stream and sees a new entry arrive.
	fctx, cancel := context.WithCancel(ctx)
	got := make(chan client.AuditEntry, 1000)
	done := make(chan error, 1)
	go func() {
		done <- ca.FollowAudit(fctx, client.AuditFilter{Limit: 1}, func(e client.AuditEntry) error { got <- e; return nil })
	}()
	<-got
	if _, err := ca.CreateProject(ctx, "audited/followed", client.Quota{}); err != nil {
		t.Fatal(err)
	}
	for e := range got {
		if e.Summary == `path="audited/followed"` {
			break
		}
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("follow: %v", err)
	}

	d.stop(syscall.SIGTERM)
	d.start("--cleanup-on-exit")
	d.stopLeavingNothing()
}

// TestTLSListener: with --tls-cert/--tls-key the TCP API speaks TLS only.
func TestTLSListener(t *testing.T) {
	ca := testenv.NewCA(t, t.TempDir(), "tls")
	cert, key := ca.Issue("localhost", x509.ExtKeyUsageServerAuth)
	addr := tcpAddr(t)
	srv := testenv.StartServer(t, func(c *server.Config) { c.Listen, c.TLSCert, c.TLSKey = addr, cert, key })
	mustProject(t, srv.Client, "tls", client.Quota{})
	_, secret, err := srv.Client.CreateToken(context.Background(), client.TokenOptions{Project: "tls"})
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(testenv.Binaries(t), "corral")
	cmd := exec.Command(bin, "--addr", "https://"+addr, "whoami")
	cmd.Env = append(os.Environ(), "CORRAL_TOKEN="+secret, "CORRAL_CA_CERT="+ca.File)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if err := cmd.Run(); err != nil || !strings.Contains(stdout.String(), "project tls") {
		t.Errorf("whoami over TLS: %v %q", err, stdout.String())
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP on the TLS listener answered: %d %q", resp.StatusCode, body)
		}
	}
}

// TestConcurrentCreatesNeverPassAQuota: creates racing for the last slots
// of a quota (admitted under the node's lock, in-flight creates counted)
// never end above it; a calls/s quota refuses a burst of fncall calls.
func TestConcurrentCreatesNeverPassAQuota(t *testing.T) {
	srv, addr := startTCP(t)
	ctx := context.Background()
	mustProject(t, srv.Client, "race", client.Quota{MaxSandboxes: 3, CallsPerSec: 1})
	c := tokenClient(t, srv.Client, addr, "race", "member")
	made, refused := testenv.CreateRace(t, 8, func(int) (*client.Sandbox, error) { return c.Create(ctx, client.CreateOptions{}) })
	if len(made) != 3 || len(refused) != 5 {
		t.Errorf("8 concurrent creates under a quota of 3: %d made, %d refused", len(made), len(refused))
	}
	for _, err := range refused {
		if !strings.Contains(err.Error(), "project race: quota max_sandboxes: limit 3") {
			t.Errorf("refusal %q does not name the quota", err)
		}
	}
	// The bucket holds one second's worth: one call, never a batch of two.
	if _, err := c.Call(ctx, client.CallOptions{Args: []string{"true"}}); err != nil {
		t.Errorf("one call under 1 call/s: %v", err)
	}
	two := []client.CallOptions{{Args: []string{"true"}}, {Args: []string{"true"}}}
	if _, err := c.CallBatch(ctx, two); !client.IsResourceExhausted(err) || !strings.Contains(err.Error(), "project race: quota calls_per_sec: limit 1/s") {
		t.Errorf("a batch of two under 1 call/s: %v, want resource exhausted", err)
	}
}
