// Package e2e tests corral end to end: a real server (in this process or as
// a subprocess), real container sandboxes, driven through the Go SDK.
package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

func TestExecStreamsOutputAndExitCode(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Env: map[string]string{"GREETING": "hello"}, Workdir: "/tmp"})
	var stdout, stderr bytes.Buffer
	res, err := sb.Exec(context.Background(), client.Command{
		Shell:  `echo "$GREETING $EXTRA from $(pwd)"; echo oops >&2; read line; echo "got $line"; exit 3`,
		Env:    map[string]string{"EXTRA": "world"},
		Stdin:  []byte("input\n"),
		Stdout: &stdout, Stderr: &stderr,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := stdout.String(), "hello world from /tmp\ngot input\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if stderr.String() != "oops\n" {
		t.Errorf("stderr = %q", stderr.String())
	}
	if res.ExitCode != 3 || res.Signal != 0 || res.TimedOut || res.Truncated {
		t.Errorf("result = %+v, want exit 3", res)
	}
	// argv runs without a shell: metacharacters stay literal.
	res = testenv.Run(t, sb, client.Command{Args: []string{"echo", "$HOME", ";", "ls"}})
	if string(res.Stdout) != "$HOME ; ls\n" {
		t.Errorf("argv exec stdout = %q", res.Stdout)
	}
	res = testenv.Run(t, sb, client.Command{Shell: "kill -TERM $$"})
	if res.Signal != 15 || res.ExitCode != -1 {
		t.Errorf("signalled result = %+v", res)
	}
	if out := testenv.Sh(t, sb, "id -u; id -un"); out != "0\nroot\n" {
		t.Errorf("default user: %q", out)
	}
	if out := testenv.Run(t, sb, client.Command{Args: []string{"id", "-u"}, User: "65534"}).Stdout; string(out) != "65534\n" {
		t.Errorf("user 65534: %q", out)
	}
	if out := testenv.Run(t, sb, client.Command{Args: []string{"id", "-u"}, User: "nobody"}).Stdout; string(out) != "65534\n" {
		t.Errorf("user nobody: %q", out)
	}
}

func TestSandboxSeesOnlyItsOwnProcesses(t *testing.T) {
	srv := testenv.StartServer(t)
	a := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	b := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	testenv.Sh(t, a, "sleep 1000 >/dev/null 2>&1 &")
	out := testenv.Sh(t, b, "ps -o pid,comm")
	if strings.Contains(out, "sleep") {
		t.Errorf("sandbox b sees a's sleep:\n%s", out)
	}
	pids := strings.Fields(testenv.Sh(t, b, "ls -d /proc/[0-9]* | wc -l"))
	if len(pids) != 1 || pids[0] == "" {
		t.Fatalf("bad pid count output %q", pids)
	}
	// init, sh, ls and wc at most: never the host's hundreds.
	if out := testenv.Sh(t, b, "ls -d /proc/[0-9]*"); strings.Count(out, "\n") > 6 {
		t.Errorf("sandbox sees too many processes:\n%s", out)
	}
	if out := testenv.Sh(t, a, "ps -o comm"); !strings.Contains(out, "sleep") {
		t.Errorf("sandbox a does not see its own sleep:\n%s", out)
	}
	if host := testenv.Sh(t, a, "hostname"); strings.TrimSpace(host) != "sandbox" {
		t.Errorf("hostname = %q", host)
	}
}

