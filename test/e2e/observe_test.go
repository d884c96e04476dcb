package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// scrape parses the node's /metrics.
func scrape(t *testing.T, srv *testenv.Server) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(metrics(t, srv)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// sample finds the series of family name whose labels include want.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

func histCount(fams map[string]*dto.MetricFamily, op string) uint64 {
	m := sample(fams, "corral_sandbox_operation_duration_seconds", map[string]string{"backend": "container", "operation": op})
	if m == nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}

func TestMetricsHistogramsMove(t *testing.T) {
	srv := testenv.StartServer(t, func(c *server.Config) { c.MetricsPerSandbox = true; onePool(c) })
	before := scrape(t, srv)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Labels: map[string]string{"test": "metrics"}})
	testenv.Sh(t, sb, "true")
	testenv.Sh(t, sb, "echo hi")
	ctx := context.Background()
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if res := call(t, srv.Client, shCall("echo ok")); res.Verdict != client.VerdictOK {
		t.Fatalf("fncall: %+v", res)
	}
	// The per-sandbox gauges show the node's next sample.
	var mem *dto.Metric
	for deadline := time.Now().Add(10 * time.Second); mem == nil && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		mem = sample(scrape(t, srv), "corral_sandbox_memory_bytes", map[string]string{"sandbox": sb.ID(), "backend": "container"})
	}
	if mem == nil || mem.GetGauge().GetValue() <= 0 {
		t.Errorf("per-sandbox memory gauge: %v", mem)
	}
	after := scrape(t, srv)
	if m := sample(after, "corral_fncall_calls_total", map[string]string{"verdict": "ok"}); m == nil || m.GetCounter().GetValue() != 1 {
		t.Errorf("fncall verdicts: %v", m)
	}
	if m := sample(after, "corral_fncall_pool_sandboxes", map[string]string{"kind": "total"}); m == nil || m.GetGauge().GetValue() < 1 {
		t.Errorf("fncall pool size: %v", m)
	}
	for op, want := range map[string]uint64{"create": 1, "exec": 2, "pause": 1, "resume": 1} {
		if got := histCount(after, op) - histCount(before, op); got != want {
			t.Errorf("%s histogram count moved by %d, want %d", op, got, want)
		}
	}
	if m := sample(after, "corral_sandbox_operation_duration_seconds", map[string]string{"operation": "create"}); m == nil || m.GetHistogram().GetSampleSum() <= 0 {
		t.Errorf("create histogram has no time in it: %v", m)
	}
	if m := sample(after, "corral_sandboxes", map[string]string{"backend": "container", "state": "running", "project": ""}); m == nil || m.GetGauge().GetValue() < 1 {
		t.Errorf("corral_sandboxes{container,running}: %v", m)
	}
	if m := sample(after, "corral_api_requests_total", map[string]string{"method": "SandboxService/Create", "code": "ok"}); m == nil || m.GetCounter().GetValue() < 1 {
		t.Errorf("API requests: %v", m)
	}
	if m := sample(after, "corral_node_resources", map[string]string{"kind": "committed", "resource": "memory_bytes"}); m == nil || m.GetGauge().GetValue() <= 0 {
		t.Errorf("committed memory: %v", m)
	}
	if m := sample(after, "corral_events_total", map[string]string{"type": "created"}); m == nil || m.GetCounter().GetValue() < 1 {
		t.Errorf("created events: %v", m)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if got := histCount(scrape(t, srv), "delete") - histCount(before, "delete"); got != 1 {
		t.Errorf("delete histogram count moved by %d, want 1", got)
	}
}

// memoryCgroupFile reads a file of a sandbox's memory cgroup: v1Name on a
// host with the v1 memory controller (v1 true), else v2Name.
func memoryCgroupFile(t *testing.T, parent, id, v1Name, v2Name string) (content string, v1 bool) {
	t.Helper()
	if b, err := os.ReadFile("/sys/fs/cgroup/memory/" + parent + "/" + id + "/" + v1Name); err == nil {
		return string(b), true
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/" + parent + "/" + id + "/" + v2Name); err == nil {
		return string(b), false
	}
	t.Fatalf("no memory cgroup for %s under %s", id, parent)
	return "", false
}

