package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/probeproto"
)

// Modes "hog SECONDS" and "kres" (round 2 of the red team): node-wide
// kernel resources that the kernel counts per user.
//
// hog opens inotify instances and POSIX message queues until the kernel
// refuses, prints what it got as one JSON line (name kernel2/hog), then
// holds them for SECONDS so that the suite can check the host and a
// neighbour meanwhile. kres makes one of each (what an ordinary program
// does) and reports kernel2/inotify-init and kernel2/mqueue-open.

// HogResult is the hog's line.
type HogResult struct {
	Name    string `json:"name"`
	Inotify int    `json:"inotify"`
	InoErr  string `json:"inotify_errno"`
	Mqueues int    `json:"mqueues"`
	MqErr   string `json:"mqueue_errno"`
}

// mqAttr is struct mq_attr.
type mqAttr struct {
	Flags, MaxMsg, MsgSize, CurMsgs int64
	_                               [4]int64
}

// mqOpen creates queue name (no leading slash, as the syscall takes it)
// of 10 messages of 8 KiB, the default maximum: ~80 KiB of the user's
// RLIMIT_MSGQUEUE each.
func mqOpen(name string) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	attr := mqAttr{MaxMsg: 10, MsgSize: 8192}
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)),
		uintptr(unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC), 0o600, uintptr(unsafe.Pointer(&attr)), 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

func mqUnlink(name string) {
	if p, err := unix.BytePtrFromString(name); err == nil {
		_, _, _ = unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0)
	}
}

func hog(args []string) {
	secs := 30.0
	if len(args) > 0 {
		if v, err := strconv.ParseFloat(args[0], 64); err == nil && v > 0 && v <= 600 {
			secs = v
		}
	}
	r := HogResult{Name: "kernel2/hog"}
	for r.Inotify < 4096 {
		if _, err := unix.InotifyInit1(unix.IN_CLOEXEC); err != nil {
			r.InoErr = errnoName(err)
			break
		}
		r.Inotify++
	}
	for r.Mqueues < 4096 {
		name := fmt.Sprintf("corral-hog-%d-%d", os.Getpid(), r.Mqueues)
		if _, err := mqOpen(name); err != nil {
			r.MqErr = errnoName(err)
			break
		}
		r.Mqueues++
	}
	_ = out.Encode(r)
	time.Sleep(time.Duration(secs * float64(time.Second)))
	for i := range r.Mqueues {
		mqUnlink(fmt.Sprintf("corral-hog-%d-%d", os.Getpid(), i))
	}
}

func kres() []probeproto.Result {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	ino := fromErr("kernel2/inotify-init", err, "inotify_init1")
	if err == nil {
		unix.Close(fd)
	}
	name := fmt.Sprintf("corral-kres-%d", os.Getpid())
	fd, err = mqOpen(name)
	mq := fromErr("kernel2/mqueue-open", err, "mq_open of 10 x 8 KiB")
	if err == nil {
		unix.Close(fd)
		mqUnlink(name)
	}
	return []probeproto.Result{ino, mq}
}

// spin burns secs of CPU (its own, by getrusage) and exits (mode "spin").
func spin(secs float64) {
	want := time.Duration(secs * float64(time.Second))
	for {
		var ru unix.Rusage
		_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
		if time.Duration(ru.Utime.Nano()+ru.Stime.Nano()) >= want {
			return
		}
	}
}

// detach starts n spinners of secs each in sessions of their own, not
// waited for (re-parented to the sandbox's init as soon as this exits),
// then sleeps wait seconds without using CPU (mode "detach N SECS WAIT").
func detach(args []string) {
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: corral-probe detach N SECS WAIT")
		os.Exit(2)
	}
	n, _ := strconv.Atoi(args[0])
	wait, _ := strconv.ParseFloat(args[2], 64)
	self, _ := os.Executable()
	for range min(n, 64) {
		p, err := os.StartProcess(self, []string{"corral-probe", "spin", args[1]}, &os.ProcAttr{
			Files: []*os.File{nil, nil, nil}, Sys: &syscall.SysProcAttr{Setsid: true}})
		if err != nil {
			fmt.Fprintln(os.Stderr, "detach:", err)
			os.Exit(1)
		}
		_ = p.Release()
	}
	time.Sleep(time.Duration(wait * float64(time.Second)))
}

// syncWrites times n writes of 4 KiB to path, each followed by fsync, and
// prints {"name":"kernel2/sync-writes","seconds":S} (mode "syncwrites").
func syncWrites(path string, n int) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "syncwrites:", err)
		os.Exit(1)
	}
	defer os.Remove(path)
	defer f.Close()
	buf := make([]byte, 4096)
	start := time.Now()
	for range n {
		_, err := f.Write(buf)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "syncwrites:", err)
			os.Exit(1)
		}
	}
	fmt.Printf("{\"name\":\"kernel2/sync-writes\",\"seconds\":%.4f}\n", time.Since(start).Seconds())
}

// diskFlood writes path with O_DIRECT in 1 MiB blocks, fsync after each, for
// secs (mode "flood"): the attacker of the I/O row.
func diskFlood(path string, secs float64) {
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(1)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		os.Exit(1)
	}
	deadline := time.Now().Add(time.Duration(secs * float64(time.Second)))
	var off, total int64
	for time.Now().Before(deadline) {
		n, err := unix.Pwrite(fd, buf, off)
		if err != nil {
			off = 0 // the disk is full: write over the start
			continue
		}
		_ = unix.Fsync(fd)
		total += int64(n)
		if off += int64(n); off >= 48<<20 {
			off = 0
		}
	}
	fmt.Printf("{\"name\":\"kernel2/flood\",\"mib_per_s\":%.1f}\n", float64(total)/(1<<20)/secs)
}
