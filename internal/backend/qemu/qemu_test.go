package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCopySparseKeepsHoles: the RAM image gets the data extents of the
// source at their offsets, the rest stays holes (what makes ram.img of
// an idle guest small).
func TestCopySparseKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	if err := src.Truncate(size); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("corral"), 1000)
	for _, off := range []int64{0, 32 << 20, size - int64(len(data))} {
		if _, err := src.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	dst := filepath.Join(dir, "snap", SnapRAMFile)
	if err := os.Mkdir(filepath.Dir(dst), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := copySparse(src, dst); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src.Name())
	if !bytes.Equal(got, want) {
		t.Fatal("copy differs from its source")
	}
	used, err := DiskUsage(filepath.Dir(dst))
	if err != nil {
		t.Fatal(err)
	}
	if used <= 0 || used > 4<<20 {
		t.Errorf("a 64 MiB image with 18 KB of data occupies %d bytes: holes were not kept", used)
	}
	if RAMImage(filepath.Dir(dst)) != dst || RAMImage(dir) != "" {
		t.Errorf("RAMImage: %q, %q", RAMImage(filepath.Dir(dst)), RAMImage(dir))
	}
}

// TestMachineRecord: the run dir's record round-trips, a missing one is
// fs.ErrNotExist and a torn one an error naming the file.
func TestMachineRecord(t *testing.T) {
	dir := t.TempDir()
	type state struct{ Pid int }
	var got state
	if err := LoadMachine(dir, &got); !os.IsNotExist(err) {
		t.Errorf("load without a record: %v", err)
	}
	if err := SaveMachine(dir, state{Pid: 42}); err != nil {
		t.Fatal(err)
	}
	if err := LoadMachine(dir, &got); err != nil || got.Pid != 42 {
		t.Errorf("round trip: %+v %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(dir, MachineFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := LoadMachine(dir, &got); err == nil || !strings.Contains(err.Error(), MachineFile) {
		t.Errorf("torn record: %v", err)
	}
}

// TestRAMObject: a booted VM's RAM is a memfd, a restored one's a
// private mapping of the image (commas in the path escaped).
func TestRAMObject(t *testing.T) {
	if got := RAMObject(512, ""); got != "memory-backend-memfd,id=ram,size=512M" {
		t.Errorf("memfd: %s", got)
	}
	if got := RAMObject(256, "/s/a,b/ram.img"); got != "memory-backend-file,id=ram,size=256M,mem-path=/s/a,,b/ram.img,share=off" {
		t.Errorf("file: %s", got)
	}
}
