package initproc

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/corral-dev/corral/internal/guest/exec"
	"github.com/corral-dev/corral/internal/guest/initproto"
	"golang.org/x/sys/unix"
)

// DefaultCaps is the capability set of a sandbox: guestexec.Caps, the
// same as a microVM command's.
var DefaultCaps = guestexec.Caps

// serveStage is the argument with which corral-init re-executes itself
// after hardening (see hardenAndExec).
const serveStage = "serve"

// poolMode is the serving stage's second argument in pool mode.
const poolMode = "pool"

// hardenAndExec applies the containment baseline — capabilities,
// no_new_privs, RLIMIT_CORE, seccomp — to this one OS thread and then
// re-executes corral-init from it (exe is an fd of the init binary, opened
// before pivot_root). The new program starts single-threaded with exactly
// these credentials and the filter, and every thread or process it makes
// inherits them. Capabilities, the bounding set and no_new_privs are
// per-thread in Linux; hardening a running multi-threaded Go process would
// need one stop-the-world AllThreadsSyscall per dropped capability (about
// 1 ms each, most of create latency). With a stub fd (else -1) the program
// is the stub (see execStub). It returns only on failure.
func hardenAndExec(cfg *initproto.Config, exe, stub int) error {
	runtime.LockOSThread() // never unlocked: execve replaces the process
	// Keep init itself out of the OOM killer's reach; commands get
	// commandOOMScoreAdj (see server.start). Needs CAP_SYS_RESOURCE, so
	// before the drop; best effort, as hosts that withhold it from the
	// node exist (init then stays at 0, below every command).
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
		fmt.Fprintln(os.Stderr, "corral-init: oom_score_adj:", err)
	}
	caps, serve := DefaultCaps, []string{"corral-init", serveStage}
	if cfg.Pool {
		// Init keeps poolCaps for resets; its forking thread drops them.
		caps, serve = append(slices.Clone(DefaultCaps), poolCaps...), append(serve, poolMode)
	}
	if err := dropBounding(caps); err != nil {
		return err
	}
	if err := setCaps(caps, DefaultCaps); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient caps: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := landlockScope(); err != nil {
		return err
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("rlimit core: %w", err)
	}
	if cfg.BestEffort {
		if err := schedIdle(); err != nil {
			return err
		}
	}
	if !cfg.NoSeccomp {
		if err := installSeccomp(cfg); err != nil {
			return err
		}
	}
	// The control listener and the setup socket live on in the serving stage.
	for _, fd := range []int{initproto.ListenFd, initproto.SetupFd} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("keep fd %d across exec: %w", fd, err)
		}
	}
	if stub >= 0 {
		return execStub(stub, exe)
	}
	return execveat(exe, serve)
}

// landlockScope puts init, and so every process of the sandbox, in a
// Landlock domain scoped against abstract unix sockets and signals: nothing
// inside can connect to an abstract socket bound by a process outside the
// sandbox (a harness or node helper sharing its network namespace) or
// signal a process outside it. Landlock judges by the socket's creator,
// which seccomp cannot see. Kernels before Landlock ABI 6 have no scopes;
// the sandbox's own network namespace is the boundary there.
func landlockScope() error {
	abi, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 || abi < 6 {
		return nil
	}
	attr := unix.LandlockRulesetAttr{Scoped: unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL}
	// The size of the ABI 6 struct (three u64): later fields are unknown
	// to older kernels.
	const attrSize = 24
	fd, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), attrSize, 0)
	if e != 0 {
		return fmt.Errorf("landlock ruleset: %w", e)
	}
	defer unix.Close(int(fd))
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); e != 0 {
		return fmt.Errorf("landlock restrict self: %w", e)
	}
	return nil
}

// schedIdle puts this thread, and so every process init will start, under
// SCHED_IDLE. RLIMIT_NICE 0 (soft and hard) keeps them there: leaving
// SCHED_IDLE needs a nice value within RLIMIT_NICE or CAP_SYS_NICE in the
// host's user namespace, and raising a hard rlimit CAP_SYS_RESOURCE there.
// Setting a policy stays allowed to a process, lowering it to SCHED_IDLE
// included; only the climb out is refused (EPERM).
func schedIdle() error {
	if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0); err != nil {
		return fmt.Errorf("sched_setattr SCHED_IDLE: %w", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NICE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("rlimit nice: %w", err)
	}
	return nil
}

// execveat runs the program behind fd with an empty environment.
func execveat(fd int, argv []string) error {
	argvp := make([]*byte, 0, len(argv)+1)
	for _, a := range argv {
		p, err := unix.BytePtrFromString(a)
		if err != nil {
			return err
		}
		argvp = append(argvp, p)
	}
	argvp = append(argvp, nil)
	envp := []*byte{&initEnv[0], nil}
	empty := []byte{0}
	_, _, e := unix.Syscall6(unix.SYS_EXECVEAT, uintptr(fd), uintptr(unsafe.Pointer(&empty[0])),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])), unix.AT_EMPTY_PATH, 0)
	return fmt.Errorf("re-exec corral-init: %w", e)
}

// initEnv is the serving stage's whole environment: one P from the start,
// so that the runtime never starts the threads of a second one (an idle
// init's threads are host PIDs).
var initEnv = []byte("GOMAXPROCS=1\x00")

func lastCap() (uintptr, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("cap_last_cap: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("cap_last_cap: %w", err)
	}
	return uintptr(n), nil
}

// dropBounding drops every capability outside keep from this thread's
// bounding set.
func dropBounding(keep []uintptr) error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := uintptr(0); c <= last; c++ {
		if slices.Contains(keep, c) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			return fmt.Errorf("drop bounding cap %d: %w", c, err)
		}
	}
	return nil
}

// setCaps sets this thread's effective and permitted sets to caps and its
// inheritable set to inh.
func setCaps(caps, inh []uintptr) error {
	var mask, imask [2]uint32
	for _, c := range caps {
		mask[c/32] |= 1 << (c % 32)
	}
	for _, c := range inh {
		imask[c/32] |= 1 << (c % 32)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for i := range data {
		data[i] = unix.CapUserData{Effective: mask[i], Permitted: mask[i], Inheritable: imask[i]}
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
