//go:build linux && amd64

package seccomp

import "testing"

// TestWithoutPageCacheProbes: the stronger setting refuses exactly the
// page-cache probes, compiles, and leaves the default profile as it was.
func TestWithoutPageCacheProbes(t *testing.T) {
	def := DefaultProfile()
	q := def.WithoutPageCacheProbes()
	if _, err := Compile(q); err != nil {
		t.Fatal(err)
	}
	if def.rules["mincore"].def != actAllow || len(def.rules["preadv2"].checks) != 0 {
		t.Fatal("the default profile changed")
	}
	if q.rules["mincore"].def != actEPERM || q.rules["cachestat"].def != actENOSYS {
		t.Fatalf("mincore %v, cachestat %v", q.rules["mincore"].def, q.rules["cachestat"].def)
	}
	for _, name := range []string{"preadv2", "pwritev2"} {
		r := q.rules[name]
		if r.def != actAllow || len(r.checks) != 1 || r.checks[0].then != actEPERM || r.checks[0].when[0] != masked(5, rwfNowait, rwfNowait) {
			t.Errorf("%s: %+v, want allowed but with RWF_NOWAIT refused", name, r)
		}
	}
	changed := 0
	for name, r := range q.rules {
		if d := def.rules[name]; d.def != r.def || len(d.checks) != len(r.checks) {
			changed++
		}
	}
	if changed != 4 {
		t.Errorf("%d rules changed, want 4", changed)
	}
}
