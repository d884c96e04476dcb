package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestVMTableSnapshotRows: the vm's snapshot and restore rows carry the
// microvm's figures of the same run and the ratios; without samples
// (--snapshots -1) there are no such rows.
func TestVMTableSnapshotRows(t *testing.T) {
	var b bytes.Buffer
	r := &VMResult{Image: "debian@12", BootReadyP50Ms: 120000, SnapshotP50Ms: 2000, RestoreP50Ms: 6000, SnapshotMiB: 177,
		MicroVMSnapshotP50Ms: 500, MicroVMRestoreP50Ms: 400, RatioRestoreVsBoot: 0.05}
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"snapshot of the running VM p50", "2000 ms", "microvm: 500 ms (4", "restore into a new sandbox p50", "microvm: 400 ms (15", "0.05"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	r.SnapshotP50Ms = 0
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "restore into a new sandbox") {
		t.Errorf("rows without samples:\n%s", b.String())
	}
}
