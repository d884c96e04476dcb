package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

const (
	trainerEpisodes = 100
	trainerCommands = 4 // per episode
)

// TestTrainerHelper is the trainer TestExactlyOnceAcrossTrainerKills
// starts and kills: run as a child process only (it needs its env).
func TestTrainerHelper(t *testing.T) {
	addr, id := os.Getenv("CORRAL_TRAINER_ADDR"), os.Getenv("CORRAL_TRAINER_SANDBOX")
	if addr == "" {
		t.Skip("the trainer child of TestExactlyOnceAcrossTrainerKills")
	}
	c, err := client.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	// A fresh handle numbers its Idempotent commands from 0 again, so a
	// restarted trainer that sends the same commands gets the same keys.
	sb := c.Sandbox(id)
	ctx := context.Background()
	for ep := range trainerEpisodes {
		for j := range trainerCommands {
			script := fmt.Sprintf("echo ep%03d-c%d >> /tmp/rollout.log", ep, j)
			if j == 2 {
				// A slower command, so that kills also land while one runs
				// (its repeat then attaches to it).
				script = "sleep 0.05; " + script
			}
			res, err := sb.Run(ctx, client.Command{Shell: script, Idempotent: true})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("episode %d command %d: %v %+v", ep, j, err, res)
			}
		}
	}
}

// TestExactlyOnceAcrossTrainerKills kills a trainer with SIGKILL at random
// points of a 100-episode rollout and restarts it with the same keys until
// it finishes: every command's line must be in the file exactly once.
func TestExactlyOnceAcrossTrainerKills(t *testing.T) {
	srv := testenv.StartServer(t)
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	kills := 0
	for attempt := 0; ; attempt++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestTrainerHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), "CORRAL_TRAINER_ADDR="+srv.Addr, "CORRAL_TRAINER_SANDBOX="+sb.ID())
		out := new(strings.Builder)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		wait := time.Duration(150+rand.IntN(600)) * time.Millisecond
		if attempt >= 12 {
			wait = 10 * time.Minute // enough kills: let it finish
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("trainer failed: %v\n%s", err, out)
			}
			t.Logf("trainer finished after %d kills", kills)
			checkRollout(t, sb)
			return
		case <-time.After(wait):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
			kills++
		}
	}
}

