package procfs

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

// TestCmdlinesFindsAChild: a child started with known arguments is among
// the processes, with its argv whole (no empty last argument from the
// kernel's closing NUL), and this process is among the pids.
func TestCmdlinesFindsAChild(t *testing.T) {
	cmd := exec.Command("sleep", "29", "1") // sleep adds its arguments up
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// Until the child's exec, its cmdline is still this test binary's.
	want := []string{"sleep", "29", "1"}
	var argv []string
	for deadline := time.Now().Add(10 * time.Second); !slices.Equal(argv, want) && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		argv = nil
		for pid, args := range Cmdlines() {
			if pid == cmd.Process.Pid {
				argv = args
				break
			}
		}
	}
	if !slices.Equal(argv, want) {
		t.Fatalf("argv of the child: %q, want %q", argv, want)
	}
	if !slices.Contains(slices.Collect(PIDs()), os.Getpid()) {
		t.Fatalf("PIDs left out this process, %d", os.Getpid())
	}
}
