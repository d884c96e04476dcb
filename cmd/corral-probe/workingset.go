package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// workingSet is `corral bench pause`'s working set: it maps MIB of
// anonymous memory and fills every byte (no page is same-filled, so
// nothing on the swap path can store a page as one value), creates the
// FIFOs DIR/in and DIR/out, writes DIR/ready, then forever: waits for a
// line on DIR/in, reads one word of every page (bringing back each page
// the node pushed to swap) and writes the time that took, in nanoseconds,
// to DIR/out. A command that writes to in and reads out thus returns when
// the whole working set is in RAM again.
func workingSet(args []string) {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: corral-probe workingset MIB DIR")
		os.Exit(2)
	}
	mib, err := strconv.Atoi(args[0])
	if err != nil || mib < 1 {
		fmt.Fprintln(os.Stderr, "corral-probe workingset: MIB must be a positive integer")
		os.Exit(2)
	}
	dir := args[1]
	mem, err := unix.Mmap(-1, 0, mib<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "corral-probe workingset: mmap:", err)
		os.Exit(1)
	}
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i+8 <= len(mem); i += 8 { // xorshift64: cheap, never a run of equal words
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		for j := range 8 {
			mem[i+j] = byte(x >> (8 * j))
		}
	}
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	for _, p := range []string{in, out} {
		if err := unix.Mkfifo(p, 0o600); err != nil && err != unix.EEXIST {
			fmt.Fprintln(os.Stderr, "corral-probe workingset: mkfifo:", err)
			os.Exit(1)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), []byte("ready\n"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "corral-probe workingset:", err)
		os.Exit(1)
	}
	var sum byte
	for {
		if _, err := os.ReadFile(in); err != nil { // blocks until a writer comes and goes
			fmt.Fprintln(os.Stderr, "corral-probe workingset:", err)
			os.Exit(1)
		}
		start := time.Now()
		for i := 0; i < len(mem); i += 4096 {
			sum += mem[i]
		}
		took := time.Since(start)
		if err := os.WriteFile(out, []byte(fmt.Sprintf("%d %d\n", took.Nanoseconds(), sum)), 0); err != nil {
			fmt.Fprintln(os.Stderr, "corral-probe workingset:", err)
			os.Exit(1)
		}
	}
}
