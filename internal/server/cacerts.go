package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/fncall"
	"github.com/corral-dev/corral/internal/node"
	"github.com/corral-dev/corral/internal/storage/layers"
)

// trustStores are where images keep their CA bundle, the first the one
// SSL_CERT_FILE names: Debian, Ubuntu and Alpine; Fedora and RHEL; SUSE.
var trustStores = []string{
	"etc/ssl/certs/ca-certificates.crt",
	"etc/pki/tls/certs/ca-bundle.crt",
	"etc/ssl/ca-bundle.pem",
}

// readCACerts reads the PEM certificates of path, a file or a directory
// of them (*.crt and *.pem, in name order), and checks that there is at
// least one and nothing but certificates.
func readCACerts(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, errdefs.InvalidArgument("sandbox-ca-certs: %v", err)
	}
	files := []string{path}
	if st.IsDir() {
		files = nil
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, errdefs.InvalidArgument("sandbox-ca-certs: %v", err)
		}
		for _, e := range entries {
			if n := e.Name(); !e.IsDir() && (strings.HasSuffix(n, ".crt") || strings.HasSuffix(n, ".pem")) {
				files = append(files, filepath.Join(path, n))
			}
		}
		sort.Strings(files)
	}
	var out bytes.Buffer
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, errdefs.InvalidArgument("sandbox-ca-certs: %v", err)
		}
		for rest := b; ; {
			var blk *pem.Block
			blk, rest = pem.Decode(rest)
			if blk == nil {
				if len(bytes.TrimSpace(rest)) > 0 {
					return nil, errdefs.InvalidArgument("sandbox-ca-certs: %s: not PEM after certificate %d", f, n)
				}
				break
			}
			if blk.Type != "CERTIFICATE" {
				return nil, errdefs.InvalidArgument("sandbox-ca-certs: %s: a %s block (only CERTIFICATE blocks belong in a CA bundle)", f, blk.Type)
			}
			if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
				return nil, errdefs.InvalidArgument("sandbox-ca-certs: %s: certificate %d: %v", f, n+1, err)
			}
			if err := pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: blk.Bytes}); err != nil {
				return nil, err
			}
			n++
		}
	}
	if n == 0 {
		return nil, errdefs.InvalidArgument("sandbox-ca-certs: no certificate in %s", path)
	}
	return out.Bytes(), nil
}

// caImages gives every sandbox the node's extra CA certificates:
// on top of the image's layers goes a read-only layer (a directory under
// the data dir, one per distinct image trust store) holding the image's
// own bundle followed by the node's, at each trustStores path the image
// has (the first if it has none), and SSL_CERT_FILE names it. The sandbox
// may still replace its own copy in its writable layer, as any image file:
// the store is what it trusts, no one else.
type caImages struct {
	node.Images
	certs []byte
	dir   string // <data dir>/cacerts
	mu    sync.Mutex
}

func newCAImages(inner node.Images, certsPath, dataDir string) (*caImages, error) {
	certs, err := readCACerts(certsPath)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(dataDir, "cacerts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("sandbox CA certs: %w", err)
	}
	return &caImages{Images: inner, certs: certs, dir: dir}, nil
}

func (c *caImages) AcquireIn(ctx context.Context, name, holder, scope string) (layers.Image, error) {
	img, err := c.Images.AcquireIn(ctx, name, holder, scope)
	if err != nil {
		return img, err
	}
	if img, err = c.add(ctx, img); err != nil {
		c.Images.Release(holder)
	}
	return img, err
}

// add puts the CA layer on top of img: its directory over img's mounted
// layers (containers, fncall) and its EROFS image over img's disks
// (microVMs mount the same layers as block devices), and sets
// SSL_CERT_FILE in img's environment.
func (c *caImages) add(ctx context.Context, img layers.Image) (layers.Image, error) {
	layer, first, err := c.layerFor(img.Layers)
	if err == nil && len(img.Disks) > 0 {
		var disk string
		if disk, err = c.diskFor(ctx, layer); err == nil {
			img.Disks = append([]backend.LayerDisk{{Image: disk}}, img.Disks...)
		}
	}
	if err != nil {
		return layers.Image{}, fmt.Errorf("image %s: sandbox CA certs: %w", img.Name, err)
	}
	img.Layers = append([]string{layer}, img.Layers...)
	img.Env = append(append([]string{}, img.Env...), "SSL_CERT_FILE=/"+first)
	return img, nil
}

