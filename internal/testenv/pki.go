package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a test certificate authority, valid for an hour either side of
// now: it writes its certificate, and those it issues with their keys, as
// PEM files into a directory.
type CA struct {
	Cert *x509.Certificate
	File string // the CA's certificate

	t   testing.TB
	dir string
	key *ecdsa.PrivateKey
}

// NewCA makes a CA named name; its certificate is dir/name-ca.pem.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	ca := &CA{t: t, dir: dir, key: newKey(t)}
	tmpl := certTemplate(name)
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ca.key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	if ca.Cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	ca.File = ca.write(name+"-ca.pem", "CERTIFICATE", der)
	return ca
}

// Issue writes a certificate for name (as a DNS name, and for the loopback
// address) for usage and its key, as dir/name.pem and dir/name.key.
func (ca *CA) Issue(name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	ca.t.Helper()
	key := newKey(ca.t)
	tmpl := certTemplate(name)
	tmpl.DNSNames, tmpl.IPAddresses = []string{name}, []net.IP{net.IPv4(127, 0, 0, 1)}
	tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{usage}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		ca.t.Fatal(err)
	}
	return ca.write(name+".pem", "CERTIFICATE", der), ca.write(name+".key", "PRIVATE KEY", keyDER)
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// certTemplate is a certificate for name with a random serial.
func certTemplate(name string) *x509.Certificate {
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
}

func (ca *CA) write(name, kind string, der []byte) string {
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return p
}
