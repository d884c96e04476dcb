package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/storage/layers"
)

// EditSpec turns the config.json written by `runc spec` into the peer's:
// rootfs read-only at rootfs, the process args without a terminal, and
// a network namespace among the namespaces (as a corral sandbox has).
// Fields it does not touch are kept as runc wrote them.
func EditSpec(raw []byte, rootfs string, args []string) ([]byte, error) {
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("parse runc spec: %w", err)
	}
	spec["root"] = map[string]any{"path": rootfs, "readonly": true}
	proc, ok := spec["process"].(map[string]any)
	if !ok {
		return nil, errors.New("runc spec has no process object")
	}
	proc["args"] = args
	proc["terminal"] = false
	linux, ok := spec["linux"].(map[string]any)
	if !ok {
		return nil, errors.New("runc spec has no linux object")
	}
	nss, _ := linux["namespaces"].([]any)
	hasNet := false
	for _, ns := range nss {
		if m, ok := ns.(map[string]any); ok && m["type"] == "network" {
			hasNet = true
		}
	}
	if !hasNet {
		linux["namespaces"] = append(nss, map[string]any{"type": "network"})
	}
	return json.MarshalIndent(spec, "", "  ")
}

// runcPeer runs the same cycle as corral's (create, the command, delete)
// with `runc run`, one OCI bundle per worker, all on one read-only rootfs.
type runcPeer struct {
	runc    string
	dir     string // temp dir holding state, bundles and (by default) the rootfs
	state   string // runc --root
	bundles []string
	prefix  string
}

// FindRunc returns the runc binary, or an error saying how to install it.
func FindRunc() (string, error) {
	if p, err := exec.LookPath("runc"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/runc"); err == nil {
		return "/usr/sbin/runc", nil
	}
	return "", errors.New("runc not found in PATH or /usr/sbin (apt-get install -y runc)")
}

// newRuncPeer prepares workers bundles. rootfs "" builds a temporary busybox
// rootfs. Close removes everything it made.
func newRuncPeer(ctx context.Context, runc, rootfs string, args []string, workers int, prefix string) (p *runcPeer, err error) {
	dir, err := os.MkdirTemp("", "corral-bench-runc-")
	if err != nil {
		return nil, err
	}
	p = &runcPeer{runc: runc, dir: dir, state: filepath.Join(dir, "state"), prefix: prefix}
	defer func() {
		if err != nil {
			p.Close()
			p = nil
		}
	}()
	if rootfs == "" {
		rootfs = filepath.Join(dir, "rootfs")
		if err := os.Mkdir(rootfs, 0o755); err != nil {
			return p, err
		}
		// The busybox image's own recipe: the peer runs the rootfs a
		// corral busybox sandbox runs.
		if err := layers.BuildBusybox(ctx, rootfs, io.Discard); err != nil {
			return p, err
		}
	}
	if rootfs, err = filepath.Abs(rootfs); err != nil {
		return p, err
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "bin", "true")); err != nil {
		return p, fmt.Errorf("rootfs %s has no /bin/true: %w", rootfs, err)
	}
	specDir := filepath.Join(dir, "spec")
	if err := os.Mkdir(specDir, 0o755); err != nil {
		return p, err
	}
	if out, err := exec.CommandContext(ctx, runc, "spec", "--bundle", specDir).CombinedOutput(); err != nil {
		return p, fmt.Errorf("runc spec: %w: %s", err, bytes.TrimSpace(out))
	}
	raw, err := os.ReadFile(filepath.Join(specDir, "config.json"))
	if err != nil {
		return p, err
	}
	config, err := EditSpec(raw, rootfs, args)
	if err != nil {
		return p, err
	}
	for i := range workers {
		b := filepath.Join(dir, fmt.Sprintf("bundle-%d", i))
		if err := os.Mkdir(b, 0o755); err != nil {
			return p, err
		}
		if err := os.WriteFile(filepath.Join(b, "config.json"), config, 0o644); err != nil {
			return p, err
		}
		p.bundles = append(p.bundles, b)
	}
	return p, nil
}

// cycle runs one container to completion with `runc run` (which creates,
// starts, waits and deletes) in worker's bundle; seq makes the id unique.
func (p *runcPeer) cycle(ctx context.Context, worker, seq int) error {
	id := fmt.Sprintf("%s-%d-%d", p.prefix, worker, seq)
	cmd := exec.CommandContext(ctx, p.runc, "--root", p.state, "run", "--bundle", p.bundles[worker], id)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runc run %s: %w: %s", id, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

// Close force-deletes any container an interrupted run left and removes the
// temp dir.
func (p *runcPeer) Close() error {
	if out, err := exec.Command(p.runc, "--root", p.state, "list", "-q").Output(); err == nil {
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command(p.runc, "--root", p.state, "delete", "-f", id).Run()
		}
	}
	return os.RemoveAll(p.dir)
}
