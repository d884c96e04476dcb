package backendtest

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// clock: the sandbox's wall clock is the node's (within a minute, for
// slow emulated guests), as on any machine: TLS certificate checks, make
// and caches that compare mtimes with the time depend on it.
func (st *suite) clock(t *testing.T) {
	before := time.Now().Add(-time.Minute)
	out := strings.TrimSpace(st.sh(t, "date +%s"))
	after := time.Now().Add(time.Minute)
	sec, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		t.Fatalf("date +%%s: %q", out)
	}
	if got := time.Unix(sec, 0); got.Before(before) || got.After(after) {
		t.Errorf("the sandbox's clock says %v, the node's %v", got.UTC(), time.Now().UTC())
	}
}
