package vm

import (
	"context"
	"encoding/json"
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

// OVMF firmware files (Debian's ovmf package), for uefi images.
var (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// qemuArgs is the command line of a q35 machine: PCI virtio devices, a
// standard VGA screen (screendump), the PS/2 keyboard of the board and a
// virtio one, a virtio tablet (absolute pointer, so clicks land where
// asked), the guest agent's virtio-serial port, the overlay disk.
func qemuArgs(bin string, m *machine) []string {
	accel := []string{"-accel", "tcg,thread=multi,tb-size=64", "-cpu", "max"}
	if m.KVM {
		accel = []string{"-accel", "kvm", "-cpu", "host"}
	}
	args := []string{bin, "-M", "q35,memory-backend=ram",
		// Guest RAM from a memfd, not anonymous memory that QEMU would give
		// transparent huge pages (costly for idle guests; see microvm).
		"-object", fmt.Sprintf("memory-backend-memfd,id=ram,size=%dM", m.MemoryMiB)}
	args = append(args, accel...)
	args = append(args,
		"-name", "corral-"+m.id,
		"-m", fmt.Sprintf("%dM", m.MemoryMiB),
		"-smp", strconv.Itoa(m.VCPUs),
		"-nodefaults", "-no-user-config", "-display", "none",
		// QEMU's own seccomp filter: no obsolete syscalls, no setuid or
		// privilege changes, no scheduler or affinity changes. Spawning
		// stays allowed: snapshots stream through `exec:cat`.
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=allow,resourcecontrol=deny",
		// A guest reboot ends QEMU (and the sandbox), as a panic does.
		"-no-reboot",
		"-vga", "std",
		// The screen as VNC on a unix socket in the run dir (no TCP port,
		// nothing the guest can reach): the node's live view relays it.
		"-vnc", "unix:"+qemuEscape(m.path(vncSock))+",share=force-shared",
		"-serial", "file:"+m.path(consoleFile),
		"-qmp", "unix:"+m.path(qmpSock)+",server=on,wait=off",
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=qga0,path="+qemuEscape(m.path(qgaSock))+",server=on,wait=off",
		"-device", "virtserialport,chardev=qga0,name="+qgaPortName,
		// A virtio keyboard beside the board's PS/2 one: QEMU sends keys
		// to it once the guest drives it, and its queue of 64 events
		// does not drop keys the way PS/2's 16 bytes do when an emulated
		// guest is slow to read them.
		"-device", "virtio-keyboard-pci",
		"-device", "virtio-tablet-pci",
		"-device", "virtio-balloon-pci,free-page-reporting=on",
		"-drive", "id=disk,file="+qemuEscape(m.path(overlayFile))+",format=qcow2,if=none,discard=unmap",
		"-device", "virtio-blk-pci,drive=disk,bootindex=1",
	)
	args = append(args, agentQEMUArgs(m)...)
	switch m.Firmware {
	case FirmwareDirect:
		cmdline := m.Cmdline
		if !m.KVM {
			// TCG guests cannot calibrate their TSC against the PIT on a
			// loaded host: they are told its rate (see microvm).
			if khz := hostTSCkHz(); khz > 0 {
				cmdline += fmt.Sprintf(" tsc_early_khz=%d tsc=reliable", khz)
			}
		}
		args = append(args, "-kernel", m.Kernel, "-initrd", m.Initrd, "-append", cmdline)
	case FirmwareUEFI:
		args = append(args,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+qemuEscape(ovmfCode),
			"-drive", "if=pflash,format=raw,unit=1,file="+qemuEscape(m.path(varsFile)))
	}
	if m.net != nil {
		// The tap in the sandbox's network namespace, passed as fd 3.
		args = append(args, "-netdev", "tap,id=net0,fd=3", "-device", "virtio-net-pci,netdev=net0,mac="+m.MAC)
	}
	return args
}

// hostTSCkHz is the host CPU's clock in kHz from /proc/cpuinfo (0 when
// unknown), the rate TCG guests see their TSC run at.
func hostTSCkHz() int64 {
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

// qemuEscape doubles commas, QEMU's option separator.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// startQEMU starts the VM's QEMU in its own session (it outlives a daemon
// restart) and, when networked, inside the sandbox's network namespace
// with the tap as fd 3; it returns once QMP answers.
func startQEMU(ctx context.Context, bin string, m *machine) (*launch.Process, error) {
	return launchQEMU(ctx, bin, m, qemuArgs(bin, m))
}

// restoreQEMU starts QEMU loading the VM's state from snapshotFile and
// continues it once loaded.
func restoreQEMU(ctx context.Context, bin string, m *machine) (*launch.Process, error) {
	args := append(qemuArgs(bin, m), "-incoming", "exec:cat "+shellQuote(m.path(snapshotFile)))
	proc, err := launchQEMU(ctx, bin, m, args)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*launch.Process, error) {
		_ = proc.Kill()
		<-proc.Done()
		return nil, err
	}
	qc, err := dialQMP(ctx, m, proc)
	if err != nil {
		return fail(err)
	}
	defer qc.Close()
	for {
		st, err := qc.Status(ctx)
		if err != nil {
			return fail(err)
		}
		if st != "inmigrate" {
			break
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := qc.Run(ctx, "cont", nil); err != nil {
		return fail(err)
	}
	return proc, nil
}

// saveState streams the stopped VM's RAM and device state through a pipe
// to snapshotFile (QEMU 7.2 has no file: migration target), then quits.
func saveState(ctx context.Context, m *machine) error {
	qc, err := dialQMP(ctx, m, nil)
	if err != nil {
		return err
	}
	defer qc.Close()
	// The default bandwidth cap (32 MiB/s) is for live migration over a
	// network; a stopped VM to a local file should go at disk speed.
	if _, err := qc.Run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}); err != nil {
		return err
	}
	tmp := m.path(snapshotFile + ".tmp")
	if _, err := qc.Run(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(tmp)}); err != nil {
		return err
	}
	for {
		raw, err := qc.Run(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("query-migrate: %w", err)
		}
		if st.Status == "completed" {
			break
		}
		if st.Status == "failed" || st.Status == "cancelled" {
			os.Remove(tmp)
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := os.Rename(tmp, m.path(snapshotFile)); err != nil {
		return err
	}
	_, _ = qc.Run(ctx, "quit", nil) // the connection may drop before the reply
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func launchQEMU(ctx context.Context, bin string, m *machine, args []string) (*launch.Process, error) {
	logf, err := os.OpenFile(m.path(logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer null.Close()
	pidfd := -1
	files := []*os.File{null, logf, logf}
	var ns *os.File
	if m.net != nil {
		files, ns = append(files, m.net.Tap()), m.net.Netns()
	}
	var p *os.Process
	err = netpolicy.InNetns(ns, func() error {
		var err error
		p, err = os.StartProcess(bin, args, &os.ProcAttr{Dir: m.dir, Files: files,
			Sys: &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd}})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	proc, err := launch.Adopt(p.Pid, pidfd)
	if err != nil {
		_ = p.Kill()
		_, _ = p.Wait()
		return nil, err
	}
	_ = p.Release()
	m.Pid, m.StartTime = proc.Pid, proc.StartTime
	qc, err := dialQMP(ctx, m, proc)
	if err != nil {
		_ = proc.Kill()
		return nil, err
	}
	qc.Close()
	return proc, nil
}

// dialQMP connects to the VM's QMP socket, failing early if QEMU exits.
func dialQMP(ctx context.Context, m *machine, proc *launch.Process) (*qmp.Client, error) {
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
	qc, err := qmp.Dial(ctx, m.path(qmpSock))
	if err != nil {
		if proc != nil {
			select {
			case <-proc.Done():
				return nil, fmt.Errorf("qemu exited at start: %s", tailFile(m.path(logFile), 800))
			default:
			}
		}
		return nil, err
	}
	return qc, nil
}

// qmpRun runs one QMP command on a fresh connection (QEMU serves one
// client per socket; commands are rare next to exec).
func qmpRun(ctx context.Context, m *machine, cmd string, args any) ([]byte, error) {
	qc, err := dialQMP(ctx, m, nil)
	if err != nil {
		return nil, err
	}
	defer qc.Close()
	return qc.Run(ctx, cmd, args)
}

// tailFile returns the end of a (log) file for error messages.
func tailFile(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return strings.TrimSpace(string(b))
}
