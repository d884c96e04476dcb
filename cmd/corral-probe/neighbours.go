package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/probeproto"
)

// neighbourAttempts look for other sandboxes through shared kernel views
// (round 2 of the red team): the backing files of the node's loop devices
// (other sandboxes' disk images, named by their ids) and the host's device
// events (a loop device attached whenever another sandbox is created).
func neighbourAttempts() {
	attempt("neighbour/loop-backing-file", func() []probeproto.Result {
		var found []string
		for _, g := range []string{"/sys/block/*/loop/backing_file", "/sys/devices/virtual/block/*/loop/backing_file", "/sys/class/block/*/loop/backing_file"} {
			files, _ := filepath.Glob(g)
			for _, f := range files {
				if b, err := os.ReadFile(f); err == nil && len(strings.TrimSpace(string(b))) > 0 {
					found = append(found, f+"="+strings.TrimSpace(string(b)))
				}
			}
		}
		if len(found) > 0 {
			return one(probeproto.Result{Name: "neighbour/loop-backing-file", Outcome: succeeded, Detail: strings.Join(found[:min(len(found), 3)], " ")})
		}
		return one(probeproto.Result{Name: "neighbour/loop-backing-file", Outcome: blocked, Errno: "ENOENT", Detail: "no loop backing_file readable under /sys"})
	})
	attempt("neighbour/uevent-socket", func() []probeproto.Result {
		const netlinkKobjectUevent = 15
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, netlinkKobjectUevent)
		if err == nil {
			// Joining the kernel's multicast group is what would deliver
			// the host's events.
			err = unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1})
			unix.Close(fd)
		}
		return one(fromErr("neighbour/uevent-socket", err, "socket(AF_NETLINK, SOCK_DGRAM, NETLINK_KOBJECT_UEVENT) + bind group 1"))
	})
}

// pageCacheProbes ask whether a file of a shared layer (/bin/sh) is in the
// page cache, the way a sandbox would learn that a neighbour read it
// (mode "pagecache"): mincore on a mapping of it, cachestat, and a
// preadv2 with RWF_NOWAIT (EAGAIN when not cached: an answer too).
func pageCacheProbes() []probeproto.Result {
	f, err := os.Open("/bin/sh")
	if err != nil {
		return one(probeproto.Result{Name: "pagecache/mincore", Outcome: blocked, Errno: errnoName(err)})
	}
	defer f.Close()
	var out []probeproto.Result
	m, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ, unix.MAP_SHARED)
	if err == nil {
		vec := make([]byte, 1)
		_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0])))
		err = errOrNil(e)
		_ = unix.Munmap(m)
	}
	out = append(out, fromErr("pagecache/mincore", err, "mincore on a mapping of /bin/sh"))
	var cstat [4]uint64 // struct cachestat: nr_cache, nr_dirty, nr_writeback, nr_evicted (+ more)
	var rng [2]uint64   // struct cachestat_range: off, len (0: to the end)
	_, _, e := unix.Syscall6(unix.SYS_CACHESTAT, f.Fd(), uintptr(unsafe.Pointer(&rng)), uintptr(unsafe.Pointer(&cstat)), 0, 0, 0)
	out = append(out, fromErr("pagecache/cachestat", errOrNil(e), "cachestat /bin/sh"))
	buf := make([]byte, 4096)
	_, err = unix.Preadv2(int(f.Fd()), [][]byte{buf}, 0, unix.RWF_NOWAIT)
	if err == unix.EAGAIN {
		err = nil // "not cached" is the answer the probe wanted
	}
	out = append(out, fromErr("pagecache/rwf-nowait", err, "preadv2(RWF_NOWAIT) of /bin/sh"))
	return out
}

func errOrNil(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// residentPages prints {"resident": N, "pages": M}: how many of path's
// pages mincore shows in the page cache (mode "resident PATH"), the
// figure that tells whether a neighbour read a file of a layer this
// sandbox shares with it.
func residentPages(path string) {
	fail := func(err error) { fmt.Printf("{\"error\": %q}\n", err.Error()) }
	f, err := os.Open(path)
	if err != nil {
		fail(err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		fail(fmt.Errorf("stat %s: %v (size %d)", path, err, st.Size()))
		return
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		fail(err)
		return
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		fail(e)
		return
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	fmt.Printf("{\"resident\": %d, \"pages\": %d}\n", n, len(vec))
}
