package microvm

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// qemu drives QEMU's "microvm" machine: virtio-mmio devices only, no PCI,
// no firmware beyond qboot. Control is QMP on qmp.sock; the agent talks on
// a virtio-serial port whose chardev is agent.sock.
type qemu struct {
	bin string
}

func (q *qemu) Name() string     { return "qemu" }
func (q *qemu) Caps() driverCaps { return driverCaps{Network: true} }

// qemuArgs is the command line of m; restore adds -incoming.
func (q *qemu) args(m *machine, restore bool) []string {
	machineOpts := "microvm,x-option-roms=off,rtc=off"
	// Under TCG the guest cannot calibrate its TSC against the PIT when
	// the host is loaded (and then hangs waiting for timer ticks): it is
	// told the TSC rate (TCG's TSC is the host's) and gets the TSC-deadline
	// APIC timer of "-cpu max", which needs no calibration.
	//
	// The translation cache is capped (QEMU's default is up to 1 GiB per
	// VM, touched as code is translated) and pages are not zeroed at
	// allocation (Debian's default), which touched most of an idle guest's
	// RAM: both cost host memory for every idle VM.
	accel := []string{"-accel", "tcg,thread=multi,tb-size=32", "-cpu", "max"}
	cmdline := "console=ttyS0 quiet loglevel=1 panic=-1 reboot=t rdinit=/init init_on_alloc=0"
	if m.KVM {
		accel = []string{"-accel", "kvm", "-cpu", "host"}
	} else if khz := hostTSCkHz(); khz > 0 {
		cmdline += fmt.Sprintf(" tsc_early_khz=%d tsc=reliable", khz)
	}
	// Guest RAM from a memfd, not anonymous memory: QEMU asks for
	// transparent huge pages on anonymous guest RAM, and the guest's
	// scattered first touches then cost the host 2 MiB each (an idle
	// 256 MiB guest held ~180 MiB). Shared memory is not given huge pages
	// unless the host's shmem_enabled says so.
	machineOpts += ",memory-backend=ram"
	ram := fmt.Sprintf("memory-backend-memfd,id=ram,size=%dM", m.MemoryMiB)
	if restore && m.ramFile != "" {
		// A private mapping of the snapshot's RAM image: every VM restored
		// from it shares its page cache until it writes a page.
		ram = fmt.Sprintf("memory-backend-file,id=ram,size=%dM,mem-path=%s,share=off", m.MemoryMiB, qemuEscape(m.ramFile))
	}
	args := []string{q.bin, "-M", machineOpts, "-object", ram}
	args = append(args, accel...)
	args = append(args,
		"-name", "corral-"+m.id,
		"-m", fmt.Sprintf("%dM", m.MemoryMiB),
		"-smp", fmt.Sprint(m.VCPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", m.kernel,
		"-initrd", m.path(initrdFile),
		// panic=-1 reboots at once on a guest panic, -no-reboot turns the
		// reboot into QEMU's exit: a crashed guest ends its own VM only.
		"-append", cmdline,
		"-serial", "file:"+m.path(consoleFile),
		"-qmp", "unix:"+m.path(qmpSock)+",server=on,wait=off",
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path="+qemuEscape(m.path(agentSock))+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+agentPort,
		// Free page reporting: the guest hands pages it freed (boot-time
		// buffers, the unpacked initramfs, exited commands) back to the
		// host, so an idle VM holds about what its guest uses.
		"-device", "virtio-balloon-device,free-page-reporting=on",
	)
	for i, l := range m.Layers {
		for j, f := range append([]string{l.Image}, l.Devices...) {
			id := diskSerial(i, j)
			args = append(args,
				"-drive", "id="+id+",file="+qemuEscape(f)+",format=raw,if=none,readonly=on",
				"-device", "virtio-blk-device,drive="+id+",serial="+id)
		}
	}
	args = append(args,
		"-drive", "id=disk,file="+qemuEscape(m.path(diskFile))+",format=raw,if=none,discard=unmap",
		"-device", "virtio-blk-device,drive=disk,serial="+writableSerial)
	if m.net != nil {
		// The tap in the sandbox's network namespace, passed as fd 3.
		args = append(args,
			"-netdev", "tap,id=net0,fd=3",
			"-device", "virtio-net-device,netdev=net0,mac="+m.MAC)
	}
	switch {
	case restore && m.ramFile != "":
		args = append(args, "-incoming", "defer") // capabilities first (Start)
	case restore:
		args = append(args, "-incoming", "exec:cat "+shellQuote(m.incomingPath()))
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

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (q *qemu) Start(ctx context.Context, m *machine, restore bool) (*launch.Process, error) {
	args := q.args(m, restore)
	logf, err := os.OpenFile(m.path("qemu.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
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
		if m.net.Tap() == nil {
			return nil, fmt.Errorf("start qemu: the network slot has no tap (lost with a daemon restart)")
		}
		files, ns = append(files, m.net.Tap()), m.net.Netns()
	}
	var p *os.Process
	// QEMU starts inside the sandbox's network namespace and so holds it
	// (with the tap and the veth) through a daemon restart.
	err = netpolicy.InNetns(ns, func() error {
		var err error
		p, err = os.StartProcess(q.bin, args, &os.ProcAttr{
			Dir:   m.dir,
			Files: files,
			// Its own session: the VM outlives a daemon restart, and a
			// signal to the daemon's group does not reach it.
			Sys: &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd},
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	proc, err := m.adopt(p, pidfd)
	if err != nil {
		return nil, err
	}
	qc, err := q.qmp(ctx, m, proc)
	if err != nil {
		select {
		case <-proc.Done():
			err = fmt.Errorf("%w; qemu exited: %s", err, tailFile(m.path("qemu.log"), 800))
		case <-time.After(100 * time.Millisecond):
			_ = proc.Kill()
		}
		return nil, err
	}
	defer qc.close()
	if restore && m.ramFile != "" {
		// The stream was saved with x-ignore-shared (guest RAM not in it),
		// which the destination must have on to read it.
		err := setIgnoreShared(ctx, qc, true)
		if err == nil {
			_, err = qc.run(ctx, "migrate-incoming", map[string]any{"uri": "exec:cat " + shellQuote(m.incomingPath())})
		}
		if err != nil {
			_ = proc.Kill()
			return nil, err
		}
	}
	if restore {
		if err := waitIncoming(ctx, qc); err != nil {
			_ = proc.Kill()
			return nil, err
		}
		if m.ramFile != "" {
			// Off for this VM's own snapshots: its RAM is no memfd.
			if err := setIgnoreShared(ctx, qc, false); err != nil {
				_ = proc.Kill()
				return nil, err
			}
		}
		if _, err := qc.run(ctx, "cont", nil); err != nil {
			_ = proc.Kill()
			return nil, err
		}
	}
	return proc, nil
}

// qmp connects to the VM's QMP socket, failing early if QEMU exits.
func (q *qemu) qmp(ctx context.Context, m *machine, proc *launch.Process) (*qmp, error) {
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
	qc, err := dialQMP(ctx, m.path(qmpSock))
	if err != nil {
		if proc != nil {
			select {
			case <-proc.Done():
				return nil, fmt.Errorf("qemu exited at start: %s", tailFile(m.path("qemu.log"), 800))
			default:
			}
		}
		return nil, err
	}
	return qc, nil
}

// waitIncoming waits until QEMU has loaded the snapshot.
func waitIncoming(ctx context.Context, qc *qmp) error {
	for {
		st, err := qc.status(ctx)
		if err != nil {
			return err
		}
		if st != "inmigrate" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (q *qemu) DialAgent(ctx context.Context, m *machine) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", m.path(agentSock))
}

func (q *qemu) simple(ctx context.Context, m *machine, cmd string) error {
	qc, err := q.qmp(ctx, m, nil)
	if err != nil {
		return err
	}
	defer qc.close()
	_, err = qc.run(ctx, cmd, nil)
	return err
}

func (q *qemu) Pause(ctx context.Context, m *machine) error  { return q.simple(ctx, m, "stop") }
func (q *qemu) Resume(ctx context.Context, m *machine) error { return q.simple(ctx, m, "cont") }

// Snapshot streams the stopped VM's RAM and device state through a pipe to
// snapshotFile (QEMU 7.2 has no file: migration target), then quits.
func (q *qemu) Snapshot(ctx context.Context, m *machine) error {
	qc, err := q.qmp(ctx, m, nil)
	if err != nil {
		return err
	}
	defer qc.close()
	if _, err := qc.run(ctx, "stop", nil); err != nil {
		return err
	}
	// The default bandwidth cap (32 MiB/s) is for live migration over a
	// network; a stopped VM to a local file should go at disk speed.
	if _, err := qc.run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}); err != nil {
		return err
	}
	// The RAM goes in the stream (a live snapshot cut short may have
	// left x-ignore-shared on).
	if err := setIgnoreShared(ctx, qc, false); err != nil {
		return err
	}
	tmp := m.path(snapshotFile + ".tmp")
	if _, err := qc.run(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(tmp)}); err != nil {
		return err
	}
	if err := qc.waitMigration(ctx); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := os.Rename(tmp, m.path(snapshotFile)); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	_, _ = qc.run(ctx, "quit", nil) // the connection may drop before the reply
	return nil
}

// SnapshotLive implements liveSnapshotter: with the vCPUs stopped, device
// state (and RAM, unless it is copied to ramPath) streams to memPath; once
// the migration completed QEMU has flushed and let go of its disks, so
// whileStopped copies them; then the VM continues (cont takes the disks
// back), also when a step failed.
//
// Guest RAM in a memfd (every booted VM) is left out of the stream
// (x-ignore-shared) and copied from the memfd, holes kept, to ramPath: a
// restore maps that file copy-on-write. A VM whose RAM is not a memfd (one
// restored that way) streams its RAM, and ramPath is not written.
func (q *qemu) SnapshotLive(ctx context.Context, m *machine, memPath, ramPath string, whileStopped func() error) (err error) {
	qc, err := q.qmp(ctx, m, nil)
	if err != nil {
		return err
	}
	defer qc.close()
	if _, err := qc.run(ctx, "stop", nil); err != nil {
		return err
	}
	defer func() {
		if _, cerr := qc.run(context.WithoutCancel(ctx), "cont", nil); cerr != nil && err == nil {
			err = fmt.Errorf("continue after snapshot: %w", cerr)
		}
	}()
	ram, err := openGuestRAM(m.Pid)
	if err != nil {
		return err
	}
	if ram != nil {
		defer ram.Close()
	}
	if err := setIgnoreShared(ctx, qc, ram != nil); err != nil {
		return err
	}
	if ram != nil {
		// Off again: a later pause --reclaim must stream the RAM.
		defer func() {
			if serr := setIgnoreShared(context.WithoutCancel(ctx), qc, false); serr != nil && err == nil {
				err = serr
			}
		}()
	}
	if _, err := qc.run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}); err != nil {
		return err
	}
	tmp := memPath + ".tmp"
	if _, err := qc.run(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(tmp)}); err != nil {
		return err
	}
	if err := qc.waitMigration(ctx); err != nil {
		_, _ = qc.run(context.WithoutCancel(ctx), "migrate_cancel", nil)
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, memPath); err != nil {
		return err
	}
	if ram != nil {
		if err := copySparse(ram, ramPath); err != nil {
			return fmt.Errorf("copy guest RAM: %w", err)
		}
	}
	return whileStopped()
}

func setIgnoreShared(ctx context.Context, qc *qmp, on bool) error {
	_, err := qc.run(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": on}}})
	return err
}

// openGuestRAM opens the memfd holding the guest RAM of VMM pid (nil when
// its RAM is something else).
func openGuestRAM(pid int) (*os.File, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("guest RAM: %w", err)
	}
	for _, e := range ents {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err == nil && strings.HasPrefix(target, "/memfd:memory-backend-memfd") {
			f, err := os.Open(dir + "/" + e.Name())
			if err != nil {
				return nil, fmt.Errorf("guest RAM: %w", err)
			}
			return f, nil
		}
	}
	return nil, nil
}

// copySparse copies src's data extents to a new file dst of src's size,
// leaving its holes (pages the guest never touched or gave back) as holes.
func copySparse(src *os.File, dst string) error {
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	fd := int(src.Fd())
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break // no data past off
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(src, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return out.Close()
}

func (m *machine) incomingPath() string {
	if m.incoming != "" {
		return m.incoming
	}
	return m.path(snapshotFile)
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
