package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/probeproto"
)

// Modes for the fncall rows of round 2, each a step of an attack that
// spans calls on one pooled sandbox: "mq put NAME" leaves a POSIX message
// queue with a message, "mq get NAME" reports whether it is still there
// (kernel2/mq-get: blocked ENOENT when not); "pid" prints its own pid and
// the sandbox's identity (its init's start time); "forkn N" runs N
// short-lived children.

func mqMode(args []string) []probeproto.Result {
	if len(args) != 2 {
		return one(probeproto.Result{Name: "kernel2/mq", Outcome: blocked, Errno: "USAGE"})
	}
	switch args[0] {
	case "put":
		fd, err := mqOpen(args[1])
		if err == nil {
			msg := []byte("left by an earlier call")
			_, _, e := unix.Syscall6(unix.SYS_MQ_TIMEDSEND, uintptr(fd), uintptr(unsafe.Pointer(&msg[0])), uintptr(len(msg)), 0, 0, 0)
			if e != 0 {
				err = e
			}
		}
		return one(fromErr("kernel2/mq-put", err, "mq_open + mq_send /"+args[1]))
	default:
		p, _ := unix.BytePtrFromString(args[1])
		_, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), uintptr(unix.O_RDONLY|unix.O_NONBLOCK), 0, 0, 0, 0)
		var err error
		if e != 0 {
			err = e
		}
		return one(fromErr("kernel2/mq-get", err, "mq_open /"+args[1]+" left by an earlier call"))
	}
}

// pidLine prints "PID IDENTITY".
func pidLine() {
	b, _ := os.ReadFile("/proc/1/stat")
	s := string(b)
	id := "?"
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		if f := strings.Fields(s[i+1:]); len(f) > 19 {
			id = f[19]
		}
	}
	fmt.Println(os.Getpid(), id)
}

func forkN(args []string) {
	n := 0
	if len(args) > 0 {
		n, _ = strconv.Atoi(args[0])
	}
	self, _ := os.Executable()
	for range min(n, 1000) {
		_ = exec.Command(self, "noop").Run()
	}
}
