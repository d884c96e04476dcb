//go:build linux && amd64

package seccomp

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestProfileIsTotal: every x86_64 syscall has a reviewed entry with a reason, and the
// floor holds only Docker's unconditional allows.
func TestProfileIsTotal(t *testing.T) {
	p := DefaultProfile()
	for _, name := range x86_64Syscalls {
		if r, ok := p.rules[name]; name != "" && (!ok || r.why == "") {
			t.Errorf("%s: no entry or no reason in the profile", name)
		}
	}
	for name, r := range floorRules {
		if r.def != actAllow || len(r.checks) > 0 {
			t.Errorf("floor entry %s is not a plain allow: tighten it in corralRules", name)
		}
	}
	for name, r := range p.rules {
		for _, c := range r.checks {
			if c.why == "" {
				t.Errorf("%s: argument check without a reason", name)
			}
		}
	}
}

func TestSyscallTableMatchesABI(t *testing.T) {
	for name, nr := range map[string]int{"read": unix.SYS_READ, "ioctl": unix.SYS_IOCTL, "clone": unix.SYS_CLONE,
		"socket": unix.SYS_SOCKET, "uretprobe": unix.SYS_URETPROBE, "clone3": unix.SYS_CLONE3,
		"io_uring_setup": unix.SYS_IO_URING_SETUP, "file_setattr": unix.SYS_FILE_SETATTR,
		"rseq_slice_yield": unix.SYS_RSEQ_SLICE_YIELD} {
		if got := nrOf(t, name); got != uint32(nr) {
			t.Errorf("%s = %d, x/sys says %d", name, got, nr)
		}
	}
	f, err := os.Open("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
	if err != nil {
		t.Skipf("kernel header not installed: %v", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	n := 0
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) != 3 || fields[0] != "#define" || !strings.HasPrefix(fields[1], "__NR_") {
			continue
		}
		nr, err := strconv.Atoi(fields[2])
		if err != nil {
			continue
		}
		n++
		if name := strings.TrimPrefix(fields[1], "__NR_"); nr >= len(x86_64Syscalls) || x86_64Syscalls[nr] != name {
			t.Errorf("header: %s = %d, not in the table", name, nr)
		}
	}
	if n < 300 {
		t.Errorf("parsed only %d syscalls from the header", n)
	}
}

func TestConstantsMatchUnix(t *testing.T) {
	ioc := func(dir, typ, nr, size uint32) uint32 { return dir<<30 | size<<16 | typ<<8 | nr }
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"TIOCSTI", tiocsti, unix.TIOCSTI},
		{"TIOCLINUX", tioclinux, unix.TIOCLINUX},
		{"FS_IOC_FSGETXATTR", fsIocFsgetxattr, uint64(ioc(2, 'X', 31, 28))},
		{"FS_IOC_FSSETXATTR", fsIocFssetxattr, uint64(ioc(1, 'X', 32, 28))},
		{"AF_UNIX", afUnix, unix.AF_UNIX}, {"AF_INET", afInet, unix.AF_INET},
		{"AF_INET6", afInet6, unix.AF_INET6}, {"AF_NETLINK", afNetlink, unix.AF_NETLINK},
		{"SOCK_RAW", sockRaw, unix.SOCK_RAW},
		{"S_IFMT", sIFMT, unix.S_IFMT}, {"S_IFBLK", sIFBLK, unix.S_IFBLK}, {"S_IFCHR", sIFCHR, unix.S_IFCHR},
		{"clone namespace flags", cloneNSFlags, unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
			unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME},
		{"AUDIT_ARCH_X86_64", auditArchX86_64, unix.AUDIT_ARCH_X86_64},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

func TestCompileRejectsBadProfiles(t *testing.T) {
	for name, p := range map[string]*Profile{
		"nil":          nil,
		"unknown name": {rules: map[string]rule{"socketcall": allow("i386 only")}},
		"bad arg":      {rules: map[string]rule{"ioctl": {checks: []check{{when: []cond{eq(6, 1)}}}}}},
		"value outside mask": {rules: map[string]rule{"ioctl": {checks: []check{
			{when: []cond{masked(1, 0xff00, 0x1)}}}}}},
		"empty check": {rules: map[string]rule{"ioctl": {checks: []check{{}}}}},
	} {
		if _, err := Compile(p); err == nil {
			t.Errorf("%s: Compile accepted it", name)
		}
	}
	if err := Install(nil); err == nil {
		t.Error("Install(nil) succeeded")
	}
}
