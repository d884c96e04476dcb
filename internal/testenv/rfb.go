package testenv

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/corral-dev/corral/internal/backend/vm"
)

// VMImageCache is where internal/backend/vm's tests keep the Debian VM
// image they build; other tests adopt it with AdoptVMImage.
var VMImageCache = filepath.Join(os.TempDir(), "corral-vm-image-cache", vm.DebianRecipe)

// RequireVMImage skips the test unless the cached Debian VM image and
// QEMU are there.
func RequireVMImage(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat(filepath.Join(VMImageCache, "disk.qcow2")); err != nil {
		t.Skipf("needs the Debian VM image that internal/backend/vm's tests build into %s: %v", VMImageCache, err)
	}
	if _, err := vm.New(vm.Config{RunDir: t.TempDir(), ImageDir: t.TempDir()}); err != nil {
		t.Skipf("vm backend unavailable: %v", err)
	}
}

// AdoptVMImage installs the cached Debian VM image (see RequireVMImage) as
// ref into the VM image store of a server's data dir, before or while the
// server runs.
func AdoptVMImage(t testing.TB, dataDir, ref string) {
	t.Helper()
	b, err := vm.New(vm.Config{RunDir: filepath.Join(dataDir, "vms"), ImageDir: filepath.Join(dataDir, "vm-images")})
	if err == nil {
		_, err = b.Images().Adopt(VMImageCache, ref)
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
