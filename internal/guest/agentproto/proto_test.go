package agentproto

import (
	"bytes"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestFramesRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	s := NewStream(&buf)
	if err := s.WriteJSON(KindRequest, Request{Version: Version, Secret: "s", Op: OpPing}); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(KindStdout, []byte("out")); err != nil {
		t.Fatal(err)
	}
	var req Request
	if err := s.ReadJSON(KindRequest, &req); err != nil || req.Op != OpPing || req.Secret != "s" {
		t.Fatalf("request %+v, %v", req, err)
	}
	kind, p, err := s.Read()
	if err != nil || kind != KindStdout || string(p) != "out" {
		t.Fatalf("frame %d %q %v", kind, p, err)
	}
	if err := s.Write(KindData, make([]byte, MaxFrame+1)); err == nil {
		t.Error("an oversized frame was written")
	}
	// A header announcing more than MaxFrame is refused before allocating.
	buf.Reset()
	buf.Write([]byte{KindData, 0xff, 0xff, 0xff, 0xff})
	if _, _, err := s.Read(); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Errorf("oversized header: %v", err)
	}
}

func TestErrorClassesSurviveTheWire(t *testing.T) {
	for _, err := range []error{
		errdefs.NotFound("x"), errdefs.InvalidArgument("x"), errdefs.PermissionDenied("x"),
		errdefs.ResourceExhausted("x"), errdefs.FailedPrecondition("x"),
	} {
		back := ErrorReply(err).Err()
		for _, is := range []func(error) bool{errdefs.IsNotFound, errdefs.IsInvalidArgument, errdefs.IsPermissionDenied} {
			if is(err) != is(back) {
				t.Errorf("%v came back as %v with another class", err, back)
			}
		}
	}
	if (Reply{Op: ReplyOK}).Err() != nil {
		t.Error("an ok reply carries an error")
	}
}

func TestCheckSecret(t *testing.T) {
	if CheckSecret("", "") || CheckSecret("a", "") || CheckSecret("", "a") || CheckSecret("ab", "a") {
		t.Error("a missing or wrong secret passed")
	}
	if !CheckSecret("abc", "abc") {
		t.Error("the right secret failed")
	}
}

// TestMinVersion: the ops of version 1 are still sent as version 1, so
// that a guest running an older agent keeps serving them; the tree ops
// need version 2, limits 4; none needs more than this package's Version.
func TestMinVersion(t *testing.T) {
	for _, op := range []string{OpPing, OpExec, OpWrite, OpRead, OpList, OpStat, OpRemove, OpMkdir, OpDetach} {
		if v := MinVersion(op); v != 1 {
			t.Errorf("%s: version %d, want 1", op, v)
		}
	}
	for _, op := range []string{OpExtract, OpArchive} {
		if v := MinVersion(op); v != 2 || v > Version {
			t.Errorf("%s: version %d, want 2 (Version %d)", op, v, Version)
		}
	}
	if v := MinVersion(OpLimits); v != 4 || v > Version {
		t.Errorf("%s: version %d, want 4 (Version %d)", OpLimits, v, Version)
	}
}
