package microvm

import (
	"path/filepath"

	"github.com/corral-dev/corral/internal/backend"
)

// sameLayers reports whether a snapshot's layer files are the image's
// now. Layer files are named by their digest, so the names are compared,
// not the dirs: a snapshot migrated from another node, whose data dir
// differs, restores over the same layers there.
func sameLayers(snap, now []backend.LayerDisk) bool {
	if len(snap) != len(now) {
		return false
	}
	for i := range snap {
		a, b := snap[i], now[i]
		if filepath.Base(a.Image) != filepath.Base(b.Image) || len(a.Devices) != len(b.Devices) {
			return false
		}
		for j := range a.Devices {
			if filepath.Base(a.Devices[j]) != filepath.Base(b.Devices[j]) {
				return false
			}
		}
	}
	return true
}
