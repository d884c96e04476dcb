// Command ipctool makes SysV IPC objects ("make") or counts those in its
// IPC namespace ("count"), makes a POSIX message queue ("mqmake NAME") or
// says whether one exists ("mqhas NAME": 1 or 0), for the reset and
// recycle tests: busybox has no ipcmk/ipcs.
package main

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	switch os.Args[1] {
	case "make":
		if _, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600); err != nil {
			fail(err)
		}
		if _, _, e := unix.Syscall(unix.SYS_SEMGET, unix.IPC_PRIVATE, 2, unix.IPC_CREAT|0o600); e != 0 {
			fail(e)
		}
		if _, _, e := unix.Syscall(unix.SYS_MSGGET, unix.IPC_PRIVATE, unix.IPC_CREAT|0o600, 0); e != 0 {
			fail(e)
		}
	case "count":
		n := 0
		for _, t := range []string{"shm", "sem", "msg"} {
			b, err := os.ReadFile("/proc/sysvipc/" + t)
			if err != nil {
				fail(err)
			}
			n += strings.Count(strings.TrimSpace(string(b)), "\n") // minus the header line
		}
		fmt.Println(n)
	case "mqmake", "mqhas":
		name, err := unix.BytePtrFromString(os.Args[2])
		if err != nil {
			fail(err)
		}
		flags := unix.O_RDONLY
		if os.Args[1] == "mqmake" {
			flags |= unix.O_CREAT
		}
		fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), uintptr(flags), 0o600, 0, 0, 0)
		switch {
		case e == unix.ENOENT && os.Args[1] == "mqhas":
			fmt.Println(0)
		case e != 0:
			fail(e)
		default:
			unix.Close(int(fd))
			if os.Args[1] == "mqhas" {
				fmt.Println(1)
			}
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "ipctool:", err)
	os.Exit(1)
}
