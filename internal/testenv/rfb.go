package testenv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/corral-dev/corral/internal/backend/vm"
)

// vmImageCache is where internal/backend/vm's tests keep the Debian VM
// images they build, one directory per recipe and agent binary
// (<recipe>-<hash>); other tests adopt the newest with AdoptVMImage.
var vmImageCache = filepath.Join(os.TempDir(), "corral-vm-image-cache")

// vmImage returns the directory of the newest complete cached image of the
// current recipe ("" when there is none).
func vmImage() string {
	dirs, _ := filepath.Glob(filepath.Join(vmImageCache, vm.DebianRecipe+"-*", "disk.qcow2"))
	newest, at := "", time.Time{}
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.ModTime().After(at) {
			newest, at = filepath.Dir(d), fi.ModTime()
		}
	}
	return newest
}

// VMImageCache is the directory of cached VM disks (see vmImageCache);
// tests that build disks from the Debian image keep theirs beside it.
func VMImageCache() string { return vmImageCache }

// VMImageDir is the directory of the newest cached Debian VM image (after
// RequireVMImage): disk.qcow2, vmlinuz, initrd.img.
func VMImageDir() string { return vmImage() }

// RequireVMImage skips the test unless a cached Debian VM image and QEMU
// are there.
func RequireVMImage(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	if vmImage() == "" {
		t.Skipf("needs the Debian VM image that internal/backend/vm's tests build under %s (run them first: go test ./internal/backend/vm/)", vmImageCache)
	}
	if _, err := vm.New(vm.Config{RunDir: t.TempDir(), ImageDir: t.TempDir()}); err != nil {
		t.Skipf("vm backend unavailable: %v", err)
	}
}

// AdoptVMImage installs the newest cached Debian VM image (see RequireVMImage) as
// ref into the VM image store of a server's data dir, before or while the
// server runs.
func AdoptVMImage(t testing.TB, dataDir, ref string) {
	t.Helper()
	b, err := vm.New(vm.Config{RunDir: filepath.Join(dataDir, "vms"), ImageDir: filepath.Join(dataDir, "vm-images")})
	if err == nil {
		_, err = b.Images().Adopt(vmImage(), ref)
	}
	if err != nil {
		t.Fatalf("adopt vm image: %v", err)
	}
}

// RFBFirstFrame completes an RFB 3.8 handshake (security type None) over
// a live view websocket, asks for the whole screen and reads the first
// rectangle's header; it returns the screen's and the rectangle's sizes.
func RFBFirstFrame(t testing.TB, ws *websocket.Conn) (w, h, rw, rh int) {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(2 * time.Minute))
	r := &wsReader{ws: ws}
	send := func(p []byte) {
		t.Helper()
		if err := ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
			t.Fatal(err)
		}
	}
	read := func(n int) []byte {
		t.Helper()
		p := make([]byte, n)
		if _, err := io.ReadFull(r, p); err != nil {
			t.Fatalf("rfb: %v", err)
		}
		return p
	}
	version := read(12)
	if !bytes.HasPrefix(version, []byte("RFB 003.00")) {
		t.Fatalf("rfb: protocol version %q", version)
	}
	send([]byte("RFB 003.008\n"))
	types := read(int(read(1)[0]))
	if !bytes.Contains(types, []byte{1}) {
		t.Fatalf("rfb: security types %v lack None (1)", types)
	}
	send([]byte{1})
	if res := binary.BigEndian.Uint32(read(4)); res != 0 {
		t.Fatalf("rfb: security result %d", res)
	}
	send([]byte{1}) // ClientInit: shared
	init := read(24)
	read(int(binary.BigEndian.Uint32(init[20:]))) // the desktop's name
	sw, sh := binary.BigEndian.Uint16(init[0:]), binary.BigEndian.Uint16(init[2:])
	if sw == 0 || sh == 0 {
		t.Fatalf("rfb: server init: framebuffer %dx%d", sw, sh)
	}
	// FramebufferUpdateRequest, not incremental, of the whole screen.
	req := []byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(req[6:], sw)
	binary.BigEndian.PutUint16(req[8:], sh)
	send(req)
	hdr := read(4)
	if hdr[0] != 0 || binary.BigEndian.Uint16(hdr[2:]) == 0 {
		t.Fatalf("rfb: framebuffer update: header % x, want type 0 with rectangles", hdr)
	}
	rect := read(12)
	return int(sw), int(sh), int(binary.BigEndian.Uint16(rect[4:])), int(binary.BigEndian.Uint16(rect[6:]))
}

// wsReader reads a websocket's binary messages as one byte stream.
type wsReader struct {
	ws  *websocket.Conn
	cur io.Reader
}

func (r *wsReader) Read(p []byte) (int, error) {
	for {
		if r.cur != nil {
			n, err := r.cur.Read(p)
			if n > 0 {
				return n, nil
			}
			if err != io.EOF {
				return 0, err
			}
		}
		_, next, err := r.ws.NextReader()
		if err != nil {
			return 0, err
		}
		r.cur = next
	}
}

// AssertWSClosed fails the test unless the server ends ws (a read fails
// other than by timing out) within a minute; what says what should have
// ended it.
func AssertWSClosed(t testing.TB, ws *websocket.Conn, what string) {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("websocket still open a minute after %s", what)
			}
			return
		}
	}
}
