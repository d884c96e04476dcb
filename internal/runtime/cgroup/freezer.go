package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Freeze stops every process of the group and returns once the kernel
// reports the group frozen.
func (g *Group) Freeze(ctx context.Context) error {
	if d := g.v1["freezer"]; d != "" {
		return g.setV1Freezer(ctx, d, "FROZEN")
	}
	return g.setV2Freeze(ctx, "1")
}

// Thaw resumes the group's processes.
func (g *Group) Thaw(ctx context.Context) error {
	if d := g.v1["freezer"]; d != "" {
		return g.setV1Freezer(ctx, d, "THAWED")
	}
	return g.setV2Freeze(ctx, "0")
}

func (g *Group) setV1Freezer(ctx context.Context, dir, state string) error {
	for {
		if err := write(dir, "freezer.state", state); err != nil {
			// A missing freezer cgroup holds no frozen process: nothing to thaw.
			if errors.Is(err, os.ErrNotExist) && (state == "THAWED" || !g.Exists()) {
				return nil
			}
			return fmt.Errorf("cgroup %s: freezer: %w", g.id, err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
		if err != nil {
			return fmt.Errorf("cgroup %s: freezer: %w", g.id, err)
		}
		if strings.TrimSpace(string(b)) == state {
			return nil
		}
		if err := pause(ctx, fmt.Sprintf("cgroup %s: freezer: waiting for %s", g.id, state)); err != nil {
			return err
		}
	}
}

func (g *Group) setV2Freeze(ctx context.Context, val string) error {
	if g.v2 == "" {
		return fmt.Errorf("cgroup %s: not supported: freezer (needs v1 freezer or cgroup v2)", g.id)
	}
	if err := write(g.v2, "cgroup.freeze", val); err != nil {
		if errors.Is(err, os.ErrNotExist) && (val == "0" || !g.Exists()) {
			return nil
		}
		return fmt.Errorf("cgroup %s: freeze: %w", g.id, err)
	}
	for {
		frozen, err := readKey(filepath.Join(g.v2, "cgroup.events"), "frozen")
		if err != nil {
			return fmt.Errorf("cgroup %s: freeze: %w", g.id, err)
		}
		if fmt.Sprint(frozen) == val {
			return nil
		}
		if err := pause(ctx, fmt.Sprintf("cgroup %s: waiting for frozen=%s", g.id, val)); err != nil {
			return err
		}
	}
}