// cgroupMemory reads a sandbox's charged memory from its memory cgroup.
func cgroupMemory(t *testing.T, parent, id string) int64 {
	t.Helper()
	b, _ := memoryCgroupFile(t, parent, id, "memory.usage_in_bytes", "memory.current")
	v, err := strconv.ParseInt(strings.TrimSpace(b), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestStatsCLIMatchesMemoryCgroup(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Resources: client.Resources{MemoryBytes: 256 << 20}})
	// 48 MiB in the sandbox's tmpfs is charged to its memory cgroup.
	testenv.Sh(t, sb, "head -c 50331648 /dev/zero > /dev/shm/fill")
	out, err := exec.Command(filepath.Join(testenv.Binaries(t), "corral"), "--addr", srv.Addr, "stats", "--no-stream", "--json", sb.ID()).Output()
	if err != nil {
		t.Fatalf("corral stats: %v", err)
	}
	cg := cgroupMemory(t, srv.Config.CgroupParent, sb.ID())
	var list []struct { // the CLI's JSON: the API's field names
		State            string `json:"state"`
		MemoryLimitBytes int64  `json:"memory_limit_bytes"`
		Current          struct {
			MemoryBytes int64 `json:"memory_bytes"`
			Pids        int64 `json:"pids"`
		} `json:"current"`
	}
	if err := json.Unmarshal(out, &list); err != nil || len(list) != 1 {
		t.Fatalf("corral stats --json: %v\n%s", err, out)
	}
	got := list[0].Current.MemoryBytes
	if got < 48<<20 || float64(got) < 0.9*float64(cg) || float64(got) > 1.1*float64(cg) {
		t.Errorf("stats memory %d, memory cgroup %d: want within 10%% (and at least the 48 MiB written)", got, cg)
	}
	if list[0].MemoryLimitBytes != 256<<20 || list[0].Current.Pids < 1 || list[0].State != "running" {
		t.Errorf("stats: %+v", list[0])
	}
	table, err := exec.Command(filepath.Join(testenv.Binaries(t), "corral"), "--addr", srv.Addr, "stats", "--no-stream").Output()
	if err != nil || !strings.Contains(string(table), sb.ID()) || !strings.Contains(string(table), "MEM USAGE / LIMIT") {
		t.Errorf("corral stats --no-stream: %v\n%s", err, table)
	}
	// The history grows with the node's sampling.
	time.Sleep(5 * time.Second)
	hist, err := srv.Client.Stats(context.Background(), client.StatsOptions{IDs: []string{sb.ID()}, History: true})
	if err != nil || len(hist) != 1 || len(hist[0].History) < 2 || len(hist[0].RecentExecs) != 1 {
		t.Errorf("stats history: %+v %v", hist, err)
	}
	if _, err := srv.Client.Stats(context.Background(), client.StatsOptions{IDs: []string{"nosuch"}}); !client.IsInvalidArgument(err) {
		t.Errorf("stats of a bad id: %v", err)
	}
}

