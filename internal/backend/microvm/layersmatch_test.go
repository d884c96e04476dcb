package microvm

import (
	"testing"

	"github.com/corral-dev/corral/internal/backend"
)

// TestSameLayers: layer files match by their digest-named file, so a
// snapshot from another node's data dir restores; another layer, another
// order or another blob does not.
func TestSameLayers(t *testing.T) {
	snap := []backend.LayerDisk{
		{Image: "/data/a/layers/sha256-11.erofs", Devices: []string{"/data/a/blobs/sha256-b1"}},
		{Image: "/data/a/layers/sha256-22.erofs"},
	}
	moved := []backend.LayerDisk{
		{Image: "/srv/b/layers/sha256-11.erofs", Devices: []string{"/srv/b/blobs/sha256-b1"}},
		{Image: "/srv/b/layers/sha256-22.erofs"},
	}
	if !sameLayers(snap, moved) {
		t.Error("the same layers under another data dir do not match")
	}
	for name, now := range map[string][]backend.LayerDisk{
		"another layer": {moved[0], {Image: "/srv/b/layers/sha256-33.erofs"}},
		"another order": {moved[1], moved[0]},
		"one fewer":     moved[:1],
		"another blob":  {{Image: moved[0].Image, Devices: []string{"/srv/b/blobs/sha256-b2"}}, moved[1]},
		"no blob":       {{Image: moved[0].Image}, moved[1]},
	} {
		if sameLayers(snap, now) {
			t.Errorf("%s: matches", name)
		}
	}
}
