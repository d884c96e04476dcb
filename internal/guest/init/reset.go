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
	forker *forker  // nil while a node's view is detached (between reset and OpView)
	cursor *os.File // the PID namespace's ns_last_pid; nil if the kernel has none
	// mqEmptySize is the mqueue root's size when a listing found it
	// empty (0 until one has); see removeMqueues.
	mqEmptySize int64
}

// killDeadline bounds how long a reset waits for every process to go.
const killDeadline = 5 * time.Second

// renew records the view's empty state and makes a forker for it.
func (p *pool) renew() error {
	fp, err := takeFingerprint(&p.cfg)
	if err != nil {
		return fmt.Errorf("pool: %w", err)
	}
	f, err := newForker(p.cfg.Seccomp)
	if err != nil {
		return err
	}
	if p.forker != nil {
		p.forker.stop()
	}
	p.base, p.forker = fp, f
	return nil
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
		// view's disk to be let go.
		p.forker.stop()
		p.forker = nil
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
	if err := p.renew(); err != nil {
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
	return p.renew()
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
