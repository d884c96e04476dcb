package userns

import "testing"

func TestAllocatorRanges(t *testing.T) {
	a := NewAllocator(&MemSlots{})
	r1, err := a.Allocate("s1")
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := a.Allocate("s2")
	if r1 != (Range{Host: First, Size: Size}) || r2.Host != First+Size {
		t.Fatalf("ranges %+v %+v", r1, r2)
	}
	if r1.Contains(r2.Host) || !r2.Contains(r2.Host+Size-1) || r1.Map() != "0 1048576 65536" {
		t.Fatalf("range arithmetic: %+v %+v %q", r1, r2, r1.Map())
	}
	if last := At(Count - 1); uint64(last.Host)+uint64(last.Size) > 1<<32-1 {
		t.Fatalf("last range %+v reaches the invalid id", last)
	}
	if err := a.Release("s1"); err != nil {
		t.Fatal(err)
	}
	if r3, _ := a.Allocate("s3"); r3 != r1 {
		t.Fatalf("freed range not reused: %+v", r3)
	}
}
