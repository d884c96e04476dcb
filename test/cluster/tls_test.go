package cluster_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
)

// testCA issues certificates for one test.
type testCA struct {
	t    *testing.T
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{t: t, dir: dir, cert: cert, key: key}
	ca.write(name+"-ca.pem", "CERTIFICATE", der)
	return ca
}

func (ca *testCA) write(name, kind string, der []byte) string {
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return p
}

// issue writes a certificate for usage (and the loopback address) and its
// key, and returns their paths.
func (ca *testCA) issue(name string, usage x509.ExtKeyUsage) (string, string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		ca.t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		ca.t.Fatal(err)
	}
	return ca.write(name+".pem", "CERTIFICATE", der), ca.write(name+".key", "EC PRIVATE KEY", kder)
}

// TestClusterMTLS: with mutual TLS instead of the cluster secret, a control
// instance reaches its node over HTTP/2 on TLS (a create, a run, a
// streamed-stdin exec); the node's cluster listener refuses a caller
// without a client certificate, one of another CA, one holding a node's
// serving certificate, and plain HTTP.
func TestClusterMTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "cluster")
	caFile := filepath.Join(dir, "cluster-ca.pem")
	nodeCert, nodeKey := ca.issue("node", x509.ExtKeyUsageServerAuth)
	ctlCert, ctlKey := ca.issue("control", x509.ExtKeyUsageClientAuth)
	r := startRigOpts(t, rigOpts{nControl: 1, nNode: 1, noSecret: true,
		nodeArgs:    []string{"--cluster-tls-cert", nodeCert, "--cluster-tls-key", nodeKey, "--cluster-ca", caFile},
		controlArgs: []string{"--cluster-tls-cert", ctlCert, "--cluster-tls-key", ctlKey, "--cluster-ca", caFile}})
	ctx := context.Background()
	sb, err := r.cli[0].Create(ctx, client.CreateOptions{Resources: small})
	if err != nil {
		t.Fatalf("create over mutual TLS: %v", err)
	}
	run(t, r.cli[0], sb.ID(), "tls")
	execStream(t, r.cli[0], sb.ID())

	// Callers the node must refuse, each straight at its cluster listener.
	other := newTestCA(t, dir, "other")
	otherCert, otherKey := other.issue("intruder", x509.ExtKeyUsageClientAuth)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
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
