package events

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// collect reads n events from a watch.
func collect(t *testing.T, l *Log, since *uint64, f Filter, n int) []*Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []*Event
	for e := range l.Watch(ctx, since, f) {
		out = append(out, e)
		if len(out) == n {
			break
		}
	}
	if len(out) != n {
		t.Fatalf("got %d events, want %d", len(out), n)
	}
	return out
}

func TestResumeAcrossReopenAndRotation(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	total := SegmentEvents + 10 // one rotation
	for i := range total {
		l.Append(Event{Type: Created, SandboxID: fmt.Sprintf("n-%d", i)})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// A torn line from a crash mid-write is ignored.
	f, _ := os.OpenFile(filepath.Join(dir, currentName), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"seq":99999,"ty`)
	f.Close()

	l, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.LastSeq(); got != uint64(total) {
		t.Fatalf("last seq after reopen = %d, want %d", got, total)
	}
	since := uint64(SegmentEvents - 5) // inside the rotated segment
	go l.Append(Event{Type: Deleted, SandboxID: "n-new"})
	evs := collect(t, l, &since, Filter{}, total-int(since)+1)
	for i, e := range evs {
		if want := since + uint64(i) + 1; e.Seq != want {
			t.Fatalf("event %d has seq %d, want %d (gap or duplicate)", i, e.Seq, want)
		}
	}
	if last := evs[len(evs)-1]; last.Type != Deleted || last.SandboxID != "n-new" {
		t.Fatalf("last event = %+v, want the live delete", last)
	}
}

func TestFilter(t *testing.T) {
	l, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Append(Event{Type: Created, SandboxID: "a", Labels: map[string]string{"job": "x"}})
	l.Append(Event{Type: Created, SandboxID: "b", Labels: map[string]string{"job": "y"}})
	l.Append(Event{Type: Deleted, SandboxID: "a", Labels: map[string]string{"job": "x"}})
	zero := uint64(0)
	evs := collect(t, l, &zero, Filter{Labels: map[string]string{"job": "x"}, Types: []string{Deleted}}, 1)
	if evs[0].Seq != 3 {
		t.Fatalf("filtered event = %+v, want seq 3", evs[0])
	}
}

// BenchmarkAppend is the cost an event adds to a lifecycle call (JSON and
// an append to the log file), next to the bare file append it contains.
func BenchmarkAppend(b *testing.B) {
	l, err := Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	e := Event{Type: Created, SandboxID: "n1-0123456789ab", Backend: "container", Reason: "image busybox",
		Labels: map[string]string{"job": "42"}, Figures: map[string]float64{"memory_limit_bytes": 1 << 29, "cpu_millis": 1000}}
	b.Run("event", func(b *testing.B) {
		for b.Loop() {
			l.Append(e)
		}
	})
	b.Run("peer-raw-append", func(b *testing.B) {
		f, err := os.CreateTemp(b.TempDir(), "raw")
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		line := []byte(`{"seq":1,"type":"created","sandbox_id":"n1-0123456789ab"}` + "\n")
		for b.Loop() {
			if _, err := f.Write(line); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestEndWatchesKeepsAppending(t *testing.T) {
	l, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range l.Watch(context.Background(), nil, Filter{}) {
		}
	}()
	l.EndWatches()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watch still running after EndWatches")
	}
	if e := l.Append(Event{Type: Deleted, SandboxID: "n-1"}); e.Seq != 1 {
		t.Fatalf("append after EndWatches: %+v", e)
	}
}

func TestSinceBeyondTheLogReplaysIt(t *testing.T) {
	l, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Append(Event{Type: Created, SandboxID: "n-1"})
	far := uint64(1000) // a watcher of a data dir since wiped
	if evs := collect(t, l, &far, Filter{}, 1); evs[0].Seq != 1 {
		t.Fatalf("resume beyond the log: %+v", evs[0])
	}
}
