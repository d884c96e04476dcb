package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const testCert = `-----BEGIN CERTIFICATE-----
MIIBlDCCATmgAwIBAgIUAcxfWGRiG1MqL2KI0oBZRdA5QBUwCgYIKoZIzj0EAwIw
HjEcMBoGA1UEAwwTY29ycmFsIHVuaXQgdGVzdCBDQTAgFw0yNjEyMDExMjA3NTRa
GA8yMTI2MTEwNzEyMDc1NFowHjEcMBoGA1UEAwwTY29ycmFsIHVuaXQgdGVzdCBD
QTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABNHL9VmGFuL4qD4dZ3OaaGF83kcq
AMxY0g0y/BeJg2dHdHQK9OVsmFJF9O7aYM572HKeeXhaMY9Ai+Ctz8HorX+jUzBR
MB0GA1UdDgQWBBTlczV0HdlShG6cOfdtb+QpBpcpYDAfBgNVHSMEGDAWgBTlczV0
HdlShG6cOfdtb+QpBpcpYDAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0kA
MEYCIQCfk7U3JfxdrvaGT7eLghn1EpVRqHR5/U2nErtLiMAXrAIhAN6sxqQ/0Kny
kXOrT71oKEe4/D4nKJ345ViLQNOEXNFW
-----END CERTIFICATE-----
`

// TestCALayerKeepsImageTrustStore: the CA layer holds the image's own
// bundle followed by the node's certificates, at the path the image keeps
// it, under directories with the image's modes and mtimes; the same
// image trust store gets the same layer.
func TestCALayerKeepsImageTrustStore(t *testing.T) {
	base, top := t.TempDir(), t.TempDir()
	certs := filepath.Join(base, "etc/pki/tls/certs")
	if err := os.MkdirAll(certs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(certs, "ca-bundle.crt"), []byte("IMAGE BUNDLE"), 0o644); err != nil {
		t.Fatal(err)
	}
	stamp := time.Unix(1_600_000_000, 0)
	if err := os.Chmod(filepath.Join(base, "etc/pki"), 0o711); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"etc", "etc/pki", "etc/pki/tls", "etc/pki/tls/certs"} {
		if err := os.Chtimes(filepath.Join(base, d), stamp, stamp); err != nil {
			t.Fatal(err)
		}
	}
	c := testCAImages(t)
	layer, first, err := c.layerFor([]string{top, base})
	if err != nil {
		t.Fatal(err)
	}
	if first != "etc/pki/tls/certs/ca-bundle.crt" {
		t.Errorf("SSL_CERT_FILE names %s", first)
	}
	b, err := os.ReadFile(filepath.Join(layer, first))
	if err != nil || !strings.HasPrefix(string(b), "IMAGE BUNDLE\n-----BEGIN CERTIFICATE-----") {
		t.Errorf("bundle %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(layer, "etc/ssl/certs/ca-certificates.crt")); !os.IsNotExist(err) {
		t.Errorf("a bundle where the image has none: %v", err)
	}
	for d, mode := range map[string]os.FileMode{"etc/pki": 0o711, "etc/pki/tls/certs": 0o755} {
		st, err := os.Stat(filepath.Join(layer, d))
		if err != nil || st.Mode().Perm() != mode || !st.ModTime().Equal(stamp) {
			t.Errorf("%s: %v %v %v, want %v and the image's mtime", d, st.Mode(), st.ModTime(), err, mode)
		}
	}
	again, _, err := c.layerFor([]string{top, base})
	if err != nil || again != layer {
		t.Errorf("same trust store, other layer: %s %v", again, err)
	}
}

// testCAImages is the CA layer maker over testCert, with no image store
// below it.
func testCAImages(t *testing.T) *caImages {
	t.Helper()
	src := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(src, []byte(testCert), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := newCAImages(nil, src, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return c
}
