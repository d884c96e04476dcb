package bench

import (
	"io"
	"testing"
)

// Zero takes the default everywhere; a negative count takes it only where
// negative has no meaning of its own (pause's --job -1 and --microvm-n -1
// skip their part).
func TestPauseDefaults(t *testing.T) {
	o := PauseOptions{N: -3, Job: -1, MicroVMN: -1}
	o.defaults()
	if o.N != 10 || o.Job != -1 || o.MicroVMN != -1 || o.ReclaimN != 1 || o.ForkN != 8 || o.Log != io.Discard {
		t.Fatalf("defaults of %+v: want N 10, Job -1, MicroVMN -1, ReclaimN 1, ForkN 8, Log io.Discard", o)
	}
	o = PauseOptions{}
	o.defaults()
	if o.Job != 500 || o.MicroVMN != 3 || len(o.SizesMiB) != 3 {
		t.Fatalf("defaults of zero options: %+v", o)
	}
}
