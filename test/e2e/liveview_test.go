package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/backend/vm"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// vmImageCache is where internal/backend/vm's tests keep the Debian image
// they build (built there: this test only adopts it).
var vmImageCache = filepath.Join(os.TempDir(), "corral-vm-image-cache", vm.DebianRecipe)

// TestLiveViewOfAVM boots one Debian VM through the API and opens its
// live view: the token opens the websocket once, the RFB handshake with
// security type None completes and a full framebuffer update arrives;
// no, a wrong, a used, an expired or another sandbox's token gets
// 401/403 and no relay; deleting the sandbox closes the live connection.
func TestLiveViewOfAVM(t *testing.T) {
	if _, err := os.Stat(filepath.Join(vmImageCache, "disk.qcow2")); err != nil {
		t.Skipf("live view: needs the Debian VM image that internal/backend/vm's tests build into %s: %v", vmImageCache, err)
	}
	const ref = "debian@liveview"
	var adoptErr error
	srv := testenv.StartServer(t, func(cfg *server.Config) {
		// The image goes into the server's own store before it starts.
		b, err := vm.New(vm.Config{RunDir: filepath.Join(cfg.DataDir, "vms"), ImageDir: filepath.Join(cfg.DataDir, "vm-images")})
		if err == nil {
			_, err = b.Images().Adopt(vmImageCache, ref)
		}
		adoptErr = err
	})
	if adoptErr != nil {
		t.Skipf("live view: vm backend unavailable: %v", adoptErr)
	}
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	boot := time.Now()
	a, err := c.Create(ctx, client.CreateOptions{Backend: "vm", Image: ref,
		Resources: client.Resources{CPUMillis: 1000, MemoryBytes: 512 << 20}})
	if err != nil {
		t.Fatalf("create vm: %v", err)
	}
	t.Logf("vm booted in %v", time.Since(boot).Round(time.Millisecond))
	deleted := false
	defer func() {
		if !deleted {
			_ = a.Delete(context.Background())
		}
	}()
	b := testenv.NewSandbox(t, c, client.CreateOptions{})

	sock := filepath.Join(srv.Config.DataDir, "corral.sock")
	dialer := websocket.Dialer{
		NetDialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		HandshakeTimeout: time.Minute,
	}
	open := func(path string) (*websocket.Conn, int, error) {
		ws, resp, err := dialer.DialContext(ctx, "ws://corral"+path, nil)
		code := 0
		if resp != nil {
			code = resp.StatusCode
			resp.Body.Close()
		}
		return ws, code, err
	}
	refused := func(what, path string, want int) {
		t.Helper()
		ws, code, err := open(path)
		if err == nil {
			ws.Close()
			t.Fatalf("%s: the websocket opened, want HTTP %d", what, want)
		}
		if code != want {
			t.Fatalf("%s: HTTP %d (%v), want %d", what, code, err, want)
		}
	}

	// Bad requests name their field; a container has no screen.
	if _, err := c.LiveView(ctx, a.ID(), -time.Second); !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "ttl_seconds") {
		t.Errorf("ttl -1s: %v, want invalid_argument naming ttl_seconds", err)
	}
	if _, err := c.LiveView(ctx, b.ID(), 0); !client.IsUnimplemented(err) {
		t.Errorf("live view of a container: %v, want unimplemented", err)
	}

	lv, err := c.LiveView(ctx, a.ID(), 0)
	if err != nil {
		t.Fatalf("live view: %v", err)
	}
	if lv.Path != "/v1/liveview/"+a.ID() || lv.Token == "" || time.Until(lv.Expires) < 30*time.Second {
		t.Fatalf("live view: %+v", lv)
	}
	refused("no token", lv.Path, http.StatusUnauthorized)
	refused("a wrong token", lv.Path+"?token="+lv.Token[:len(lv.Token)-2]+"xx", http.StatusForbidden)
	refused("a token of another sandbox", "/v1/liveview/"+b.ID()+"?token="+lv.Token, http.StatusForbidden)
	short, err := c.LiveView(ctx, a.ID(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	refused("an expired token", short.URLPath(), http.StatusForbidden)

	// The right token, tried on the wrong sandbox above, still opens A once.
	start := time.Now()
	ws, code, err := open(lv.URLPath())
	if err != nil {
		t.Fatalf("open live view: HTTP %d: %v", code, err)
	}
	defer ws.Close()
	refused("a used token", lv.URLPath(), http.StatusForbidden)

	w, h := rfbHandshake(t, ws)
	if w == 0 || h == 0 {
		t.Fatalf("server init: framebuffer %dx%d", w, h)
	}
	// FramebufferUpdateRequest, not incremental, of the whole screen.
	req := []byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(req[6:], w)
	binary.BigEndian.PutUint16(req[8:], h)
	if err := ws.WriteMessage(websocket.BinaryMessage, req); err != nil {
		t.Fatal(err)
	}
	r := &wsReader{ws: ws}
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		t.Fatalf("framebuffer update: %v", err)
	}
	if hdr[0] != 0 || binary.BigEndian.Uint16(hdr[2:]) == 0 {
		t.Fatalf("framebuffer update: header % x, want type 0 with rectangles", hdr)
	}
	var rect [12]byte
	if _, err := io.ReadFull(r, rect[:]); err != nil {
		t.Fatal(err)
	}
	rw, rh := binary.BigEndian.Uint16(rect[4:]), binary.BigEndian.Uint16(rect[6:])
	if rw == 0 || rh == 0 {
		t.Fatalf("first rectangle %dx%d, want a non-empty one", rw, rh)
	}
	t.Logf("live view: %dx%d screen, first rectangle %dx%d (encoding %d) %v after connecting",
		w, h, rw, rh, int32(binary.BigEndian.Uint32(rect[8:])), time.Since(start).Round(time.Millisecond))

	// Deleting the sandbox ends the live connection.
	if err := a.Delete(ctx); err != nil {
		t.Fatalf("delete: %v", err)
	}
	deleted = true
	_ = ws.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("live view still open a minute after delete")
			}
			break
		}
	}
	if _, err := c.LiveView(ctx, a.ID(), 0); !client.IsNotFound(err) {
		t.Errorf("live view of a deleted sandbox: %v, want not_found", err)
	}
}

// rfbHandshake completes RFB 3.8 with security type None and returns the
// framebuffer's size from ServerInit.
func rfbHandshake(t *testing.T, ws *websocket.Conn) (w, h uint16) {
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
	return binary.BigEndian.Uint16(init[0:]), binary.BigEndian.Uint16(init[2:])
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
