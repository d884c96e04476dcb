package image

import (
	"encoding/binary"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Layers are built with every mtime set to 0 (mkfs.erofs -T0; this
// version cannot keep per-file mtimes and still make the same image twice).
// Python's timestamp-checked .pyc files record their source's mtime, so
// they would all turn stale and be recompiled in every sandbox. keepPycValid
// rewrites the recorded mtime to 0 in each pyc that is valid now (same
// mtime and size as its source), so it stays valid; stale ones stay stale.
// It edits the tree in place: only for trees the store owns.
func keepPycValid(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || !strings.HasSuffix(p, ".pyc") ||
			filepath.Base(filepath.Dir(p)) != "__pycache__" {
			return err
		}
		module, _, _ := strings.Cut(d.Name(), ".")
		src, err := os.Stat(filepath.Join(filepath.Dir(filepath.Dir(p)), module+".py"))
		if err != nil {
			return nil // no source: nothing to check against
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		var h [16]byte // magic, flags, source mtime, source size
		if _, err := f.ReadAt(h[:], 0); err != nil {
			return nil // too short to be a pyc
		}
		le := binary.LittleEndian
		if le.Uint32(h[4:]) != 0 || // hash-based: no mtime in it
			le.Uint32(h[8:]) != uint32(src.ModTime().Unix()) || le.Uint32(h[12:]) != uint32(src.Size()) {
			return nil
		}
		_, err = f.WriteAt([]byte{0, 0, 0, 0}, 8)
		return err
	})
}
