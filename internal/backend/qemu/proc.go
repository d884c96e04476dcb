package qemu

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/qmp"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// Launch is a QEMU process to start.
type Launch struct {
	// Args is the whole command line, argv[0] the binary.
	Args []string
	// Dir is the sandbox's run dir (QEMU's working directory); Log the
	// file QEMU's stdout and stderr are appended to; QMP its QMP socket.
	Dir, Log, QMP string
	// Net, when set, is the network slot: QEMU starts in its namespace
	// (and so holds it, tap and veth, through a daemon restart) with the
	// tap as fd 3.
	Net *netpolicy.Sandbox
	// CPU, when set, gets the process into sandbox ID's VMM cgroup at
	// once, with a quota of CPUMillis (0: none until CPU.Limit).
	CPU       *CPUGroups
	ID        string
	CPUMillis int64
}

// Start starts QEMU in its own session (the VM outlives a daemon restart,
// and a signal to the daemon's group does not reach it) and returns once
// its QMP socket answers, with that connection open (the caller closes
// it). On failure nothing of the process remains.
func Start(ctx context.Context, l Launch) (*launch.Process, *qmp.Client, error) {
	logf, err := os.OpenFile(l.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer logf.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, nil, err
	}
	defer null.Close()
	pidfd := -1
	files := []*os.File{null, logf, logf}
	var ns *os.File
	if l.Net != nil {
		if l.Net.Tap() == nil {
			return nil, nil, fmt.Errorf("start qemu: the network slot has no tap (lost with a daemon restart)")
		}
		files, ns = append(files, l.Net.Tap()), l.Net.Netns()
	}
	var p *os.Process
	err = netpolicy.InNetns(ns, func() error {
		var err error
		p, err = os.StartProcess(l.Args[0], l.Args, &os.ProcAttr{Dir: l.Dir, Files: files,
			Sys: &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd}})
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("start qemu: %w", err)
	}
	proc, err := Adopt(p, pidfd)
	if err != nil {
		return nil, nil, err
	}
	if err := l.CPU.Join(l.ID, proc.Pid, l.CPUMillis); err != nil {
		_ = proc.Kill()
		<-proc.Done()
		return nil, nil, fmt.Errorf("start qemu: %w", err)
	}
	qc, err := Dial(ctx, l.QMP, l.Log, proc)
	if err != nil {
		_ = proc.Kill()
		<-proc.Done()
		return nil, nil, err
	}
	return proc, qc, nil
}

// Adopt watches the VMM process p just started (with SysProcAttr.PidFD
// set to pidfd); on failure p is killed and reaped.
func Adopt(p *os.Process, pidfd int) (*launch.Process, error) {
	proc, err := launch.Adopt(p.Pid, pidfd)
	if err != nil {
		_ = p.Kill()
		_, _ = p.Wait()
		return nil, err
	}
	_ = p.Release()
	return proc, nil
}

// Dial connects to a QMP socket within 30 s; with proc set it fails as
// soon as that QEMU exits, naming the end of its log.
func Dial(ctx context.Context, sock, log string, proc *launch.Process) (*qmp.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if proc != nil {
		go func() {
			select {
			case <-proc.Done():
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	qc, err := qmp.Dial(ctx, sock)
	if err != nil {
		if proc != nil {
			select {
			case <-proc.Done():
				return nil, fmt.Errorf("qemu exited at start: %s", TailFile(log, 800))
			default:
			}
		}
		return nil, err
	}
	return qc, nil
}

// Run runs one QMP command on a fresh connection (QEMU serves one client
// per socket; commands are rare next to exec).
func Run(ctx context.Context, sock, cmd string, args any) ([]byte, error) {
	qc, err := qmp.Dial(ctx, sock)
	if err != nil {
		return nil, err
	}
	defer qc.Close()
	return qc.Run(ctx, cmd, args)
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times (100 on
// every Linux architecture corral runs on).
const clockTicks = 100

// ProcStats is what QEMU process pid costs the node: its CPU time and
// resident memory (guest RAM it touched included).
func ProcStats(pid int) (cpu time.Duration, rss int64, err error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command name (which may hold spaces) in ")": utime
	// and stime are the 12th and 13th, rss (pages) the 22nd.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 22 {
		return 0, 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	pages, _ := strconv.ParseInt(f[21], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks, pages * int64(os.Getpagesize()), nil
}

// HostTSCkHz is the host CPU's clock in kHz from /proc/cpuinfo (0 when
// unknown), the rate TCG guests see their TSC run at: they are told it,
// as they cannot calibrate it against the PIT on a loaded host.
func HostTSCkHz() int64 {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if name, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0
			}
			return int64(mhz * 1000)
		}
	}
	return 0
}

// Escape doubles commas, QEMU's option separator.
func Escape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// TailFile returns the end of a (log) file for error messages.
func TailFile(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return strings.TrimSpace(string(b))
}
