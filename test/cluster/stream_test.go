package cluster_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
)

// syncBuffer is a bytes.Buffer safe to read while a stream writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// execStream: an exec with streamed stdin through a control instance is a
// conversation: the command's answer to the first line comes back before
// the second line is sent.
func execStream(t *testing.T, c *client.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	var out syncBuffer
	type answer struct {
		res *client.Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := c.Sandbox(id).Exec(ctx, client.Command{Args: []string{"sh", "-c", "read a; echo got-$a; read b; echo got-$b"},
			StdinReader: pr, Stdout: &out})
		done <- answer{res, err}
	}()
	if _, err := io.WriteString(pw, "one\n"); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(out.String(), "got-one") {
		select {
		case a := <-done:
			t.Fatalf("exec stream ended before its second line: %+v, %v, output %q", a.res, a.err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := io.WriteString(pw, "two\n"); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	a := <-done
	if a.err != nil || a.res.ExitCode != 0 || out.String() != "got-one\ngot-two\n" {
		t.Fatalf("exec stream through the control plane: %+v, %v, output %q", a.res, a.err, out.String())
	}
}
