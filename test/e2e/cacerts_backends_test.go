package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestFnCallCACerts: fncall pools' sandboxes get the same CA layer and
// SSL_CERT_FILE as container sandboxes: a call verifies a server
// certificate signed by the node's extra CA, and fails to without the
// bundle; a call's own SSL_CERT_FILE wins over the node's.
func TestFnCallCACerts(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	caFile, certFile, keyFile := testPKI(t, dir, "registry.test")
	files := map[string][]byte{}
	for name, f := range map[string]string{"tlscheck": buildTLSCheck(t, dir), "server.pem": certFile, "server.key": keyFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	srv := testenv.StartServer(t, func(c *server.Config) { c.SandboxCACerts = caFile; onePool(c) })
	check := func(env map[string]string) string {
		var kv []string
		for k, v := range env {
			kv = append(kv, k+"="+v)
		}
		r := call(t, srv.Client, client.CallOptions{Language: "sh", Files: files, Env: kv,
			Source: "chmod +x tlscheck && ./tlscheck server.pem server.key registry.test"})
		return strings.TrimSpace(string(r.Stdout) + string(r.Stderr))
	}
	assertBundleTrusted(t, "a call", check)
	ca, _ := os.ReadFile(caFile)
	r := call(t, srv.Client, shCall(`echo $SSL_CERT_FILE; cat "$SSL_CERT_FILE"; stat -c '%U %a' "$SSL_CERT_FILE"`))
	if got := string(r.Stdout); !strings.HasPrefix(got, "/etc/ssl/certs/ca-certificates.crt\n") ||
		!strings.Contains(got, strings.TrimSpace(string(ca))) || !strings.HasSuffix(got, "root 444\n") {
		t.Errorf("bundle in a call's sandbox:\n%s%s", got, r.Stderr)
	}
}

// TestMicroVMCACerts: a microVM guest mounts the CA layer (as an EROFS
// disk, like its other layers) and has SSL_CERT_FILE: a program in it
// verifies a certificate signed by the node's extra CA.
func TestMicroVMCACerts(t *testing.T) {
	requireMicroVM(t)
	dir := t.TempDir()
	caFile, certFile, keyFile := testPKI(t, dir, "registry.test")
	bin := buildTLSCheck(t, dir)
	srv := testenv.StartServer(t, testenv.WithAgent(t), func(c *server.Config) {
		c.SandboxCACerts = caFile
	})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Backend: "microvm",
		Resources: client.Resources{MemoryBytes: 256 << 20, CPUMillis: 1000}})
	upload(t, ctx, sb, map[string]string{bin: "/root/tlscheck", certFile: "/root/server.pem", keyFile: "/root/server.key"})
	res, err := sb.Run(ctx, client.Command{Args: []string{"/root/tlscheck", "/root/server.pem", "/root/server.key", "registry.test"}})
	if err != nil {
		t.Fatal(err)
	}
	if out := strings.TrimSpace(string(res.Stdout) + string(res.Stderr)); out != "verified" {
		t.Errorf("in a microVM with the node's CA: %s", out)
	}
	ca, _ := os.ReadFile(caFile)
	got := testenv.Sh(t, sb, `echo $SSL_CERT_FILE; cat "$SSL_CERT_FILE"; stat -c '%U %a' "$SSL_CERT_FILE"`)
	if !strings.HasPrefix(got, "/etc/ssl/certs/ca-certificates.crt\n") || !strings.Contains(got, strings.TrimSpace(string(ca))) || !strings.HasSuffix(got, "root 444\n") {
		t.Errorf("bundle in the microVM:\n%s", got)
	}
}
