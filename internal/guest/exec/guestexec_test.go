package guestexec

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// TestLookPathAndCwd: the error kinds both supervisors report, which the
// backend conformance suite expects of every backend.
func TestLookPathAndCwd(t *testing.T) {
	dir := t.TempDir()
	exe, plain := filepath.Join(dir, "tool"), filepath.Join(dir, "data")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/nonexistent:" + dir}
	if p, err := LookPath("tool", env); err != nil || p != exe {
		t.Errorf("tool on PATH: %q %v", p, err)
	}
	for _, c := range []struct {
		name string
		is   func(error) bool
	}{
		{"no-such-tool", errdefs.IsNotFound},
		{"data", errdefs.IsNotFound}, // not executable: skipped on PATH
		{plain, errdefs.IsPermissionDenied},
		{dir, errdefs.IsPermissionDenied},
		{filepath.Join(dir, "missing"), errdefs.IsNotFound},
	} {
		if _, err := LookPath(c.name, env); !c.is(err) {
			t.Errorf("LookPath(%q): %v", c.name, err)
		}
	}
	if got, err := Cwd(""); err != nil || got != "/" {
		t.Errorf(`Cwd(""): %q %v`, got, err)
	}
	for _, cwd := range []string{filepath.Join(dir, "missing"), plain} {
		if _, err := Cwd(cwd); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Cwd(%q): %v; want invalid argument", cwd, err)
		}
	}
	if _, err := User("no-such-user-here"); !errdefs.IsNotFound(err) {
		t.Errorf("unknown user: %v; want not found", err)
	}
	if cred, err := User("0:0"); err != nil || cred.Uid != 0 || cred.Gid != 0 {
		t.Errorf("user 0:0: %+v %v", cred, err)
	}
}
