package cluster_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestClusterMTLS: with mutual TLS instead of the cluster secret, a control
// instance reaches its node over HTTP/2 on TLS (a create, a run, a
// streamed-stdin exec); the node's cluster listener refuses a caller
// without a client certificate, one of another CA, one holding a node's
// serving certificate, and plain HTTP.
func TestClusterMTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, dir, "cluster")
	nodeCert, nodeKey := ca.Issue("node", x509.ExtKeyUsageServerAuth)
	ctlCert, ctlKey := ca.Issue("control", x509.ExtKeyUsageClientAuth)
	r := startRigOpts(t, rigOpts{nControl: 1, nNode: 1, noSecret: true,
		nodeArgs:    []string{"--cluster-tls-cert", nodeCert, "--cluster-tls-key", nodeKey, "--cluster-ca", ca.File},
		controlArgs: []string{"--cluster-tls-cert", ctlCert, "--cluster-tls-key", ctlKey, "--cluster-ca", ca.File}})
	ctx := context.Background()
	sb, err := r.cli[0].Create(ctx, client.CreateOptions{Resources: small})
	if err != nil {
		t.Fatalf("create over mutual TLS: %v", err)
	}
	run(t, r.cli[0], sb.ID(), "tls")
	execStream(t, r.cli[0], sb.ID())

	// Callers the node must refuse, each straight at its cluster listener.
	other := testenv.NewCA(t, dir, "other")
	otherCert, otherKey := other.Issue("intruder", x509.ExtKeyUsageClientAuth)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	call := func(scheme string, certFile, keyFile string) (int, error) {
		cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
		if certFile != "" {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{c}
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}, Timeout: 10 * time.Second}
		defer hc.CloseIdleConnections()
		resp, err := hc.Post(scheme+r.nodeAddr(0)+"/corral.v1.SandboxService/List", "application/json", strings.NewReader("{}"))
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for name, c := range map[string][3]string{
		"no client certificate":        {"https://", "", ""},
		"another CA's certificate":     {"https://", otherCert, otherKey},
		"a node's serving certificate": {"https://", nodeCert, nodeKey},
	} {
		if code, err := call(c[0], c[1], c[2]); err == nil {
			t.Errorf("%s: the TLS handshake succeeded (HTTP %d)", name, code)
		}
	}
	if code, err := call("http://", "", ""); err == nil && code == http.StatusOK {
		t.Error("plain HTTP to the cluster listener was served")
	}
	// The control instance's certificate gets through TLS, and a call
	// without a principal is still refused: the refusals above are the
	// handshake's, not a broken listener.
	if code, err := call("https://", ctlCert, ctlKey); err != nil || code != http.StatusForbidden {
		t.Fatalf("call with the control certificate and no principal: HTTP %d, %v; want 403", code, err)
	}
}
