// Package open chooses and opens the node's writable-layer store by kind:
// XFS project quota (internal/storage/upper/xfs) where the kernel has it,
// else one ext4 image per sandbox (internal/storage/upper/ext4img). It is
// a package of its own, not part of internal/storage/upper, because it
// imports those stores and they import upper for the Layer type.
//
// It must not import corral packages other than internal/errdefs,
// internal/storage/upper and its stores (internal/deptest).
package open

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/upper"
	"github.com/corral-dev/corral/internal/storage/upper/ext4img"
	"github.com/corral-dev/corral/internal/storage/upper/xfs"
)

// The kinds of store Open knows: how sandboxes' writable layers get their
// disk limits.
const (
	// Auto uses XFS project quota where the kernel has it, else
	// per-sandbox ext4 images.
	Auto = "auto"
	// XFS is one sparse XFS pool with a project quota per sandbox.
	XFS = "xfs"
	// Ext4Image is one small ext4 image per sandbox, mounted only inside
	// the sandbox.
	Ext4Image = "ext4-image"
)

// Config says where the store lives.
type Config struct {
	// Dir holds the store: the XFS pool directly, ext4 images in images/.
	Dir string
	// PoolBytes is the (sparse) size of the XFS pool (XFS only; 0: the
	// xfs package's default).
	PoolBytes int64
	// Logger hears which store was chosen and why; nil: slog.Default().
	Logger *slog.Logger
}

// Open opens the store of the given kind ("" is Auto). With Auto, the XFS
// store is used when xfs.Open succeeds; when it says the host cannot
// (errdefs.NotSupported), the ext4-image store; any other error is
// returned. An unknown kind is an InvalidArgument error.
func Open(ctx context.Context, kind string, cfg Config) (upper.Store, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	switch kind {
	case "", Auto, XFS:
		pool, err := xfs.Open(ctx, xfs.Config{Dir: cfg.Dir, SizeBytes: cfg.PoolBytes})
		if err == nil {
			log.Info("disk store: xfs project quota", "dir", cfg.Dir)
			return pool, nil
		}
		if kind == XFS || !errdefs.IsNotSupported(err) {
			return nil, fmt.Errorf("disk store xfs: %w", err)
		}
		log.Info("disk store: ext4 image per sandbox, as xfs project quota is not available", "reason", err.Error())
	case Ext4Image:
		log.Info("disk store: ext4 image per sandbox, as configured")
	default:
		return nil, errdefs.InvalidArgument("disk store %q: must be %s, %s or %s", kind, Auto, XFS, Ext4Image)
	}
	imgs, err := ext4img.Open(ctx, ext4img.Config{Dir: filepath.Join(cfg.Dir, "images")})
	if err != nil {
		return nil, fmt.Errorf("disk store ext4-image: %w", err)
	}
	return imgs, nil
}
