package container

import (
	"fmt"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestUserNamespaceOwner: a sandbox's user namespace is owned by the
// sandbox's own host uid, not by host root, so that the kernel charges its
// per-user counts (inotify, POSIX message queues…) to that uid.
func TestUserNamespaceOwner(t *testing.T) {
	b := newBackend(t)
	s := newSandbox(t, b, nil).(*sandbox)
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", s.proc.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const nsGetOwnerUID = 0xb704 // _IO(0xb7, 0x4)
	var uid uint32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&uid))); e != 0 {
		t.Fatalf("NS_GET_OWNER_UID: %v", e)
	}
	if uid != s.ids.Host {
		t.Fatalf("user namespace owner %d, want the sandbox's host uid %d", uid, s.ids.Host)
	}
	// The node's own thread got its identity back: it still creates files as root.
	if os.Geteuid() != 0 {
		t.Fatalf("daemon euid %d after a spawn, want 0", os.Geteuid())
	}
	if r := sh(t, s, "id -u"); r.stdout != "0\n" {
		t.Fatalf("inside: %+v", r)
	}
}
