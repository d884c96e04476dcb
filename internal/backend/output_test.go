package backend

import (
	"os"
	"testing"
	"time"
)

// TestCopyPipeDeliversWhatThePipeHeldAtTheDeadline: a reader still busy
// delivering one chunk when the deadline passed (the command wrote its
// last line and exited meanwhile) delivers that last line too, and then
// stops although the write end stays open.
func TestCopyPipeDeliversWhatThePipeHeldAtTheDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close() // held open, as by a background process
	if _, err := w.WriteString("HELLO\n"); err != nil {
		t.Fatal(err)
	}
	var got []string
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		CopyPipe(r, make([]byte, 64), func(p []byte) bool {
			got = append(got, string(p))
			if len(got) == 1 {
				// The command's last output and its exit arrive while
				// this chunk is delivered.
				if _, err := w.WriteString("done\n"); err != nil {
					t.Error(err)
				}
				_ = r.SetReadDeadline(time.Now())
				time.Sleep(50 * time.Millisecond)
			}
			return true
		})
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("CopyPipe waited past its deadline on a pipe still open")
	}
	if len(got) != 2 || got[0] != "HELLO\n" || got[1] != "done\n" {
		t.Fatalf("delivered %q, want HELLO then done", got)
	}
}

// TestCopyPipeStopsWhenDeliverRefuses: false from deliver (the limit)
// ends the copy with data still in the pipe.
func TestCopyPipeStopsWhenDeliverRefuses(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := w.WriteString("0123456789"); err != nil {
		t.Fatal(err)
	}
	calls := 0
	CopyPipe(r, make([]byte, 4), func([]byte) bool { calls++; return false })
	if calls != 1 {
		t.Fatalf("deliver called %d times after refusing, want 1", calls)
	}
}