func TestImageWritesStayInTheSandbox(t *testing.T) {
	srv := testenv.StartServer(t)
	a := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	b := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	orig := testenv.Sh(t, b, "md5sum /bin/busybox /etc/passwd")
	// Replace the shell binary itself (the harness-hijack attempt), and a
	// file of the image.
	testenv.Sh(t, a, `cp /bin/busybox /tmp/busybox && exec /tmp/busybox sh -c 'rm /bin/busybox && cp /tmp/busybox /bin/busybox && echo x >> /bin/busybox && echo hacked > /etc/passwd'`)
	if got := testenv.Sh(t, a, "md5sum /bin/busybox /etc/passwd"); got == orig {
		t.Fatalf("the writes did not happen in sandbox a")
	}
	if got := testenv.Sh(t, b, "md5sum /bin/busybox /etc/passwd"); got != orig {
		t.Errorf("sandbox b sees a's writes:\nbefore %s\nafter  %s", orig, got)
	}
	c := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	if got := testenv.Sh(t, c, "md5sum /bin/busybox /etc/passwd"); got != orig {
		t.Errorf("a new sandbox sees a's writes: %s", got)
	}
	// The three share one file-backed EROFS mount of the busybox layer,
	// which a's writes did not touch.
	layers := filepath.Join(srv.Config.DataDir, "images", "layers")
	mounts := erofsMounts(t, layers)
	if len(mounts) != 1 {
		t.Fatalf("erofs mounts under %s: %v, want the busybox layer once", layers, mounts)
	}
	for mp, source := range mounts {
		if strings.HasPrefix(source, "/dev/loop") || source != mp+".erofs" {
			t.Errorf("layer %s mounted from %s, want its image file (no loop device)", mp, source)
		}
		if b, err := os.ReadFile(filepath.Join(mp, "etc/passwd")); err != nil || strings.Contains(string(b), "hacked") {
			t.Errorf("layer's etc/passwd: %q %v", b, err)
		}
	}
}

// erofsMounts returns the EROFS mounts under dir: mount point -> source.
func erofsMounts(t *testing.T, dir string) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if ok && len(fields) > 4 && len(tail) > 1 && tail[0] == "erofs" && strings.HasPrefix(fields[4], dir+"/") {
			out[fields[4]] = tail[1]
		}
	}
	return out
}

func TestMemoryLimitOOMKillsInsideOnly(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Resources: client.Resources{MemoryBytes: 64 << 20}})
	res := testenv.Run(t, sb, client.Command{Shell: `x=$(head -c 300000000 /dev/zero | tr '\0' a); echo ${#x}`})
	if !res.OOMKilled {
		t.Fatalf("memory bomb result = %+v, want OOMKilled", res)
	}
	if out := testenv.Sh(t, sb, "echo alive"); out != "alive\n" {
		t.Errorf("sandbox after OOM: %q", out)
	}
}

func TestPidsLimitStopsForkBomb(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{Resources: client.Resources{Pids: 64}})
	other := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	res := testenv.Run(t, sb, client.Command{Shell: `bomb() { bomb | bomb & }; bomb; sleep 2; ps | wc -l`, Timeout: 20 * time.Second})
	if res.TimedOut {
		t.Logf("fork bomb timed out (expected possible): %+v", res)
	}
	if got := testenv.Sh(t, other, "echo ok"); got != "ok\n" {
		t.Errorf("other sandbox: %q", got)
	}
	count := testenv.Sh(t, other, "echo 1")
	if count != "1\n" {
		t.Errorf("other sandbox broken: %q", count)
	}
	// The bombed sandbox's process count never passed its limit.
	info, err := sb.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Resources.Pids != 64 {
		t.Errorf("pids limit recorded as %d", info.Resources.Pids)
	}
}

func TestTimeoutKillsTheProcessGroup(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	res := testenv.Run(t, sb, client.Command{Shell: "sleep 1000 & echo $! > /tmp/child; sleep 1000", Timeout: time.Second})
	if !res.TimedOut || res.Signal != 9 {
		t.Fatalf("result = %+v, want timed out by SIGKILL", res)
	}
	out := testenv.Sh(t, sb, `pid=$(cat /tmp/child); if kill -0 $pid 2>/dev/null; then echo alive; else echo gone; fi`)
	if out != "gone\n" {
		t.Errorf("background child of the timed-out command is %s", out)
	}
}

func TestBackgroundProcessesOutliveExec(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	start := time.Now()
	testenv.Sh(t, sb, "sleep 1000 >/dev/null 2>&1 & echo started")
	if time.Since(start) > 30*time.Second {
		t.Fatalf("exec waited for its background child")
	}
	if out := testenv.Sh(t, sb, "ps -o comm | grep -c sleep"); out != "1\n" {
		t.Errorf("background sleep not running: %q", out)
	}
	// A background process holding stdout open must not block the exec.
	res := testenv.Run(t, sb, client.Command{Shell: "sleep 1000 & echo done"})
	if string(res.Stdout) != "done\n" {
		t.Errorf("stdout = %q", res.Stdout)
	}
}

