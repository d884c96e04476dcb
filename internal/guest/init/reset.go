package initproc

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pool is the serving stage's state in pool mode.
type pool struct {
	cfg poolConfig

	mu     sync.Mutex // held by resets and while a command is forked
	base   fingerprint
	forker *forker // nil while a node's view is detached (between reset and OpView)
	// netBase is the forker's network namespace as it was made (see
	// netState); nil if it could not be read. netOwn: that namespace is
	// init's own (no tenant has used the network since the sandbox was
	// made), so a forker made without freshNet gets it again; freshNext:
	// the next forker needs a fresh one (a dirty reset found it used).
	netBase   []byte
	netOwn    bool
	freshNext bool
	cursor    *os.File // the PID namespace's ns_last_pid; nil if the kernel has none
	// mqEmptySize is the mqueue root's size when a listing found it
	// empty (0 until one has); see removeMqueues.
	mqEmptySize int64
}

// killDeadline bounds how long a reset waits for every process to go.
const killDeadline = 5 * time.Second

// renew records the view's empty state and makes a forker for it, in a
// network namespace of its own when freshNet.
func (p *pool) renew(freshNet bool) error {
	fp, err := takeFingerprint(&p.cfg)
	if err != nil {
		return fmt.Errorf("pool: %w", err)
	}
	if err := p.newForker(freshNet); err != nil {
		return err
	}
	p.base = fp
	return nil
}

// newForker replaces the forker (if any) with a new one.
func (p *pool) newForker(freshNet bool) error {
	f, err := newForker(p.cfg.Seccomp, freshNet)
	if err != nil {
		return err
	}
	if p.forker != nil {
		p.forker.stop()
	}
	p.forker, p.netOwn = f, !freshNet
	if p.cfg.View {
		p.netBase, _ = netState(f.tid)
	}
	return nil
}

// netFiles are what a process without CAP_NET_ADMIN or CAP_NET_RAW can
// change in a loopback-only network namespace and a later one read: the
// interface's counters and the IP, ICMP, TCP and UDP statistics (every
// packet, and every connect that found no route, moves one of them; a
// socket in TIME_WAIT needs packets too). Sockets themselves close with
// their processes, and /proc/sys is read-only in the view.
var netFiles = []string{"dev", "snmp", "snmp6", "netstat"}

// netState reads netFiles in the network namespace of init's thread tid.
func netState(tid int) ([]byte, error) {
	var b []byte
	for _, f := range netFiles {
		c, err := os.ReadFile(poolProc + "/1/task/" + strconv.Itoa(tid) + "/net/" + f)
		if err != nil && !os.IsNotExist(err) { // snmp6 without IPv6
			return nil, err
		}
		b = append(append(b, f...), c...)
	}
	return b, nil
}

// netUnchanged says whether the forker's network namespace reads as it
// did when the forker was made: no tenant since used it.
func (p *pool) netUnchanged() bool {
	now, err := netState(p.forker.tid)
	return err == nil && p.netBase != nil && string(now) == string(p.netBase)
}

// reset kills every process but init and keep, removes SysV IPC objects
// and, if anything was written, kills keep too and replaces the view with a
// fresh one (a node's view: detaches it, for attach to replace). It reports
// whether the view was written to.
func (p *pool) reset(keep []int) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.forker == nil {
		return false, errors.New("reset: the view is detached: send the next one first")
	}
	if err := killAllBut(keep); err != nil {
		return false, err
	}
	netKept := p.cfg.View && p.netUnchanged()
	removeIPC()
	if err := p.removeMqueues(); err != nil {
		return false, err
	}
	if err := p.rewindPids(1); err != nil {
		return false, err
	}
	fp, err := takeFingerprint(&p.cfg)
	if err != nil {
		return false, fmt.Errorf("reset: %w", err)
	}
	if fp == p.base {
		for _, pid := range keep {
			_ = unix.Kill(pid, unix.SIGCONT)
		}
		if p.cfg.View && !netKept {
			// The next tenant gets a network namespace of its own
			// (attach does the same after a dirty reset).
			if err := p.newForker(true); err != nil {
				return false, fmt.Errorf("reset: %w", err)
			}
		}
		return false, nil
	}
	if err := killAll(); err != nil {
		return true, err
	}
	if err := p.rewindPids(1); err != nil { // the new forker's thread low
		return true, err
	}
	if p.cfg.View {
		// The forker's root is in the view: its thread must end for the
		// view's disk to be let go. The next one serves in init's own
		// network namespace again if that is the one nobody used.
		p.forker.stop()
		p.forker = nil
		p.freshNext = !(netKept && p.netOwn)
	}
	if err := unmountView(&p.cfg); err != nil {
		return true, fmt.Errorf("reset: %w", err)
	}
	if p.cfg.View {
		return true, nil
	}
	if err := mountView(&p.cfg); err != nil {
		return true, fmt.Errorf("reset: %w", err)
	}
	if err := p.renew(false); err != nil {
		return true, fmt.Errorf("reset: %w", err)
	}
	return true, nil
}

