package vm

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
)

// testCA is a CA the shared VM's node trusts (Config.CACerts) with a
// server certificate it issued, and a second CA no one trusts with one of
// its own.
type testCA struct {
	caPEM                     []byte
	leafPEM, leafKey          []byte
	strangerLeaf, strangerKey []byte
}

var nodeCA = sync.OnceValue(func() testCA {
	var ca testCA
	caPEM, leaf, key := issue("corral test node CA")
	ca.caPEM, ca.leafPEM, ca.leafKey = caPEM, leaf, key
	_, ca.strangerLeaf, ca.strangerKey = issue("corral test stranger CA")
	return ca
})

// issue makes a CA and a server certificate for corral-ca.test it signed.
func issue(name string) (caPEM, leafPEM, leafKeyPEM []byte) {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(err)
	caCert, err := x509.ParseCertificate(caDER)
	must(err)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "corral-ca.test"},
		DNSNames: []string{"corral-ca.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	must(err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(leafKey)
	must(err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// TestGuestTrustsNodeCAs: a TLS client in the guest, with nothing but
// the system's defaults, accepts a server certificate of the node's CA and
// still refuses one of an unknown CA; the image's own CAs stay.
func TestGuestTrustsNodeCAs(t *testing.T) {
	_, sb := sharedVM(t)
	ca := nodeCA()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for name, b := range map[string][]byte{"node.crt": ca.leafPEM, "node.key": ca.leafKey,
		"stranger.crt": ca.strangerLeaf, "stranger.key": ca.strangerKey} {
		if _, err := sb.WriteFile(ctx, "/tmp/"+name, bytes.NewReader(b), backend.WriteOptions{Mode: 0o600}); err != nil {
			t.Fatal(err)
		}
	}
	bundle := sh(t, sb, "cat /etc/ssl/certs/ca-certificates.crt")
	if !strings.Contains(bundle, strings.TrimSpace(string(ca.caPEM))) {
		t.Fatal("the guest's CA bundle lacks the node's CA")
	}
	if n := strings.Count(bundle, "BEGIN CERTIFICATE"); n < 50 {
		t.Errorf("the guest's CA bundle holds %d certificates: the image's own are gone", n)
	}
	if local := sh(t, sb, "cat /usr/local/share/ca-certificates/corral-node.crt"); strings.TrimSpace(local) != strings.TrimSpace(string(ca.caPEM)) {
		t.Errorf("corral-node.crt = %q, want the node's CA", local)
	}
	out := sh(t, sb, `python3 - <<'EOF'
import socket, ssl, threading
def serve(name):
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain("/tmp/%s.crt" % name, "/tmp/%s.key" % name)
    ls = socket.create_server(("127.0.0.1", 0))
    def accept():
        c, _ = ls.accept()
        try:
            srv.wrap_socket(c, server_side=True).close()
        except (ssl.SSLError, OSError):
            pass
    threading.Thread(target=accept, daemon=True).start()
    return ls.getsockname()[1]
for name in ("node", "stranger"):
    port = serve(name)
    cli = ssl.create_default_context()
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            cli.wrap_socket(s, server_hostname="corral-ca.test").close()
        print(name, "trusted")
    except ssl.SSLCertVerificationError as e:
        print(name, "refused", e.verify_message)
EOF`)
	if !strings.Contains(out, "node trusted") || !strings.Contains(out, "stranger refused") {
		t.Errorf("TLS in the guest: %q, want the node's CA trusted and the stranger's refused", out)
	}
}
