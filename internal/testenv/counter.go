package testenv

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
)

// counterScript counts in the background, five times a second, into
// /tmp/count (renamed into place, so a read never sees a half write); its
// shell's pid is in /tmp/counter.pid.
const counterScript = "/.corral/sh -c 'echo $$ > /tmp/counter.pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/count; sleep 0.2; done' >/dev/null 2>&1 &"

// StartCounter starts a counter in sb (a running sandbox whose memory a
// snapshot, migration or restart should keep) and waits for its first
// count.
func StartCounter(t testing.TB, sb *client.Sandbox) {
	t.Helper()
	Sh(t, sb, counterScript)
	deadline := time.Now().Add(time.Minute)
	for Run(t, sb, client.Command{Args: []string{"test", "-s", "/tmp/count"}}).ExitCode != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: the counter never started", sb.ID())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ReadCounter is the counter's last count in sb.
func ReadCounter(t testing.TB, sb *client.Sandbox) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(Sh(t, sb, "cat /tmp/count")))
	if err != nil {
		t.Fatalf("sandbox %s: counter: %v", sb.ID(), err)
	}
	return n
}

// AssertCounting asserts that the counter in sb reads at least from (its
// value before what happened to sb) and goes on; it returns the count it
// went on to.
func AssertCounting(t testing.TB, what string, sb *client.Sandbox, from int) int {
	t.Helper()
	first := ReadCounter(t, sb)
	if first < from {
		t.Fatalf("%s: counter %d, want at least %d (its value before)", what, first, from)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if next := ReadCounter(t, sb); next > first {
			return next
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: counter stuck at %d", what, first)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
