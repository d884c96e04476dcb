package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
)

// TestRolloutThroughControl is a trainer's flow through a control instance
// over two nodes, with a project token over TCP: a job's sandboxes spread
// over both nodes; keyed commands (Run and streamed Exec) replayed, not
// run again, from a new client after a "restart"; the exec log listed;
// the whole job paused and resumed by label; a container forked on its
// node under the project's quota counted over both nodes; and with one
// node killed, a pause by label pauses the other node's sandboxes and
// names the dead node as a failure of its own.
func TestRolloutThroughControl(t *testing.T) {
	r := startRig(t, false, 1, 2)
	ctx := context.Background()
	const quota = 6
	secret := projectToken(t, r.cli[0], "rl", client.Quota{MaxSandboxes: quota})
	addr := fmt.Sprintf("127.0.0.1:%d", controlBase)
	trainer := func() *client.Client {
		c, err := client.New(addr, client.WithToken(secret))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := trainer()
	job := map[string]string{"job": "j1"}
	var ids []string
	for range 4 {
		sb, err := c.Create(ctx, client.CreateOptions{Resources: small, Labels: job, Placement: client.Placement{SpreadByLabel: "job"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID())
	}
	n0, n1 := nodeID(t, r, 0), nodeID(t, r, 1)
	per := map[string][]string{}
	for _, id := range ids {
		per[nodeOf(id)] = append(per[nodeOf(id)], id)
	}
	if len(per[n0]) != 2 || len(per[n1]) != 2 {
		t.Fatalf("job spread over the nodes: %v; want 2 on each", per)
	}
	// Another project's sandbox with the same label: the trainer's calls
	// by label leave it alone.
	foreign, err := r.cli[0].Create(ctx, client.CreateOptions{Resources: small, Labels: job})
	if err != nil {
		t.Fatal(err)
	}

	// Keyed commands: the first trainer runs two steps in each sandbox.
	step := []string{"mkdir -p /work; echo ep0 >> /work/log; wc -l < /work/log", "echo ep1 >> /work/log; wc -l < /work/log"}
	for _, id := range ids {
		sb := c.Sandbox(id)
		if res, err := sb.Run(ctx, client.Command{Shell: step[0], Idempotent: true}); err != nil || res.Replayed || string(res.Stdout) != "1\n" {
			t.Fatalf("keyed run in %s: %+v, %v", id, res, err)
		}
		var out bytes.Buffer
		if res, err := sb.Exec(ctx, client.Command{Shell: step[1], Idempotent: true, Stdout: &out}); err != nil || res.Replayed || out.String() != "2\n" {
			t.Fatalf("keyed exec in %s: %+v %q, %v", id, res, out.String(), err)
		}
	}
	// A restarted trainer (a new client, fresh handles) sends the same
	// steps: recorded results come back, nothing runs twice.
	c2 := trainer()
	for _, id := range ids {
		sb := c2.Sandbox(id)
		res, err := sb.Run(ctx, client.Command{Shell: step[0], Idempotent: true})
		if err != nil || !res.Replayed || res.ExecSeq != 1 || string(res.Stdout) != "1\n" {
			t.Fatalf("replayed run in %s: %+v, %v; want replayed seq 1 with output 1", id, res, err)
		}
		var out bytes.Buffer
		res, err = sb.Exec(ctx, client.Command{Shell: step[1], Idempotent: true, Stdout: &out})
		if err != nil || !res.Replayed || res.ExecSeq != 2 || out.String() != "2\n" {
			t.Fatalf("replayed exec in %s: %+v %q, %v; want replayed seq 2 with output 2", id, res, out.String(), err)
		}
		if got, err := sb.Run(ctx, client.Command{Args: []string{"cat", "/work/log"}}); err != nil || string(got.Stdout) != "ep0\nep1\n" {
			t.Fatalf("log in %s after the replay: %+v, %v; want each step once", id, got, err)
		}
		ents, err := sb.ListExecs(ctx, 0)
		if err != nil || len(ents) != 2 {
			t.Fatalf("ListExecs of %s through the control plane: %+v, %v", id, ents, err)
		}
		for i, e := range ents {
			if e.Seq != uint64(i+1) || e.State != client.ExecDone || e.IdempotencyKey != client.ExecKey(id, fmt.Sprintf("#%d", i)) {
				t.Fatalf("exec log entry %d of %s: %+v", i, id, e)
			}
		}
		if ents, err := sb.ListExecs(ctx, 1); err != nil || len(ents) != 1 || ents[0].Seq != 2 {
			t.Fatalf("ListExecs since 1 of %s: %+v, %v", id, ents, err)
		}
	}

	// A trainer that goes away mid-command (its call cut off at the
	// control plane): the command runs to its end on the node, and the
	// restarted trainer's repeat attaches to it instead of running it again.
	slow := client.Command{Shell: "sleep 1; echo late >> /work/log; wc -l < /work/log", Step: "slow"}
	cut, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.Sandbox(per[n1][0]).Run(cut, slow)
	cancel()
	if err == nil {
		t.Fatal("a 1 s command answered within 300 ms")
	}
	if res, err := c2.Sandbox(per[n1][0]).Run(ctx, slow); err != nil || !res.Replayed || string(res.Stdout) != "3\n" {
		t.Fatalf("repeat of a command cut off at the caller: %+v, %v; want it attached (replayed, output 3)", res, err)
	}
	if got, err := c2.Sandbox(per[n1][0]).Run(ctx, client.Command{Args: []string{"cat", "/work/log"}}); err != nil || string(got.Stdout) != "ep0\nep1\nlate\n" {
		t.Fatalf("log after the cut-off command: %+v, %v; want it run once", got, err)
	}

	if _, err := c2.Sandbox(n0+"x-0123").ListExecs(ctx, 0); !client.IsNotFound(err) {
		t.Fatalf("ListExecs of a sandbox of no node: %v; want not found", err)
	}

	// The whole job paused and resumed by label, over both nodes.
	if _, err := c2.PauseMany(ctx, nil, false); !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "labels") {
		t.Fatalf("PauseMany without labels: %v; want invalid argument naming labels", err)
	}
	states := func(want client.State, which []string) {
		t.Helper()
		for _, id := range which {
			in, err := c2.Get(ctx, id)
			if err != nil || in.State != want {
				t.Fatalf("sandbox %s: %+v, %v; want %s", id, in, err, want)
			}
		}
	}
	res, err := c2.PauseMany(ctx, job, false)
	if err != nil || res.Done != 4 || len(res.Failures)+len(res.NodeFailures) != 0 {
		t.Fatalf("PauseMany job=j1: %+v, %v; want 4 paused", res, err)
	}
	states(client.StatePaused, ids)
	if in, err := r.cli[0].Get(ctx, foreign.ID()); err != nil || in.State != client.StateRunning {
		t.Fatalf("another project's sandbox labelled job=j1 after the trainer's PauseMany: %+v, %v; want running", in, err)
	}
	res, err = c2.ResumeMany(ctx, job)
	if err != nil || res.Done != 4 || len(res.Failures)+len(res.NodeFailures) != 0 {
		t.Fatalf("ResumeMany job=j1: %+v, %v; want 4 resumed", res, err)
	}
	states(client.StateRunning, ids)

	// Fork on the parent's node, under the quota over both nodes: 4 of 6
	// are used (2 on each node), so of 3 forks 2 are made and the third
	// fails alone (counted on its node alone, 2 + 3 would fit).
	parent := per[n0][0]
	if _, err := c2.Sandbox(parent).Fork(ctx, 0); !client.IsInvalidArgument(err) || !strings.Contains(err.Error(), "count") {
		t.Fatalf("fork × 0 through the control plane: %v; want invalid argument naming count", err)
	}
	fr, err := c2.Sandbox(parent).Fork(ctx, 3)
	if err != nil || fr.ProcessesCarried || len(fr.Forks) != 3 {
		t.Fatalf("fork × 3 of %s: %+v, %v", parent, fr, err)
	}
	for i, f := range fr.Forks[:2] {
		if f.Err != nil {
			t.Fatalf("fork %d: %v", i, f.Err)
		}
		if nodeOf(f.Sandbox.ID()) != n0 || f.Info.Labels["corral.fork-of"] != parent || f.Info.Labels["job"] != "j1" {
			t.Fatalf("fork %d: %s labels %v; want on node %s, forked of %s", i, f.Sandbox.ID(), f.Info.Labels, n0, parent)
		}
		if got, err := f.Sandbox.Run(ctx, client.Command{Args: []string{"cat", "/work/log"}}); err != nil || string(got.Stdout) != "ep0\nep1\n" {
			t.Fatalf("fork %d's files: %+v, %v", i, got, err)
		}
	}
	if e := fr.Forks[2].Err; e == nil || !strings.Contains(e.Error(), "quota max_sandboxes") {
		t.Fatalf("third fork over the cluster's quota: %v; want a quota refusal", e)
	}
	for _, f := range fr.Forks[:2] {
		if err := f.Sandbox.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Snapshots through the control plane: a container's is refused by its
	// node naming CRIU; by snapshot id every node is asked.
	if _, err := c2.Sandbox(parent).Snapshot(ctx); !client.IsUnimplemented(err) || !strings.Contains(err.Error(), "criu") {
		t.Fatalf("snapshot of a container through the control plane: %v; want unimplemented naming criu", err)
	}
	if snaps, err := c2.ListSnapshots(ctx); err != nil || len(snaps) != 0 {
		t.Fatalf("ListSnapshots through the control plane: %v, %v; want none", snaps, err)
	}
	if _, _, err := c2.Restore(ctx, "snap-0123456789abcdef", nil); !client.IsNotFound(err) {
		t.Fatalf("restore of an unknown snapshot through the control plane: %v; want not found", err)
	}
	if err := c2.DeleteSnapshot(ctx, "snap-bad"); !client.IsInvalidArgument(err) {
		t.Fatalf("delete of a malformed snapshot id through the control plane: %v; want invalid argument", err)
	}

	// Node 1 killed: a pause by label pauses node 0's sandboxes and names
	// node 1 as a failure of its own (unreachable: its lease has not
	// expired yet); node 1's sandboxes, back with their node, were not
	// paused.
	r.kill9(r.nodes[1])
	res, err = c2.PauseMany(ctx, job, false)
	if err != nil || res.Done != 2 || len(res.Failures) != 0 || len(res.NodeFailures) != 1 || !strings.Contains(res.NodeFailures[n1], n1) {
		t.Fatalf("PauseMany with node %s killed: %+v, %v; want node 0's 2 paused and node %s's failure", n1, res, err, n1)
	}
	t.Logf("node failure: %s", res.NodeFailures[n1])
	states(client.StatePaused, per[n0])
	// Once its lease expired (3s) it is lost: not asked, named the same way.
	r.waitNodes(1, "ready")
	res, err = c2.ResumeMany(ctx, job)
	if err != nil || res.Done != 2 || len(res.NodeFailures) != 1 || !strings.Contains(res.NodeFailures[n1], "lost its lease") {
		t.Fatalf("ResumeMany with node %s lost: %+v, %v; want node 0's 2 resumed and node %s named lost", n1, res, err, n1)
	}
	t.Logf("lost node failure: %s", res.NodeFailures[n1])
	states(client.StateRunning, per[n0])
	r.start(r.nodes[1])
	waitPort(t, r.nodeAddr(1), r.nodes[1])
	r.waitNodes(2, "ready")
	states(client.StateRunning, per[n1])
}
