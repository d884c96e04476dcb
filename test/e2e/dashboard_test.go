package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// chromium starts headless Chromium with a fresh profile and nothing that
// phones home; it skips the test when Chromium is not installed.
func chromium(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("needs Debian's chromium (apt-get install chromium; scripts/deps.sh installs it)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1300),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("no-default-browser-check", true),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	return ctx
}

func TestDashboardShowsNodeAndSandbox(t *testing.T) {
	ctx := chromium(t)
	srv := testenv.StartServer(t, func(c *server.Config) { c.Listen = "127.0.0.1:0" })
	// The page, like any TCP caller, acts with a token: an operator's of
	// project ops, whose sandboxes it shows.
	mustProject(t, srv.Client, "ops", client.Quota{})
	_, secret, err := srv.Client.CreateToken(context.Background(), client.TokenOptions{Project: "ops", Role: "member"})
	if err != nil {
		t.Fatal(err)
	}
	ops, err := client.New(srv.TCPAddr(), client.WithToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ops.Close() })
	sb := testenv.NewSandbox(t, ops, client.CreateOptions{Labels: map[string]string{"task": "dashboard"}})
	testenv.Sh(t, sb, "echo dashboard-exec")

	consoleCtx, stopConsole := context.WithCancel(ctx)
	messages := chromedp.Console(consoleCtx) // subscribed before the page loads
	var problems []string
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				problems = append(problems, m.String())
			}
		}
	}()
	url := "http://" + srv.TCPAddr() + "/ui/?token=" + secret
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("load %s: %v", url, err)
	}

	// The node and the live sandbox show within 5 s.
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	js := fmt.Sprintf(`document.querySelector("#nodes tbody").innerText.includes(%q) && document.querySelector("#sandboxes tbody").innerText.includes(%q)`, srv.NodeID(), sb.ID())
	_, err = chromedp.Run(wait, chromedp.Poll[bool](js, chromedp.WithPollingInterval(100*time.Millisecond)))
	cancel()
	if err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		t.Fatalf("node %s and sandbox %s not shown within 5s: %v\n%s", srv.NodeID(), sb.ID(), err, body)
	}

	// Some traffic for the charts: a few more creates and deletes.
	for range 4 {
		extra := testenv.NewSandbox(t, ops, client.CreateOptions{})
		testenv.Sh(t, extra, "true")
		if err := extra.Delete(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond)
	}
	// A few polls in, every chart has drawn on its canvas.
	time.Sleep(2 * time.Second)
	drawn, err := chromedp.Run(ctx, chromedp.Evaluate[[]bool](`[...document.querySelectorAll("section.charts canvas")].filter(c => c.offsetParent !== null).map(c => {
		const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
		for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) return true;
		return false;
	})`))
	if err != nil {
		t.Fatal(err)
	}
	if len(drawn) < 5 {
		t.Errorf("%d chart canvases, want the 5 charts", len(drawn))
	}
	for i, ok := range drawn {
		if !ok {
			t.Errorf("chart canvas %d is empty", i)
		}
	}

	// The table's filter hides what does not match and shows what does.
	rows := func(filter string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`(() => {
			const f = document.getElementById("filter");
			f.value = %q; f.dispatchEvent(new Event("input"));
			return new Promise(ok => setTimeout(() => ok(document.querySelectorAll("#sandboxes tbody tr").length), 1500));
		})()`, filter), chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("filter %q: %v", filter, err)
		}
		return n
	}
	if n := rows("task=nosuch"); n != 0 {
		t.Errorf("filter task=nosuch shows %d rows", n)
	}
	if n := rows("task=dashboard"); n != 1 {
		t.Errorf("filter task=dashboard shows %d rows, want the sandbox", n)
	}

	// The sandbox's detail shows its recent exec.
	wait, cancel = context.WithTimeout(ctx, 10*time.Second)
	err = chromedp.Do(wait, chromedp.Click(chromedp.CSS(fmt.Sprintf(`#sandboxes tr[data-id=%q]`, sb.ID()))))
	if err == nil {
		_, err = chromedp.Run(wait, chromedp.Poll[bool](`document.querySelector("#execs tbody").innerText.includes("dashboard-exec")`))
	}
	cancel()
	if err != nil {
		execs, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#execs")))
		t.Errorf("sandbox detail: %v (execs %q)", err, execs)
	}
	time.Sleep(time.Second) // one more poll draws the detail charts

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("CORRAL_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "dashboard.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard screenshot: %s", shot)

	stopConsole()
	<-consoleDone
	if len(problems) > 0 {
		t.Errorf("browser console errors:\n%s", strings.Join(problems, "\n"))
	}
}
