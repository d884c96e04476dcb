package e2e

import (
	"context"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// testPKI writes a test CA's certificate, and a server certificate for
// name signed by it with its key, into dir.
func testPKI(t *testing.T, dir, name string) (caFile, certFile, keyFile string) {
	t.Helper()
	ca := testenv.NewCA(t, dir, "test")
	certFile, keyFile = ca.Issue(name, x509.ExtKeyUsageServerAuth)
	return ca.File, certFile, keyFile
}

// assertBundleTrusted: check (tlscheck of the server certificate, run
// with extra environment) verifies with the node's CA bundle and fails
// without it: it is the bundle that makes the certificate trusted.
func assertBundleTrusted(t *testing.T, what string, check func(env map[string]string) string) {
	t.Helper()
	if out := check(nil); out != "verified" {
		t.Errorf("%s with the node's CA: %s", what, out)
	}
	if out := check(map[string]string{"SSL_CERT_FILE": "/nonexistent", "SSL_CERT_DIR": "/nonexistent"}); !strings.Contains(out, "unknown authority") {
		t.Errorf("%s without the bundle: %s", what, out)
	}
}

// upload writes each host file of files (host path → sandbox path) into sb,
// mode 0755.
func upload(t *testing.T, ctx context.Context, sb *client.Sandbox, files map[string]string) {
	t.Helper()
	for local, remote := range files {
		f, err := os.Open(local)
		if err != nil {
			t.Fatal(err)
		}
		_, err = sb.Files().WriteFrom(ctx, remote, f, 0o755)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// buildTLSCheck builds testdata/tlscheck, static, into dir.
func buildTLSCheck(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "tlscheck")
	build := exec.Command("go", "build", "-ldflags=-s -w", "-o", bin, "./testdata/tlscheck")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build tlscheck: %v\n%s", err, out)
	}
	return bin
}

// TestSandboxCACerts: with --sandbox-ca-certs, a program in a sandbox that
// trusts only the system's roots verifies a server certificate signed by
// the node's extra CA (here a TLS server on the sandbox's own loopback,
// as a TLS-intercepting proxy would present); the bundle is the image's
// trust store followed by the node's certificates, named by SSL_CERT_FILE.
func TestSandboxCACerts(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	caFile, certFile, keyFile := testPKI(t, dir, "registry.test")
	bin := buildTLSCheck(t, dir)
	srv := testenv.StartServer(t, func(c *server.Config) { c.SandboxCACerts = caFile })
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	ctx := context.Background()
	upload(t, ctx, sb, map[string]string{bin: "/tmp/tlscheck", certFile: "/tmp/server.pem", keyFile: "/tmp/server.key"})
	check := func(env map[string]string) string {
		res := testenv.Run(t, sb, client.Command{Args: []string{"/tmp/tlscheck", "/tmp/server.pem", "/tmp/server.key", "registry.test"}, Env: env})
		return strings.TrimSpace(string(res.Stdout) + string(res.Stderr))
	}
	assertBundleTrusted(t, "a sandbox", check)
	ca, _ := os.ReadFile(caFile)
	got := testenv.Sh(t, sb, "echo $SSL_CERT_FILE; cat /etc/ssl/certs/ca-certificates.crt; stat -c '%U %a' /etc/ssl/certs/ca-certificates.crt")
	if !strings.Contains(got, "/etc/ssl/certs/ca-certificates.crt\n") || !strings.Contains(got, strings.TrimSpace(string(ca))) || !strings.Contains(got, "root 444") {
		t.Errorf("bundle in the sandbox:\n%s", got)
	}
}

// TestSandboxCACertsRefusesBadInput: a file with no certificate, or with a
// private key, stops the server from starting, naming the flag.
func TestSandboxCACertsRefusesBadInput(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	_, _, keyFile := testPKI(t, dir, "x.test")
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{keyFile: "PRIVATE KEY block", empty: "no certificate", filepath.Join(dir, "missing"): "no such file"} {
		var dataDir string
		srv, err := testenv.Start(nil, func(c *server.Config) { c.SandboxCACerts, dataDir = file, c.DataDir })
		if err == nil {
			srv.Stop()
			os.RemoveAll(srv.Config.DataDir)
			t.Errorf("%s: server started", file)
			continue
		}
		if !strings.Contains(err.Error(), "sandbox-ca-certs") || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", file, err, want)
		}
		// The refused start built the busybox image: with CleanupOnExit its
		// layer mounts go as on Stop, and the data dir with them.
		if mounts := testenv.MountsUnder(dataDir); len(mounts) > 0 {
			t.Errorf("%s: mounts left by the refused start: %v", file, mounts)
			for i := len(mounts) - 1; i >= 0; i-- {
				_ = syscall.Unmount(mounts[i], syscall.MNT_DETACH)
			}
			os.RemoveAll(dataDir)
		}
		if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
			t.Errorf("%s: data dir left by the refused start: %v", file, err)
		}
	}
}
