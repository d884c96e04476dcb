package vm

import (
	"bytes"
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// guestTrustStores are the CA bundles of Linux distributions (Debian,
// Ubuntu and Alpine; Fedora and RHEL; SUSE), as for layered images.
var guestTrustStores = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
}

// guestLocalCAs is Debian's directory of local CAs: a certificate there
// survives the guest's own update-ca-certificates rebuilding its bundle.
const guestLocalCAs = "/usr/local/share/ca-certificates"

// installCACerts makes a Linux guest trust the node's extra CA
// certificates (Config.CACerts) beside its image's: they are appended to
// each trust store the guest has, at boot through its agent, so that one
// image serves nodes of different CAs and a node's new CA needs no image
// rebuild. A Linux guest with none of the stores gets Debian's.
func (s *sandbox) installCACerts(ctx context.Context, certs []byte) error {
	if len(certs) == 0 || !s.m.Linux {
		return nil
	}
	certs = append([]byte("\n"), bytes.TrimSpace(certs)...)
	certs = append(certs, '\n')
	found := 0
	for _, p := range guestTrustStores {
		fi, err := s.Stat(ctx, p)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("guest CA certs: %w", err)
		}
		if !fi.Mode.IsRegular() {
			continue // a link to another store, which gets them itself
		}
		if _, err := s.WriteFile(ctx, p, bytes.NewReader(certs), backend.WriteOptions{Append: true}); err != nil {
			return fmt.Errorf("guest CA certs: %w", err)
		}
		found++
	}
	if found == 0 {
		// Debian's path, as for a layered image without a bundle.
		if _, err := s.WriteFile(ctx, guestTrustStores[0], bytes.NewReader(certs[1:]), backend.WriteOptions{Mode: 0o644, MakeParents: true}); err != nil {
			return fmt.Errorf("guest CA certs: %w", err)
		}
	}
	if fi, err := s.Stat(ctx, guestLocalCAs); err == nil && fi.Mode.IsDir() {
		if _, err := s.WriteFile(ctx, guestLocalCAs+"/corral-node.crt", bytes.NewReader(certs[1:]), backend.WriteOptions{Mode: 0o644}); err != nil {
			return fmt.Errorf("guest CA certs: %w", err)
		}
	}
	return nil
}
