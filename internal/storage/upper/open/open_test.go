package open

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/upper/ext4img"
	"github.com/corral-dev/corral/internal/storage/upper/xfs"
)

func TestUnknownKind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "disk")
	_, err := Open(context.Background(), "zfs", Config{Dir: dir})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Open(zfs) = %v; want an invalid-argument error", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("an unknown kind left %s behind (stat: %v)", dir, err)
	}
}

// TestChoice: each kind opens the store it names, and auto takes XFS
// exactly when this host can have it (what xfs.Open says), else ext4 images.
func TestChoice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skip: the stores need root (loop devices, mounts)")
	}
	ctx := context.Background()
	probe, xfsErr := xfs.Open(ctx, xfs.Config{Dir: t.TempDir(), SizeBytes: xfs.MinSizeBytes})
	if xfsErr == nil {
		if err := probe.Close(ctx, true); err != nil {
			t.Fatal(err)
		}
	} else if !errdefs.IsNotSupported(xfsErr) {
		t.Fatalf("xfs.Open: %v", xfsErr)
	}
	for _, kind := range []string{"", Auto, XFS, Ext4Image} {
		t.Run("kind="+kind, func(t *testing.T) {
			s, err := Open(ctx, kind, Config{Dir: t.TempDir(), PoolBytes: xfs.MinSizeBytes})
			wantXFS := kind == XFS || (kind != Ext4Image && xfsErr == nil)
			if kind == XFS && xfsErr != nil {
				if !errdefs.IsNotSupported(err) {
					t.Fatalf("Open(xfs) on a host without XFS quota = %v; want not supported", err)
				}
				return
			}
			if err != nil {
				if kind == Ext4Image && errdefs.IsNotSupported(err) {
					t.Skipf("skip: %v", err)
				}
				t.Fatal(err)
			}
			defer func() {
				if err := s.Close(ctx, true); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			switch s.(type) {
			case *xfs.Store:
				if !wantXFS {
					t.Fatalf("Open(%q) chose XFS; want ext4 images (xfs: %v)", kind, xfsErr)
				}
			case *ext4img.Store:
				if wantXFS {
					t.Fatalf("Open(%q) chose ext4 images; want XFS", kind)
				}
			default:
				t.Fatalf("Open(%q) = %T", kind, s)
			}
			l, err := s.Create(ctx, "a", 16<<20, 1024)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if l.IsDevice() == wantXFS {
				t.Fatalf("layer %+v from %T: device = %v", l, s, l.IsDevice())
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.Remove(ctx, "a"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
