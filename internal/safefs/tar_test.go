package safefs

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"testing"
)

func tarOf(t *testing.T, hdrs ...tar.Header) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		body := ""
		if h.Typeflag == tar.TypeReg {
			body = "planted"
			h.Size = int64(len(body))
		}
		must(t, tw.WriteHeader(&h))
		_, err := io.WriteString(tw, body)
		must(t, err)
	}
	must(t, tw.Close())
	return &buf
}

// TestExtractStaysInRoot: planted symlinks and hostile names in the
// stream resolve inside the root; the canary outside is never touched.
func TestExtractStaysInRoot(t *testing.T) {
	s := newSandbox(t)
	s.escapeLinks(t)
	ctx := context.Background()
	for _, name := range []string{"escape/outside/canary.txt", "up/outside/canary.txt", "hostabs/canary.txt",
		"../../outside/canary.txt", "/outside/canary.txt"} {
		// A dangling link (hostabs inside the root) may fail the entry.
		_, _, err := s.fs.Extract(ctx, "/", tarOf(t, tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}), TarOptions{})
		t.Logf("%s: %v", name, err)
		s.checkCanary(t)
	}
	// Replacing the planted symlink itself replaces the link, not its target.
	if _, _, err := s.fs.Extract(ctx, "/", tarOf(t, tar.Header{Name: "canary-link", Typeflag: tar.TypeReg, Mode: 0o644}), TarOptions{}); err != nil {
		t.Fatal(err)
	}
	s.checkCanary(t)
	if b, err := os.ReadFile(s.root + "/outside/canary.txt"); err != nil || string(b) != "planted" {
		t.Fatalf("root/outside/canary.txt: %q %v", b, err)
	}
	// Devices are refused.
	_, _, err := s.fs.Extract(ctx, "/", tarOf(t, tar.Header{Name: "dev", Typeflag: tar.TypeBlock, Devmajor: 8}), TarOptions{})
	if err == nil {
		t.Fatal("a block device was extracted")
	}
}

// TestArchiveRecordsLinks: Archive records symlinks without following them.
func TestArchiveRecordsLinks(t *testing.T) {
	s := newSandbox(t)
	s.escapeLinks(t)
	var buf bytes.Buffer
	must(t, s.fs.Archive(context.Background(), "/", &buf, TarOptions{}))
	tr := tar.NewReader(&buf)
	seen := map[string]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		seen[h.Name] = h.Typeflag
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			if string(b) == canary {
				t.Fatalf("%s: the canary outside the root was archived", h.Name)
			}
		}
	}
	if seen["hostabs"] != tar.TypeSymlink || seen["escape"] != tar.TypeSymlink || seen["etc/passwd"] != tar.TypeReg || seen["./"] != tar.TypeDir {
		t.Fatalf("entries: %v", seen)
	}
}

// TestExtractLastEntryWins: of two entries of one name the later one
// stays, also when the first went to a parallel writer.
func TestExtractLastEntryWins(t *testing.T) {
	s := newSandbox(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, body := range []string{"first", "second", "third"} {
		h := tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}
		if i == 2 {
			h = tar.Header{Name: "l", Typeflag: tar.TypeLink, Linkname: "f"}
			body = ""
		}
		must(t, tw.WriteHeader(&h))
		_, err := io.WriteString(tw, body)
		must(t, err)
	}
	must(t, tw.Close())
	if _, _, err := s.fs.Extract(context.Background(), "/x", &buf, TarOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"f", "l"} {
		if b, err := os.ReadFile(s.root + "/x/" + n); err != nil || string(b) != "second" {
			t.Fatalf("%s: %q %v", n, b, err)
		}
	}
}