func checkRollout(t *testing.T, sb *client.Sandbox) {
	t.Helper()
	lines := strings.Fields(testenv.Sh(t, sb, "cat /tmp/rollout.log"))
	seen := map[string]int{}
	for _, l := range lines {
		seen[l]++
	}
	for ep := range trainerEpisodes {
		for j := range trainerCommands {
			if l := fmt.Sprintf("ep%03d-c%d", ep, j); seen[l] != 1 {
				t.Errorf("line %s is in the file %d times, want once", l, seen[l])
			}
		}
	}
	if len(lines) != trainerEpisodes*trainerCommands {
		t.Errorf("file has %d lines, want %d", len(lines), trainerEpisodes*trainerCommands)
	}
	log, err := sb.ListExecs(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(log) != trainerEpisodes*trainerCommands {
		t.Fatalf("exec log has %d entries, want %d", len(log), trainerEpisodes*trainerCommands)
	}
	for i, e := range log {
		if e.Seq != uint64(i+1) || e.State != client.ExecDone || e.Result == nil || e.Result.ExitCode != 0 {
			t.Fatalf("exec log entry %d: %+v", i, e)
		}
	}
	// ListExecs pages on from since.
	tail, err := sb.ListExecs(context.Background(), log[len(log)-3].Seq)
	if err != nil || len(tail) != 2 || tail[0].Seq != log[len(log)-2].Seq {
		t.Fatalf("ListExecs since %d: %v %+v", log[len(log)-3].Seq, err, tail)
	}
}

// TestExecKeyReplayAttachAndErrors: a repeated key returns the recorded
// result without running again, a caller that leaves does not stop the
// command and a repeat attaches to it, and bad uses get clear errors.
func TestExecKeyReplayAttachAndErrors(t *testing.T) {
	srv := testenv.StartServer(t)
	ctx := context.Background()
	sb := testenv.NewSandbox(t, srv.Client, client.CreateOptions{})
	once := client.Command{Shell: "echo run >> /tmp/n; wc -l < /tmp/n; echo err >&2", Step: "count"}
	first := testenv.Run(t, sb, once)
	again := testenv.Run(t, sb, once)
	if first.Replayed || first.ExecSeq != 1 || !again.Replayed || again.ExecSeq != 1 {
		t.Fatalf("first %+v, again %+v: want seq 1 run then replayed", first, again)
	}
	if string(again.Stdout) != string(first.Stdout) || string(again.Stderr) != "err\n" || strings.TrimSpace(string(first.Stdout)) != "1" {
		t.Fatalf("replayed output %q/%q, first %q", again.Stdout, again.Stderr, first.Stdout)
	}
	if got := testenv.Sh(t, sb, "wc -l < /tmp/n"); strings.TrimSpace(got) != "1" {
		t.Fatalf("the command ran %s times", got)
	}

	// The caller gives up mid-command; the command finishes anyway and a
	// repeat attaches to it (then, once ended, replays it).
	slow := client.Command{Shell: "sleep 1; echo slow >> /tmp/s; echo finished", IdempotencyKey: "slow-1"}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if _, err := sb.Run(cctx, slow); err == nil {
		t.Fatal("a run that outlives its context returned no error")
	}
	cancel()
	att := testenv.Run(t, sb, slow)
	if !att.Replayed || att.ExecSeq != 2 || string(att.Stdout) != "finished\n" {
		t.Fatalf("attach: %+v stdout %q", att, att.Stdout)
	}
	if got := testenv.Sh(t, sb, "cat /tmp/s"); got != "slow\n" {
		t.Fatalf("/tmp/s = %q, want one line", got)
	}

	for _, tc := range []struct {
		name string
		cmd  client.Command
		want string
	}{
		{"reused key", client.Command{Shell: "echo other", Step: "count"}, "was used for a different command"},
		{"long key", client.Command{Args: []string{"true"}, IdempotencyKey: strings.Repeat("k", 257)}, "over the limit of 256"},
		{"streamed stdin", client.Command{Args: []string{"cat"}, IdempotencyKey: "s", StdinReader: strings.NewReader("x")}, "not allowed on a streamed exec"},
	} {
		_, err := sb.Run(ctx, tc.cmd)
		if !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want invalid argument mentioning %q", tc.name, err, tc.want)
		}
	}
	if _, err := srv.Client.Sandbox(srv.NodeID()+"-nosuch").ListExecs(ctx, 0); !client.IsNotFound(err) && !client.IsInvalidArgument(err) {
		t.Errorf("ListExecs of an unknown sandbox: %v", err)
	}
	log, err := sb.ListExecs(ctx, 0)
	if err != nil || len(log) != 2 || log[0].IdempotencyKey != client.ExecKey(sb.ID(), "count") || log[1].OutputBytes != int64(len("finished\n")) {
		t.Fatalf("exec log: %v %+v", err, log)
	}
}

// TestExecLogSurvivesDaemonKill: after a SIGKILL of the daemon, a finished
// command's key still returns its recorded result, and a command that was
// running has an unknown outcome: its repeat fails instead of running twice.
func TestExecLogSurvivesDaemonKill(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	c := d.start()
	sb, err := c.Create(ctx, client.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := client.Command{Shell: "echo a >> /tmp/a; echo recorded", IdempotencyKey: "done"}
	if res, err := sb.Run(ctx, done); err != nil || res.ExitCode != 0 {
		t.Fatalf("run: %v %+v", err, res)
	}
	running := client.Command{Shell: "sleep 30", IdempotencyKey: "running"}
	go func() { _, _ = sb.Run(ctx, running) }()
	waitFor(t, func() bool {
		log, err := sb.ListExecs(ctx, 0)
		return err == nil && len(log) == 2
	})
	d.stop(syscall.SIGKILL)
	c = d.start("--cleanup-on-exit")
	sb = c.Sandbox(sb.ID())
	res, err := sb.Run(ctx, done)
	if err != nil || !res.Replayed || string(res.Stdout) != "recorded\n" {
		t.Fatalf("repeat after the restart: %v %+v", err, res)
	}
	if got := testenv.Sh(t, sb, "cat /tmp/a"); got != "a\n" {
		t.Fatalf("/tmp/a = %q: the command ran again", got)
	}
	if _, err := sb.Run(ctx, running); !client.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "outcome is unknown") {
		t.Fatalf("repeat of the command the crash interrupted: %v", err)
	}
	log, err := sb.ListExecs(ctx, 0)
	if err != nil || len(log) != 2 || log[1].State != client.ExecLost {
		t.Fatalf("exec log after the restart: %v %+v", err, log)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	d.stopLeavingNothing()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
