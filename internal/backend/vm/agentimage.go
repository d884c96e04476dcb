package vm

import (
	"fmt"
	"os"
	"path/filepath"
)

// corral-agent in a VM image: the static binary, a systemd service that
// runs it (not as PID 1: systemd is) on its own virtio-serial port, and
// the udev rule that starts the service when that port appears, as
// Debian's qemu-guest-agent does for its own.
const (
	agentPortName = "org.corral.agent.0"
	// agentSecretName is the fw_cfg item carrying the sandbox's secret;
	// the guest reads it under /sys/firmware/qemu_fw_cfg (root only).
	agentSecretName = "opt/corral/agent-secret"
	agentGuestPath  = "/usr/local/sbin/corral-agent"
)

// agentUnit runs the agent. OOMPolicy keeps a memory bomb in one command
// from stopping the service (and every other command) with it; the OOM
// adjustment stays default, as commands would inherit it. KillMode=process
// lets commands outlive a restart of the agent.
var agentUnit = `[Unit]
Description=corral agent (exec and files for the corral node)
BindsTo=dev-virtio\x2dports-` + agentPortName + `.device
After=dev-virtio\x2dports-` + agentPortName + `.device

[Service]
ExecStartPre=-/sbin/modprobe qemu_fw_cfg
ExecStart=` + agentGuestPath + ` --service --port ` + agentPortName + ` --secret-file /sys/firmware/qemu_fw_cfg/by_name/` + agentSecretName + `/raw
Restart=always
RestartSec=1
OOMPolicy=continue
KillMode=process
`

var agentUdevRule = `SUBSYSTEM=="virtio-ports", ATTR{name}=="` + agentPortName + `", TAG+="systemd", ENV{SYSTEMD_WANTS}+="corral-agent.service"
`

// installAgent copies the agent into the unpacked tree with its unit and
// udev rule.
func installAgent(root, agentPath string) error {
	bin, err := os.ReadFile(agentPath)
	if err != nil {
		return fmt.Errorf("corral-agent: %w", err)
	}
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{agentGuestPath, bin, 0o755},
		{"/etc/systemd/system/corral-agent.service", []byte(agentUnit), 0o644},
		{"/etc/udev/rules.d/90-corral-agent.rules", []byte(agentUdevRule), 0o644},
	} {
		p := filepath.Join(root, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return fmt.Errorf("install %s: %w", f.path, err)
		}
	}
	return nil
}