func TestOutputLimitTruncatesYes(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	res := testenv.Run(t, sb, client.Command{Args: []string{"yes"}, OutputLimit: 1 << 20, Timeout: time.Minute})
	if !res.Truncated {
		t.Fatalf("result = %+v, want truncated", res)
	}
	if len(res.Stdout) != 1<<20 {
		t.Errorf("got %d bytes of output, want exactly the limit %d", len(res.Stdout), 1<<20)
	}
	if res.TimedOut {
		t.Errorf("yes was not stopped by the closed pipe; it ran into the timeout")
	}
}

func TestPauseResume(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	ctx := context.Background()
	testenv.Sh(t, sb, "(i=0; while true; do i=$((i+1)); echo $i > /tmp/count; usleep 20000; done) >/dev/null 2>&1 &")
	// Read the counter from the host through the root of a process in the
	// sandbox, which does not count as a request (a file call would resume
	// it). The writable layer itself may not be visible on the host: with
	// the ext4-image disk store it is mounted only inside the sandbox.
	counter := func() string {
		t.Helper()
		pids := cgroupPids(srv.Config.CgroupParent, sb.ID())
		if len(pids) == 0 {
			t.Fatal("no process in the sandbox's cgroup")
		}
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pids[0]), "root/tmp/count"))
		if err != nil {
			t.Fatalf("counter file: %v", err)
		}
		return strings.TrimSpace(string(b))
	}
	time.Sleep(100 * time.Millisecond)
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := sb.Info(ctx); err != nil || info.State != client.StatePaused {
		t.Fatalf("state after pause = %v (%v)", info.State, err)
	}
	frozen := counter()
	time.Sleep(300 * time.Millisecond)
	if got := counter(); got != frozen {
		t.Errorf("counter moved while paused: %s -> %s", frozen, got)
	}
	if info, _ := sb.Info(ctx); info.State != client.StatePaused {
		t.Fatalf("Get resumed the sandbox: %v", info.State)
	}
	// Any other request resumes transparently.
	if _, err := sb.Files().Read(ctx, "/tmp/count"); err != nil {
		t.Fatal(err)
	}
	if info, _ := sb.Info(ctx); info.State != client.StateRunning {
		t.Fatalf("state after a file read = %v, want running", info.State)
	}
	time.Sleep(300 * time.Millisecond)
	if got := counter(); got == frozen {
		t.Errorf("counter did not advance after resume: still %s", got)
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Errorf("resume of a running sandbox: %v", err)
	}
}

// findUnder finds what the node keeps for sandbox id at depth one or two
// under dataDir (which store keeps what depends on the host): <id>/<rest...>
// and, without rest, an <id>.img disk image too.
func findUnder(dataDir, id string, rest ...string) []string {
	names := []string{filepath.Join(append([]string{id}, rest...)...)}
	if len(rest) == 0 {
		names = append(names, id+".img")
	}
	var found []string
	for _, depth := range []string{"*", "*/*"} {
		for _, name := range names {
			m, _ := filepath.Glob(filepath.Join(dataDir, depth, name))
			found = append(found, m...)
		}
	}
	return found
}

func TestReplacedShellDoesNotHijackShellExecs(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	// The agent replaces /bin/sh with a script that reports a hijack.
	testenv.Sh(t, sb, `cp /bin/busybox /tmp/busybox && exec /tmp/busybox sh -c 'rm /bin/sh && printf "#!/tmp/busybox sh\necho HIJACKED\n" > /bin/sh && chmod 755 /bin/sh'`)
	if out := testenv.Run(t, sb, client.Command{Args: []string{"/bin/sh", "-c", "echo mine"}}).Stdout; string(out) != "HIJACKED\n" {
		t.Fatalf("the replacement /bin/sh is not in place: %q", out)
	}
	if out := testenv.Sh(t, sb, "echo harness"); out != "harness\n" {
		t.Errorf("a shell exec ran the agent's /bin/sh: %q", out)
	}
	// The node's shell cannot be touched from inside.
	for _, attempt := range []string{
		"echo x > /.corral/sh", "rm -f /.corral/sh", "mv /.corral /.x", "rm -rf /.corral", "touch /.corral/evil",
	} {
		res := testenv.Run(t, sb, client.Command{Args: []string{"/tmp/busybox", "sh", "-c", attempt}})
		if res.ExitCode == 0 {
			t.Errorf("%q succeeded inside the sandbox", attempt)
		}
	}
	if out := testenv.Sh(t, sb, "echo still-mine"); out != "still-mine\n" {
		t.Errorf("shell exec after the attempts: %q", out)
	}
}