// attach furnishes the node's fresh view fd (closed here) after a dirty
// reset detached the last one, and makes its forker.
func (p *pool) attach(fd int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cfg.View || p.forker != nil {
		unix.Close(fd)
		return errors.New("view: no detached view to replace (only after a dirty reset of a sandbox whose views the node makes)")
	}
	if err := attachView(&p.cfg, fd); err != nil {
		return err
	}
	return p.renew(p.freshNext)
}

// killAll SIGKILLs every process of the PID namespace but init until none
// is left: kill(-1) fails with ESRCH only when no other process (zombies
// included, which the reaper collects) exists. The usual reset, after a
// call that left nothing running, is settled by noChildren alone: kill(-1)
// walks every process of the host (the kernel looks at each for one
// visible in this namespace), about 100 µs on a host of 3,000 processes.
func killAll() error {
	deadline := time.Now().Add(killDeadline)
	for {
		if noChildren() {
			return nil
		}
		err := unix.Kill(-1, unix.SIGKILL)
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reset: kill -1: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reset: processes left %v after SIGKILL", killDeadline)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// noChildren reports whether init has no child, running or a zombie (left
// unreaped: WNOWAIT). A pooled init is PID 1 (never under the stub), so
// every other process of the PID namespace descends from it: none can join
// the namespace from outside (setns is refused in the sandbox, and the
// node never joins a sandbox's PID namespace). Without children, init is
// alone.
func noChildren() bool {
	if os.Getpid() != 1 {
		return false // orphans would go to another reaper: ask kill(-1)
	}
	var info unix.Siginfo
	return unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil) == unix.ECHILD
}

// killAllBut is killAll sparing the processes keep (none: killAll): it
// SIGKILLs every other process of /proc until none is left.
func killAllBut(keep []int) error {
	if len(keep) == 0 {
		return killAll()
	}
	deadline := time.Now().Add(killDeadline)
	for {
		ents, err := os.ReadDir(poolView + "/proc")
		if err != nil {
			return fmt.Errorf("reset: list processes: %w", err)
		}
		left := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == 1 || slices.Contains(keep, pid) || keptZombie(pid, keep) {
				continue
			}
			left++
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reset: processes left %v after SIGKILL", killDeadline)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// removeIPC removes every SysV shared memory segment, semaphore set and
// message queue of the sandbox's IPC namespace (best effort).
func removeIPC() {
	if !ipcInUse() {
		return
	}
	for _, k := range []struct {
		file string
		rm   func(id int)
	}{
		{"shm", func(id int) { _, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil) }},
		{"sem", func(id int) { _, _, _ = unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, unix.IPC_RMID, 0, 0, 0) }},
		{"msg", func(id int) { _, _, _ = unix.Syscall(unix.SYS_MSGCTL, uintptr(id), unix.IPC_RMID, 0) }},
	} {
		for _, id := range ipcIDs(poolView + "/proc/sysvipc/" + k.file) {
			k.rm(id)
		}
	}
}

// ipcIDs reads the ids (second column) of a /proc/sysvipc table.
func ipcIDs(path string) []int {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var ids []int
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		if id, err := strconv.Atoi(fields[1]); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// ipcInUse asks the kernel whether the IPC namespace holds any SysV object,
// three syscalls instead of reading three /proc tables on every reset. It
// says yes when it cannot tell.
func ipcInUse() bool {
	const (
		shmInfo = 14 // SHM_INFO: struct shm_info, used_ids first
		msgInfo = 12 // MSG_INFO: struct msginfo, msgpool (queues in use) first
		semInfo = 19 // SEM_INFO: struct seminfo, semusz (sets in use) 8th int
	)
	var buf [128]byte
	p := uintptr(unsafe.Pointer(&buf[0]))
	counts := []func() (int32, bool){
		func() (int32, bool) {
			_, _, e := unix.Syscall(unix.SYS_SHMCTL, 0, shmInfo, p)
			return int32(binary.NativeEndian.Uint32(buf[0:])), e == 0
		},
		func() (int32, bool) {
			_, _, e := unix.Syscall(unix.SYS_MSGCTL, 0, msgInfo, p)
			return int32(binary.NativeEndian.Uint32(buf[0:])), e == 0
		},
		func() (int32, bool) {
			_, _, e := unix.Syscall6(unix.SYS_SEMCTL, 0, 0, semInfo, p, 0, 0)
			return int32(binary.NativeEndian.Uint32(buf[28:])), e == 0
		},
	}
	for _, count := range counts {
		clear(buf[:])
		if n, ok := count(); !ok || n != 0 {
			return true
		}
	}
	return false
}