// diskFor returns the EROFS image of the CA layer directory layer
// (layer.erofs beside it), making it on first use.
func (c *caImages) diskFor(ctx context.Context, layer string) (string, error) {
	disk := layer + ".erofs"
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := os.Stat(disk); err == nil {
		return disk, nil
	}
	tmp, err := os.CreateTemp(c.dir, ".tmp-*.erofs")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // gone after the rename
	// A fixed build time and UUID: the same layer, the same image.
	cmd := exec.CommandContext(ctx, "mkfs.erofs", "--quiet", "-T0", "-U"+caDiskUUID, tmp.Name(), layer)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("mkfs.erofs %s (package erofs-utils): %w: %s", layer, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp.Name(), disk); err != nil {
		return "", err
	}
	return disk, nil
}

const caDiskUUID = "c0ca1ce7-0000-4000-8000-000000000001"

// caFnImages gives fncall pools' sandboxes the same CA layer; fncall sets
// the image's SSL_CERT_FILE in every call.
type caFnImages struct {
	fncall.Images
	ca *caImages
}

func (f caFnImages) Get(ctx context.Context, name string) (layers.Image, error) {
	img, err := f.Images.Get(ctx, name)
	if err != nil {
		return img, err
	}
	return f.ca.add(ctx, img)
}

func (f caFnImages) Acquire(ctx context.Context, name, holder string) (layers.Image, error) {
	img, err := f.Images.Acquire(ctx, name, holder)
	if err != nil {
		return img, err
	}
	if img, err = f.ca.add(ctx, img); err != nil {
		f.Images.Release(holder)
	}
	return img, err
}

// layerFor returns the CA layer for an image whose mounted layers are
// lowers (topmost first), making it on first use, and the bundle path
// SSL_CERT_FILE names.
func (c *caImages) layerFor(lowers []string) (string, string, error) {
	bundles := map[string][]byte{}
	for _, p := range trustStores {
		for _, l := range lowers { // the topmost layer that has it wins
			if b, err := os.ReadFile(filepath.Join(l, p)); err == nil {
				bundles[p] = b
				break
			}
		}
	}
	if len(bundles) == 0 {
		bundles[trustStores[0]] = nil
	}
	h := sha256.New()
	for _, p := range trustStores {
		if b, ok := bundles[p]; ok {
			fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
			h.Write(b)
		}
	}
	h.Write(c.certs)
	layer := filepath.Join(c.dir, hex.EncodeToString(h.Sum(nil))[:32])
	first := ""
	for _, p := range trustStores {
		if _, ok := bundles[p]; ok && first == "" {
			first = p
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := os.Stat(layer); err == nil {
		return layer, first, nil
	}
	tmp, err := os.MkdirTemp(c.dir, ".tmp-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(tmp) // gone after the rename
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", "", err
	}
	for p, own := range bundles {
		f := filepath.Join(tmp, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			return "", "", err
		}
		if len(own) > 0 && own[len(own)-1] != '\n' {
			own = append(own, '\n')
		}
		if err := os.WriteFile(f, append(own, c.certs...), 0o444); err != nil {
			return "", "", err
		}
	}
	for p := range bundles { // after the files, whose creation sets mtimes
		if err := dirsLike(tmp, filepath.Dir(p), lowers); err != nil {
			return "", "", err
		}
	}
	if err := os.Rename(tmp, layer); err != nil {
		return "", "", err
	}
	return layer, first, nil
}

// dirsLike gives rel's directories under root the mode, owner and mtime
// of the image's own (the topmost layer's that has each), since an overlay
// shows a merged directory with its topmost layer's attributes.
func dirsLike(root, rel string, lowers []string) error {
	p := root
	for _, part := range strings.Split(rel, "/") {
		p = filepath.Join(p, part)
		sub, _ := filepath.Rel(root, p)
		for _, l := range lowers {
			var st unix.Stat_t
			if unix.Stat(filepath.Join(l, sub), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			if err := os.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
			if err := os.Chmod(p, os.FileMode(st.Mode&0o777)); err != nil {
				return err
			}
			if err := unix.UtimesNano(p, []unix.Timespec{st.Atim, st.Mtim}); err != nil {
				return err
			}
			break
		}
	}
	return nil
}
