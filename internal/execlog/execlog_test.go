package execlog

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestBeginFinishSinceRecover(t *testing.T) {
	path := filepath.Join(t.TempDir(), "execlog.db")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	first, found, err := l.Begin("sb1", Entry{Key: "a", Argv: []string{"echo", "a"}, Digest: "d1"}, 10)
	if err != nil || found || first.Seq != 1 || first.State != Running {
		t.Fatalf("first Begin: %+v %v %v", first, found, err)
	}
	first.State, first.Result = Done, Result{ExitCode: 3}
	out := []Chunk{{Stream: 1, Data: []byte("hi\n")}}
	if err := l.Finish("sb1", first, out); err != nil {
		t.Fatal(err)
	}
	again, found, err := l.Begin("sb1", Entry{Key: "a", Digest: "other"}, 10)
	if err != nil || !found || again.Seq != 1 || again.State != Done || again.Result.ExitCode != 3 || again.Digest != "d1" {
		t.Fatalf("repeated Begin: %+v %v %v", again, found, err)
	}
	if got, err := l.Output("sb1", 1); err != nil || len(got) != 1 || string(got[0].Data) != "hi\n" {
		t.Fatalf("output: %v %v", got, err)
	}
	second, _, _ := l.Begin("sb1", Entry{Key: "b"}, 10)
	if _, _, err := l.Begin("sb1", Entry{Key: "c"}, 2); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("third key with a limit of 2: %v", err)
	}
	if _, _, err := l.Begin("sb2", Entry{Key: "a"}, 10); err != nil {
		t.Fatal(err)
	}
	page, more, err := l.Since("sb1", 0, 1)
	if err != nil || !more || len(page) != 1 || page[0].Seq != 1 {
		t.Fatalf("first page: %+v %v %v", page, more, err)
	}
	if page, more, _ = l.Since("sb1", 1, 10); more || len(page) != 1 || page[0].Seq != second.Seq {
		t.Fatalf("second page: %+v %v", page, more)
	}
	// A restart: "b" was running, sb2 has no record any more.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if l, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dropped, lost, err := l.Recover(func(id string) bool { return id == "sb1" }, time.Now())
	if err != nil || dropped != 1 || lost != 1 {
		t.Fatalf("recover: dropped %d lost %d: %v", dropped, lost, err)
	}
	b, found, _ := l.Begin("sb1", Entry{Key: "b"}, 10)
	if !found || b.State != Lost || b.Error == "" {
		t.Fatalf("b after recovery: %+v", b)
	}
	if ents, _, _ := l.Since("sb2", 0, 10); len(ents) != 0 {
		t.Fatalf("sb2's log survived: %+v", ents)
	}
	if err := l.Drop("sb1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Drop("sb1"); err != nil {
		t.Fatalf("second drop: %v", err)
	}
	if ents, _, _ := l.Since("sb1", 0, 10); len(ents) != 0 {
		t.Fatalf("sb1's log after Drop: %+v", ents)
	}
}