func TestMemoryBombYieldsOOMKilledEvent(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Resources: client.Resources{MemoryBytes: 64 << 20}})
	res := testenv.Run(t, sb, client.Command{Shell: `x=$(head -c 200000000 /dev/zero | tr '\0' a); echo ${#x}`, Timeout: time.Minute})
	if res.ExitCode == 0 {
		t.Fatalf("memory bomb exited 0: %q", res.Stdout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	zero := uint64(0)
	for e, err := range srv.Client.Events(ctx, client.EventOptions{After: &zero, SandboxIDs: []string{sb.ID()}, Types: []string{client.EventOOMKilled}}) {
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		if e.SandboxID != sb.ID() || e.Figures["memory_limit_bytes"] != 64<<20 || e.Reason == "" {
			t.Errorf("oom_killed event: %+v", e)
		}
		return
	}
	t.Fatal("no oom_killed event")
}

func TestEventsResumeAcrossDaemonRestart(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	c := d.start()
	sb, err := c.Create(ctx, client.CreateOptions{Labels: map[string]string{"run": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	before := readEvents(t, c, 0, 4) // created, started, paused, resumed
	mid := before[1].Seq             // resume after "started"

	d.stop(syscall.SIGKILL) // a crash: nothing is flushed on the way out
	c = d.start("--cleanup-on-exit")
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	got := readEvents(t, c, mid, 3) // paused, resumed, then deleted after the restart
	for i, e := range got {
		if e.Seq != mid+uint64(i)+1 {
			t.Fatalf("event %d after %d has seq %d: a gap or a duplicate (%+v)", i, mid, e.Seq, got)
		}
	}
	if types := []string{got[0].Type, got[1].Type, got[2].Type}; strings.Join(types, ",") != "paused,resumed,deleted" || got[2].SandboxID != sb.ID() {
		t.Errorf("events after %d: %+v", mid, got)
	}
	if got[0].Seq != before[2].Seq || !got[0].Time.Equal(before[2].Time) {
		t.Errorf("replayed event %+v differs from the one seen before the restart %+v", got[0], before[2])
	}

	// The CLI replays the same, one line per event, and follows on.
	sock := "unix://" + filepath.Join(d.dataDir, "corral.sock")
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cli := exec.CommandContext(cctx, filepath.Join(d.bins, "corral"), "--addr", sock, "events",
		"--since", strconv.FormatUint(mid, 10), "--filter", "sandbox="+sb.ID(), "--filter", "label=run=a")
	out, err := cli.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.Contains(sc.Text(), " deleted "+sb.ID()) {
			break
		}
	}
	_ = cli.Process.Kill()
	_ = cli.Wait()
	if len(lines) != 3 || !strings.HasPrefix(lines[0], strconv.FormatUint(mid+1, 10)+" ") || !strings.Contains(lines[0], " paused "+sb.ID()) {
		t.Errorf("corral events --since %d:\n%s", mid, strings.Join(lines, "\n"))
	}
	if out, err := exec.Command(filepath.Join(d.bins, "corral"), "--addr", sock, "events", "--filter", "colour=red").CombinedOutput(); err == nil || !strings.Contains(string(out), "--filter") {
		t.Errorf("corral events with a bad filter: %v %s", err, out)
	}
	d.stopLeavingNothing()
}

// readEvents reads n events after seq (that match filter, if given).
func readEvents(t *testing.T, c *client.Client, after uint64, n int, filter ...client.EventOptions) []client.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var o client.EventOptions
	if len(filter) > 0 {
		o = filter[0]
	}
	o.After = &after
	var out []client.Event
	for e, err := range c.Events(ctx, o) {
		if err != nil {
			t.Fatalf("events after %d: %v (got %+v)", after, err, out)
		}
		out = append(out, e)
		if len(out) == n {
			return out
		}
	}
	t.Fatalf("events after %d: got %+v, want %d", after, out, n)
	return nil
}

func TestStopAndTimeoutEventsCarryTheReason(t *testing.T) {
	srv := testenv.StartServer(t)
	idle, life := time.Second, 2*time.Second
	idler := testenv.NewSandbox(t, srv.Client, client.CreateOptions{IdleTimeout: &idle})
	busy := testenv.NewSandbox(t, srv.Client, client.CreateOptions{MaxLifetime: &life})
	res := testenv.Run(t, busy, client.Command{Shell: "sleep 5", Timeout: 200 * time.Millisecond})
	if !res.TimedOut {
		t.Fatalf("exec did not time out: %+v", res)
	}
	want := map[string]string{
		client.EventIdleStopped + " " + idler.ID():    "idle_timeout",
		client.EventLifetimeReached + " " + busy.ID(): "max_lifetime",
		client.EventExecTimedOut + " " + busy.ID():    "sleep 5",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	zero := uint64(0)
	for e, err := range srv.Client.Events(ctx, client.EventOptions{After: &zero,
		Types: []string{client.EventIdleStopped, client.EventLifetimeReached, client.EventExecTimedOut}}) {
		if err != nil {
			t.Fatalf("events: %v (still missing %v)", err, want)
		}
		key := e.Type + " " + e.SandboxID
		if sub, ok := want[key]; ok {
			if !strings.Contains(e.Reason, sub) {
				t.Errorf("%s: reason %q lacks %q", key, e.Reason, sub)
			}
			delete(want, key)
		}
		if len(want) == 0 {
			return
		}
	}
}
