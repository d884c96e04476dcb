package e2e

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/gorilla/websocket"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestLiveViewOfAVM boots one Debian VM through the API and opens its
// live view: the token opens the websocket once, the RFB handshake with
// security type None completes and a full framebuffer update arrives;
// no, a wrong, a used, an expired or another sandbox's token gets
// 401/403 and no relay; deleting the sandbox closes the live connection.
func TestLiveViewOfAVM(t *testing.T) {
	testenv.RequireVMImage(t)
	const ref = "debian@liveview"
	srv := testenv.StartServer(t, func(cfg *server.Config) {
		// Into the server's own store before it starts.
		testenv.AdoptVMImage(t, cfg.DataDir, ref)
		cfg.Listen = "127.0.0.1:0" // for the browser
	})
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	a := bootVM(ctx, t, c, ref)
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

	w, h, rw, rh := testenv.RFBFirstFrame(t, ws)
	if rw == 0 || rh == 0 {
		t.Fatalf("first rectangle %dx%d, want a non-empty one", rw, rh)
	}
	t.Logf("live view: %dx%d screen, first rectangle %dx%d %v after connecting", w, h, rw, rh, time.Since(start).Round(time.Millisecond))

	t.Run("noVNC page", func(t *testing.T) { liveViewPage(t, c, srv.TCPAddr(), a.ID()) })

	// Deleting the sandbox ends the live connection.
	if err := a.Delete(ctx); err != nil {
		t.Fatalf("delete: %v", err)
	}
	deleted = true
	testenv.AssertWSClosed(t, ws, "the delete")
	if _, err := c.LiveView(ctx, a.ID(), 0); !client.IsNotFound(err) {
		t.Errorf("live view of a deleted sandbox: %v, want not_found", err)
	}
}

// liveViewPage opens the dashboard's viewer page (noVNC) in headless
// Chromium with a fresh token and waits until it is connected and its
// canvas shows the console's text; the token leaves the address bar.
func liveViewPage(t *testing.T, c *client.Client, addr, id string) {
	bctx := chromium(t)
	lv, err := c.LiveView(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := bctx
	bctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()
	url := "http://" + addr + "/ui/liveview.html#path=" + lv.Path + "&token=" + lv.Token
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("load the viewer page: %v", err)
	}
	status := func() string {
		s, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#status")))
		return s
	}
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.getElementById('status').textContent.startsWith('connected')`)); err != nil {
		t.Fatalf("viewer page never connected: %v (status %q)", err, status())
	}
	// Lit pixels: the console's text on its black background.
	canvas, err := chromedp.Run(bctx, chromedp.Poll[[]int](`(() => {
		const c = document.querySelector('#screen canvas');
		if (!c || !c.width) return false;
		const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
		let lit = 0;
		for (let i = 0; i < d.length; i += 4) if (d[i] | d[i+1] | d[i+2]) lit++;
		return lit > 0 ? [c.width, c.height, lit] : false;
	})()`))
	if err != nil || len(canvas) != 3 {
		t.Fatalf("viewer page's canvas never showed the screen: %v %v (status %q)", canvas, err, status())
	}
	if hash, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`location.hash`)); hash != "" {
		t.Errorf("the token stayed in the address bar: %q", hash)
	}
	t.Logf("viewer page: %q, canvas %dx%d with %d lit pixels", status(), canvas[0], canvas[1], canvas[2])
}

// TestLiveViewRefusesForgedTokens: without booting a VM, the SDK's
// DialLiveView reaches the endpoint over the unix socket and a made-up
// token or none is refused before anything is relayed.
func TestLiveViewRefusesForgedTokens(t *testing.T) {
	srv := testenv.StartServer(t)
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb := testenv.NewSandbox(t, c, client.CreateOptions{})
	for _, lv := range []struct {
		grant client.LiveView
		want  string
	}{
		{client.LiveView{Path: "/v1/liveview/" + sb.ID(), Token: "0123456789abcdef01.forged"}, "HTTP 403"},
		{client.LiveView{Path: "/v1/liveview/" + sb.ID()}, "HTTP 401"},
	} {
		conn, err := c.DialLiveView(ctx, lv.grant)
		if err == nil {
			conn.Close()
			t.Fatalf("token %q opened a live view", lv.grant.Token)
		}
		if !strings.Contains(err.Error(), lv.want) {
			t.Errorf("token %q: %v, want %s", lv.grant.Token, err, lv.want)
		}
	}
}
