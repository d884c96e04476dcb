package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/corral-dev/corral/internal/errdefs"
)

// TLS is mutual TLS between control instances and nodes, an option beside
// (or instead of) the cluster secret: each side holds a certificate of the
// cluster's CA. A node's listener serves only clients whose certificate
// the CA signed for client authentication (a node's serving certificate,
// for server authentication only, cannot call another node); a control
// instance accepts only node certificates the CA signed.
type TLS struct {
	cert tls.Certificate
	ca   *x509.CertPool
}

// LoadTLS reads a PEM certificate and key and the CA certificate(s) that
// sign the other side's.
func LoadTLS(certFile, keyFile, caFile string) (*TLS, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster TLS certificate %s, key %s: %w", certFile, keyFile, err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("cluster TLS CA: %w", err)
	}
	ca := x509.NewCertPool()
	if !ca.AppendCertsFromPEM(pem) {
		return nil, errdefs.InvalidArgument("cluster TLS CA %s: no PEM certificate in it", caFile)
	}
	return &TLS{cert: cert, ca: ca}, nil
}

// ServerConfig is a node listener's: a client certificate is required.
func (t *TLS) ServerConfig() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{t.cert}, ClientCAs: t.ca,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
}

// ClientConfig is a control instance's, towards nodes.
func (t *TLS) ClientConfig() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{t.cert}, RootCAs: t.ca, MinVersion: tls.VersionTLS13}
}
