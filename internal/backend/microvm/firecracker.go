package microvm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	qemuvm "github.com/corral-dev/corral/internal/backend/qemu"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/launch"
)

// firecracker drives Firecracker through its REST API on api.sock. The
// agent listens on guest vsock port agentVsockPort; the node reaches it
// through Firecracker's hybrid vsock: connect to agent.sock, send
// "CONNECT <port>\n", read "OK <host port>\n", then the stream is the
// guest connection. Firecracker boots only uncompressed ELF kernels
// (vmlinux) and needs /dev/kvm.
type firecracker struct {
	bin string
	cpu *qemuvm.CPUGroups // the VMMs' cgroups (nil: none)
}

const vmStateFile = "vmstate.snap" // Firecracker's device state beside snapshotFile

func (f *firecracker) Name() string     { return "firecracker" }
func (f *firecracker) Caps() driverCaps { return driverCaps{Vsock: true} }

// client is an HTTP client whose every request goes to the API socket.
func (f *firecracker) client(m *machine) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", m.path(apiSock))
		},
	}}
}

// call sends one API request; Firecracker answers 204 on success and a
// JSON {"fault_message": ...} otherwise.
func (f *firecracker) call(ctx context.Context, m *machine, method, path string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client(m).Do(req)
	if err != nil {
		return fmt.Errorf("firecracker %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var fault struct {
		Message string `json:"fault_message"`
	}
	if json.Unmarshal(msg, &fault) == nil && fault.Message != "" {
		msg = []byte(fault.Message)
	}
	return fmt.Errorf("firecracker %s %s: %s: %s", method, path, resp.Status, msg)
}

// checkKernel refuses a compressed kernel with a clear error.
func checkKernel(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil || string(magic) != "\x7fELF" {
		return errdefs.NotSupported("firecracker: kernel %s is not an uncompressed ELF vmlinux (Firecracker cannot boot a bzImage)", path)
	}
	return nil
}

func (f *firecracker) Start(ctx context.Context, m *machine, restore bool) (*launch.Process, error) {
	if !restore {
		if err := checkKernel(m.kernel); err != nil {
			return nil, err
		}
	}
	_ = os.Remove(m.path(apiSock))
	logf, err := os.OpenFile(m.path("vmm.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	console, err := os.OpenFile(m.path(consoleFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer console.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer null.Close()
	pidfd := -1
	// The guest's serial console is Firecracker's stdout.
	p, err := os.StartProcess(f.bin, []string{f.bin, "--api-sock", m.path(apiSock), "--id", "corral-" + m.id},
		&os.ProcAttr{Dir: m.dir, Files: []*os.File{null, console, logf},
			Sys: &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd}})
	if err != nil {
		return nil, fmt.Errorf("start firecracker: %w", err)
	}
	proc, err := m.adopt(p, pidfd)
	if err != nil {
		return nil, err
	}
	if err := f.cpu.Join(m.id, proc.Pid, m.startCPU(restore)); err != nil {
		_ = proc.Kill()
		return nil, err
	}
	if err := f.configure(ctx, m, proc, restore); err != nil {
		_ = proc.Kill()
		return nil, err
	}
	return proc, nil
}

func (f *firecracker) configure(ctx context.Context, m *machine, proc *launch.Process, restore bool) error {
	if err := waitSocket(ctx, m.path(apiSock), proc); err != nil {
		return err
	}
	if restore {
		return f.call(ctx, m, http.MethodPut, "/snapshot/load", map[string]any{
			"snapshot_path": m.path(vmStateFile),
			"mem_backend":   map[string]any{"backend_type": "File", "backend_path": m.path(snapshotFile)},
			"resume_vm":     true,
		})
	}
	steps := []struct {
		path string
		body any
	}{
		{"/machine-config", map[string]any{"vcpu_count": m.VCPUs, "mem_size_mib": m.MemoryMiB}},
		{"/boot-source", map[string]any{
			"kernel_image_path": m.kernel,
			"initrd_path":       m.path(initrdFile),
			"boot_args":         "console=ttyS0 quiet loglevel=1 panic=-1 reboot=k rdinit=/init",
		}},
		{"/vsock", map[string]any{"guest_cid": 3, "uds_path": m.path(agentSock)}},
	}
	for i, l := range m.Layers {
		for j, file := range append([]string{l.Image}, l.Devices...) {
			// The drive id is what the guest reads as the disk's serial.
			id := diskSerial(i, j)
			steps = append(steps, struct {
				path string
				body any
			}{"/drives/" + id, map[string]any{"drive_id": id, "path_on_host": file, "is_root_device": false, "is_read_only": true}})
		}
	}
	steps = append(steps, struct {
		path string
		body any
	}{"/drives/" + writableSerial, map[string]any{"drive_id": writableSerial, "path_on_host": m.path(diskFile), "is_root_device": false, "is_read_only": false}})
	for _, st := range steps {
		if err := f.call(ctx, m, http.MethodPut, st.path, st.body); err != nil {
			return err
		}
	}
	return f.call(ctx, m, http.MethodPut, "/actions", map[string]any{"action_type": "InstanceStart"})
}

// waitSocket waits until path accepts connections or proc exits.
func waitSocket(ctx context.Context, path string, proc *launch.Process) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-proc.Done():
			return fmt.Errorf("vmm exited before %s appeared", path)
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", path, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// DialAgent connects through the hybrid vsock socket.
func (f *firecracker) DialAgent(ctx context.Context, m *machine) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", m.path(agentSock))
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", agentVsockPort); err != nil {
		c.Close()
		return nil, err
	}
	// Read the answer byte by byte: anything after the line is the
	// agent's and must stay in the connection.
	line, err := readLine(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("vsock connect: %w", err)
	}
	if !strings.HasPrefix(line, "OK ") {
		c.Close()
		return nil, fmt.Errorf("vsock connect: %q", line)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

func readLine(r io.Reader) (string, error) {
	var b strings.Builder
	one := make([]byte, 1)
	for b.Len() < 64 {
		if _, err := io.ReadFull(r, one); err != nil {
			return "", err
		}
		if one[0] == '\n' {
			return b.String(), nil
		}
		b.WriteByte(one[0])
	}
	return "", fmt.Errorf("answer too long")
}

func (f *firecracker) Pause(ctx context.Context, m *machine) error {
	return f.call(ctx, m, http.MethodPatch, "/vm", map[string]any{"state": "Paused"})
}

func (f *firecracker) Resume(ctx context.Context, m *machine) error {
	return f.call(ctx, m, http.MethodPatch, "/vm", map[string]any{"state": "Resumed"})
}

// Snapshot writes a full snapshot (device state + guest memory) of the
// paused VM, then ends the VMM.
func (f *firecracker) Snapshot(ctx context.Context, m *machine) error {
	if err := f.Pause(ctx, m); err != nil {
		return err
	}
	err := f.call(ctx, m, http.MethodPut, "/snapshot/create", map[string]any{
		"snapshot_type": "Full",
		"snapshot_path": m.path(vmStateFile),
		"mem_file_path": m.path(snapshotFile),
	})
	if err != nil {
		return err
	}
	proc, err := launch.Attach(m.Pid, m.StartTime)
	if err != nil {
		return err
	}
	defer proc.Release()
	return proc.Kill()
}
