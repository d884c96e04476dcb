package layers

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/blob"
)

// ArchiveFormat says what an uploaded image archive is.
type ArchiveFormat int

const (
	// ArchiveOCILayout is a tar stream of an OCI image layout directory.
	ArchiveOCILayout ArchiveFormat = iota + 1
	// ArchiveDocker is a `docker save` tarball.
	ArchiveDocker
)

// CreateLayerFromTar builds the layer ref from a tar stream, as CreateLayer
// does from a tar file. An untrusted stream (anything a remote client
// sends) loses its trusted.* xattrs, which would steer overlayfs.
func (s *Store) CreateLayerFromTar(ctx context.Context, ref string, r io.Reader, untrusted bool) (Layer, error) {
	if err := checkRef(ref); err != nil {
		return Layer{}, err
	}
	tmp, err := s.tarDir()
	if err != nil {
		return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
	}
	defer os.RemoveAll(tmp)
	if err := untarLayer(ctx, r, tmp, untrusted); err != nil {
		return Layer{}, fmt.Errorf("layer %s: %w", ref, err)
	}
	return s.createLayer(ctx, ref, tmp, false, mkfsOptions{})
}

// untarLayer unpacks a layer's tar stream into dir, then turns OCI
// whiteouts into overlay ones.
func untarLayer(ctx context.Context, r io.Reader, dir string, untrusted bool) error {
	if err := untar(ctx, r, dir, untrusted); err != nil {
		return err
	}
	return convertWhiteouts(dir)
}

// ImportArchive imports an image archive streamed from r as the
// composition opts.Ref; opts.Source names what it is in messages, and
// image picks one image of the archive (an OCI ref.name or a docker
// REPO:TAG; empty: the only one). The archive is staged in the store's
// temporary space (swept at Open after a crash) and removed afterwards.
func (s *Store) ImportArchive(ctx context.Context, opts ImportOptions, format ArchiveFormat, image string, r io.Reader) (Imported, error) {
	if err := checkRef(opts.Ref); err != nil {
		return Imported{}, err
	}
	tmp, err := s.tarDir()
	if err != nil {
		return Imported{}, err
	}
	defer os.RemoveAll(tmp)
	switch format {
	case ArchiveOCILayout:
		if err := untar(ctx, r, tmp, true); err != nil {
			return Imported{}, fmt.Errorf("%s: %w", opts.Source, err)
		}
		if err := plainTree(tmp); err != nil {
			return Imported{}, fmt.Errorf("%s: %w", opts.Source, err)
		}
		opts.Source = SourceOCILayout + tmp
	case ArchiveDocker:
		file := filepath.Join(tmp, "archive.tar")
		if err := copyToFile(ctx, file, r); err != nil {
			return Imported{}, fmt.Errorf("%s: %w", opts.Source, err)
		}
		opts.Source = SourceDockerArchive + file
	default:
		return Imported{}, errdefs.InvalidArgument("format: %d is neither an OCI layout nor a docker archive", format)
	}
	if image != "" {
		opts.Source += ":" + image
	}
	return s.Import(ctx, opts)
}

// copyToFile writes r to a new file at p, stopping when ctx ends.
func copyToFile(ctx context.Context, p string, r io.Reader) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, blob.ContextReader(ctx, r))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// plainTree refuses anything but directories and regular files under
// dir: the layout is read by path, and a symlink in an uploaded one could
// point at a node file.
func plainTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			return errdefs.InvalidArgument("OCI layout: %s is a %v, not a regular file", rel, d.Type())
		}
		return nil
	})
}
