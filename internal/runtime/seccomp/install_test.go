//go:build linux && amd64

package seccomp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The behaviour tests re-exec the test binary with childEnv set. The child sets
// no_new_privs, installs the default filter (mode "filtered") or not (mode "baseline"),
// runs every probe and prints one JSON result per line. The parent asserts the filtered
// results and uses the baseline to tell whether a probe really distinguishes the filter.
const (
	childEnv    = "CORRAL_SECCOMP_TEST_CHILD"
	childDirEnv = "CORRAL_SECCOMP_TEST_DIR"

	wantOK       = 0  // the call succeeds
	wantNotEPERM = -1 // the call may fail for reasons of its own, but not by the filter
	otherErr     = -2 // a failure without an errno (see note)
)

type result struct {
	Name  string `json:"name"`
	Errno int    `json:"errno"`
	Ret   int64  `json:"ret,omitempty"`
	Note  string `json:"note,omitempty"`
	Skip  string `json:"skip,omitempty"`
}

type probe struct {
	name string
	want int // an errno, wantOK or wantNotEPERM
	// unsafe probes are never run without the filter: unfiltered they would really act on
	// the host (freeze or shut down a filesystem, load a kernel). They still aim at
	// harmless targets (a pipe, bad flags) in case the filter is wrong.
	unsafe bool
	run    func(dir string) result
}

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(childMain(mode))
	}
	os.Exit(m.Run())
}

func childMain(mode string) int {
	if mode == "filtered" {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "no_new_privs:", err)
			return 2
		}
		prog, err := Compile(DefaultProfile())
		if err == nil {
			err = Install(prog)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	dir := os.Getenv(childDirEnv)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for _, p := range probes() {
		if mode == "baseline" && p.unsafe {
			continue
		}
		r := p.run(dir)
		r.Name = p.name
		if err := enc.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	if err := out.Flush(); err != nil {
		return 2
	}
	return 0
}

func runChild(t *testing.T, mode, dir string) map[string]result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, childDirEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s child: %v\n%s", mode, err, stderr.String())
	}
	res := map[string]result{}
	for line := range bytes.Lines(out) {
		var r result
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("%s child printed %q: %v", mode, line, err)
		}
		res[r.Name] = r
	}
	return res
}

func TestFilterInChild(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the profile is for x86_64")
	}
	if status, err := os.ReadFile("/proc/self/status"); err != nil || !bytes.Contains(status, []byte("\nSeccomp:")) {
		t.Skip("not supported: seccomp filters (needs a kernel with CONFIG_SECCOMP_FILTER and /proc)")
	}
	if os.Geteuid() != 0 {
		t.Log("not root: the kernel refuses some probes by itself, so they cannot show the filter works")
	}
	filtered := runChild(t, "filtered", t.TempDir())
	baseline := runChild(t, "baseline", t.TempDir())
	for _, p := range probes() {
		t.Run(p.name, func(t *testing.T) {
			got, ok := filtered[p.name]
			if !ok {
				t.Fatal("the filtered child did not report this probe")
			}
			if got.Skip != "" {
				t.Skip(got.Skip)
			}
			switch {
			case p.want == wantNotEPERM && got.Errno == int(unix.EPERM):
				t.Errorf("got EPERM, want anything else: %s", got.Note)
			case p.want >= 0 && got.Errno != p.want:
				t.Errorf("got %s, want %s (%s)", errName(got.Errno), errName(p.want), got.Note)
			}
			if b, ok := baseline[p.name]; ok && (p.want == eperm || p.want == enosys) && b.Errno == p.want {
				t.Logf("without the filter the call also fails with %s: not discriminating on this machine", errName(b.Errno))
			}
		})
	}
}

func errName(e int) string {
	switch e {
	case wantOK:
		return "success"
	case otherErr:
		return "a non-errno failure"
	}
	return unix.ErrnoName(syscall.Errno(e)) + " (" + syscall.Errno(e).Error() + ")"
}

// pinned keeps the memory handed to raw syscalls alive.
var pinned [][]byte

func cstr(s string) uintptr {
	b := append([]byte(s), 0)
	pinned = append(pinned, b)
	return uintptr(unsafe.Pointer(&b[0]))
}

func buf(n int) uintptr {
	b := make([]byte, n)
	pinned = append(pinned, b)
	return uintptr(unsafe.Pointer(&b[0]))
}

func sys(nr uintptr, args ...uintptr) result {
	var a [6]uintptr
	copy(a[:], args)
	r, _, e := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
	return result{Errno: int(e), Ret: int64(r)}
}

// sysFD is sys for calls that return a file descriptor, which it closes.
func sysFD(nr uintptr, args ...uintptr) result {
	r := sys(nr, args...)
	if r.Errno == 0 {
		unix.Close(int(r.Ret))
	}
	return r
}

func fromErr(err error) result {
	if err == nil {
		return result{}
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return result{Errno: int(e), Note: err.Error()}
	}
	return result{Errno: otherErr, Note: err.Error()}
}

// expect turns a failed expectation of ordinary work into a result.
func expect(ok bool, format string, args ...any) result {
	if ok {
		return result{}
	}
	return result{Errno: otherErr, Note: fmt.Sprintf(format, args...)}
}
