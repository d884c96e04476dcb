package agent

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// ServiceConfig is the agent as a system service of a full VM: the
// guest's own init (systemd) started it, mounted /proc, /dev and /sys and
// adopts orphans, and the root is the VM's disk. Nothing of PID-1 mode
// runs (no mounts, modules, network, switch of root, bounding set): the
// whole VM is the sandbox, and commands get what root of that VM has, as
// they do through qemu-ga.
type ServiceConfig struct {
	// Port is the virtio-serial port name of the control channel.
	Port string
	// SecretFile holds the sandbox's secret. The node passes it through
	// QEMU's fw_cfg, a file only guest root can read, so that no guest
	// process ever needs the port to learn it.
	SecretFile string
}

// secretWait bounds the wait for the secret file: the fw_cfg sysfs
// module may load just after the service starts.
const secretWait = 30 * time.Second

// Service runs the agent as a service; it returns only when it cannot
// serve (the service manager restarts it).
func Service(cfg ServiceConfig) error {
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	if cfg.Port == "" || cfg.SecretFile == "" {
		return errors.New("service mode needs --port and --secret-file")
	}
	secret, err := readSecret(cfg.SecretFile, secretWait)
	if err != nil {
		return err
	}
	ch, err := openChannel(&agentproto.FileConfig{Port: cfg.Port})
	if err != nil {
		return err
	}
	return serve(&runtimeConfig{secret: secret, channel: ch, service: true})
}

func readSecret(path string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			s := strings.TrimSpace(string(b))
			if s == "" {
				return "", fmt.Errorf("secret file %s is empty", path)
			}
			return s, nil
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			return "", fmt.Errorf("read secret: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
