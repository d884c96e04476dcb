package redteam

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// pidAndIdentity runs the probe's "pid" mode: its own pid and the
// sandbox's identity (its init's start time).
func pidAndIdentity(t *testing.T, sb *client.Sandbox) (pid, identity string) {
	t.Helper()
	res := testenv.Run(t, sb, client.Command{Args: []string{"/corral-probe/corral-probe", "pid"}, Timeout: time.Minute})
	f := strings.Fields(string(res.Stdout))
	if len(f) != 2 {
		t.Fatalf("probe pid: %q", res.Stdout)
	}
	return f[0], f[1]
}

// TestRecycledSandboxNoLeaksBetweenEpisodes (issue 18): on a node started
// with --recycle, one episode of an agent leaves what it can for the next
// episode of its project that gets the same (recycled) sandbox: a POSIX
// message queue, files in its disk, /tmp and /dev/shm, a detached process,
// and a PID counter moved by 100 forks. The next episode finds none of it.
// A sandbox one project deleted is never handed to another project.
func TestRecycledSandboxNoLeaksBetweenEpisodes(t *testing.T) {
	testenv.RequireRoot(t)
	srv := testenv.StartServer(t, func(cfg *server.Config) {
		cfg.WarmPool, cfg.Recycle = 0, 2
		cfg.Listen = "127.0.0.1:0"
	})
	ctx := context.Background()
	admin := srv.Client
	project := func(name string) *client.Client {
		if _, err := admin.CreateProject(ctx, name, client.Quota{MaxSandboxes: 4}); err != nil {
			t.Fatal(err)
		}
		_, secret, err := admin.CreateToken(ctx, client.TokenOptions{Project: name})
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(srv.Server.TCPAddr(), client.WithToken(secret))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	alpha, beta := project("alpha"), project("beta")

	first, err := alpha.Create(ctx, client.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	installProbe(t, first)
	queue := testenv.UniqueName("episode")
	put := runProbe(t, first, nil, "mq", "put", queue)
	if len(put) != 1 || put[0].Outcome != "succeeded" {
		t.Fatalf("episode 1 could not leave a queue: %+v", put)
	}
	testenv.Sh(t, first, "echo answer > /root/answer; echo t > /tmp/t; echo s > /dev/shm/s; setsid sleep 1000 >/dev/null 2>&1 </dev/null &")
	// One TCP connection on loopback: counters move, a port stays in TIME_WAIT.
	const loopback = "grep lo: /proc/net/dev | tr -s ' ' | cut -d' ' -f3,4; grep -o 'tw [0-9]*' /proc/net/sockstat"
	if lo := testenv.Sh(t, first, "nc -l -p 5000 >/dev/null & sleep 0.3; echo hi | nc 127.0.0.1 5000; wait; "+loopback); lo == "0 0\ntw 0\n" {
		t.Fatalf("episode 1's loopback connection shows nothing: %q", lo)
	}
	runProbe(t, first, nil, "forkn", "100")
	pid1, box1 := pidAndIdentity(t, first)
	if err := first.Delete(ctx); err != nil {
		t.Fatal(err)
	}

	// Another project's create must not get alpha's sandbox.
	other, err := beta.Create(ctx, client.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	installProbe(t, other)
	_, boxOther := pidAndIdentity(t, other)
	results := []Result{check("recycle/other-project", boxOther != box1,
		"project beta's sandbox has identity %s, alpha's deleted one %s (want different)", boxOther, box1)}

	// Alpha's next create gets it once it is back in the pool.
	var second *client.Sandbox
	deadline := time.Now().Add(time.Minute)
	for second == nil {
		sb, err := alpha.Create(ctx, client.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		installProbe(t, sb)
		if _, box := pidAndIdentity(t, sb); box == box1 {
			second = sb
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("alpha's deleted sandbox never came back from its pool")
		}
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	get := runProbe(t, second, nil, "mq", "get", queue)
	results = append(results, check("recycle/mq", len(get) == 1 && get[0].Outcome == "blocked" && get[0].Errno == "ENOENT",
		"episode 2 opening episode 1's queue: %+v (want blocked ENOENT)", get))
	files := testenv.Sh(t, second, "cat /root/answer /tmp/t /dev/shm/s 2>/dev/null; true")
	results = append(results, check("recycle/files", files == "", "episode 2 reads episode 1's files: %q", files))
	procs := testenv.Sh(t, second, "ps -o comm | grep -c sleep; true")
	results = append(results, check("recycle/processes", strings.TrimSpace(procs) == "0", "episode 1's sleep in episode 2: %q", procs))
	lo := testenv.Sh(t, second, loopback)
	results = append(results, check("recycle/loopback", lo == "0 0\ntw 0\n",
		"episode 2 reads episode 1's loopback traffic (lo bytes and packets, TIME_WAIT sockets): %q (want 0 0, tw 0)", lo))
	pid2, _ := pidAndIdentity(t, second)
	n1, _ := strconv.Atoi(pid1)
	n2, _ := strconv.Atoi(pid2)
	results = append(results, check("recycle/pid-counter", n2 > 0 && n2 < n1 && n2 < 100,
		"episode 1's probe ran as pid %d after 100 forks, episode 2's as %d (want low: the counter rewound)", n1, n2))
	judge(t, "container", results)
}
