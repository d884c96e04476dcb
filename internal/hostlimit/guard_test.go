package hostlimit

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

func fakeProc(t *testing.T, files map[string]string) {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := procRoot
	procRoot = dir
	t.Cleanup(func() { procRoot = old })
}

func TestReadKernelFigures(t *testing.T) {
	fakeProc(t, map[string]string{
		"loadavg":     "0.50 0.40 0.30 3/1234 999\n",
		"meminfo":     "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   20000000 kB\n",
		"self/status": "Name:\tcorral\nThreads:\t38\n",
	})
	if n, err := tasks(); err != nil || n != 1234 {
		t.Fatalf("tasks = %d, %v; want 1234", n, err)
	}
	total, avail, err := memInfo()
	if err != nil || total != 24000000<<10 || avail != 20000000<<10 {
		t.Fatalf("memInfo = %d, %d, %v", total, avail, err)
	}
	if n, err := ownThreads(); err != nil || n != 38 {
		t.Fatalf("ownThreads = %d, %v; want 38", n, err)
	}
}

// guardWith is a Guard over one PID resource whose use the test sets.
func guardWith(limit, reserve int64, used *int64) *Guard {
	g := &Guard{cfg: Config{Costs: map[string]Cost{"container": {PIDs: 4, KernelPIDs: 1}}}}
	g.res = []*resource{{name: "host PIDs (kernel.pid_max)", limit: limit, reserve: reserve, need: pidsNeed,
		use: func() (int64, error) { return *used, nil }}}
	g.sample()
	return g
}

func TestAdmitRefusesPastTheLimitNamingIt(t *testing.T) {
	used := int64(900)
	g := guardWith(1000, 50, &used)
	// 950 usable: 900 used leaves room for 10 sandboxes of 5 PIDs.
	for i := range 10 {
		if err := g.Admit("container", 0, 0); err != nil {
			t.Fatalf("create %d refused with room left: %v", i, err)
		}
	}
	err := g.Admit("container", 0, 0)
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("create past the limit: got %v, want resource exhausted", err)
	}
	for _, want := range []string{"kernel.pid_max", "limit 1000", "in use 950", "50 kept", "needs 5"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	// A fresh reading that shows PIDs given back admits again.
	used = 900
	g.sampledAt = time.Time{}
	if err := g.Admit("container", 0, 0); err != nil {
		t.Fatalf("after the use fell: %v", err)
	}
}

func TestAdmitTracksPIDsPerSandbox(t *testing.T) {
	used := int64(0)
	g := guardWith(1000, 0, &used)
	dir := t.TempDir()
	g.pidsDirs = []string{dir}
	// 20 sandboxes holding 400 tasks: 20 each, not the estimate of 4.
	if err := os.WriteFile(filepath.Join(dir, "pids.current"), []byte("400\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g.sampledAt = time.Time{}
	if err := g.Admit("container", 20, 0); err != nil {
		t.Fatal(err)
	}
	if c := g.cost("container"); c.PIDs != 20 {
		t.Fatalf("tracked cost %d PIDs, want 20", c.PIDs)
	}
	// Creates still being made count at full cost on top of the reading.
	g.sampledAt = time.Time{}
	if err := g.Admit("container", 20, 3); err != nil {
		t.Fatal(err)
	}
	if want := int64(4 * 21); pidsNeed(g.since) != want {
		t.Fatalf("counted %d PIDs since the reading, want %d (3 creating and this one)", pidsNeed(g.since), want)
	}
	// Read at every decision, PIDs count only the creates in flight: 958
	// used + 21 in flight leave room for exactly one more of 21, 980 none.
	g.res[0].everyTime = true
	used = 958
	if err := g.Admit("container", 20, 1); err != nil {
		t.Fatalf("958 used + 21 in flight + 21 of 1000: %v", err)
	}
	used = 980
	if err := g.Admit("container", 20, 0); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("980 used + 21 of 1000: got %v, want resource exhausted", err)
	}
	if c := g.cost("container"); c.PIDs != 20 {
		t.Fatalf("tracked cost %d PIDs, want 20", c.PIDs)
	}
	// Other backends keep their own estimate.
	if c := g.cost("microvm"); c.PIDs != DefaultCosts["microvm"].PIDs {
		t.Fatalf("microvm cost %d", c.PIDs)
	}
}

func TestUnreadableUseIsSkipped(t *testing.T) {
	g := &Guard{log: discard()}
	g.res = []*resource{{name: "x", limit: 1, need: pidsNeed, use: func() (int64, error) { return 0, os.ErrNotExist }}}
	g.sample()
	if err := g.Admit("container", 0, 0); err != nil {
		t.Fatalf("an unreadable resource refused: %v", err)
	}
}

func TestApplyCapReplacesAnyOther(t *testing.T) {
	dir := t.TempDir()
	g := &Guard{pidCap: 500, log: discard()}
	for _, before := range []string{"max\n", "100\n", "9000\n"} {
		if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(before), 0o644); err != nil {
			t.Fatal(err)
		}
		g.applyCap(dir)
		if b, _ := os.ReadFile(filepath.Join(dir, "pids.max")); strings.TrimSpace(string(b)) != "500" {
			t.Fatalf("pids.max %q -> %q, want 500", before, b)
		}
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestAdmitKeepsServingHeadroom(t *testing.T) {
	used := int64(840)
	g := guardWith(1000, 0, &used)
	g.cfg.Costs["container"] = Cost{PIDs: 1, KernelPIDs: 1, ServePIDs: 8}
	g.res[0].everyTime = true
	// 840 used by no sandbox: 10 PIDs fit.
	if err := g.Admit("container", 0, 0); err != nil {
		t.Fatalf("840 used, no sandbox held: %v", err)
	}
	// 20 idle sandboxes held keep 8 each for their servers: 840 + 160 + 10
	// is past 1000.
	err := g.Admit("container", 20, 0)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "in use 1000") {
		t.Fatalf("840 used + 20 sandboxes' headroom: got %v, want resource exhausted at 1000 in use", err)
	}
	used = 830
	if err := g.Admit("container", 20, 0); err != nil {
		t.Fatalf("830 used + 160 headroom + 10: %v", err)
	}
	// With a quarter of them serving at once, 5 keep headroom: 900 + 40 +
	// 10 fits, 950 + 40 + 10 does not.
	g.cfg.ServingShare = 0.25
	used = 900
	if err := g.Admit("container", 20, 0); err != nil {
		t.Fatalf("900 used + 5 serving of 20 held: %v", err)
	}
	used = 951
	if err := g.Admit("container", 20, 0); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("951 used + 5 serving of 20 held: got %v, want resource exhausted", err)
	}
}
