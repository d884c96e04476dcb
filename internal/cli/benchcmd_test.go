package cli

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestSizeVar: a size flag holds its default until set, takes sizes with
// units, and refuses a non-size naming the flag before anything runs.
func TestSizeVar(t *testing.T) {
	var n int64
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	sizeVar(cmd, &n, "memory", "64Mi", "memory limit")
	if n != 64<<20 {
		t.Fatalf("default = %d; want %d", n, 64<<20)
	}
	if err := cmd.Flags().Parse([]string{"--memory", "2Gi"}); err != nil || n != 2<<30 {
		t.Fatalf("--memory 2Gi: n = %d, err %v; want %d", n, err, 2<<30)
	}
	err := cmd.Flags().Parse([]string{"--memory", "12x"})
	if err == nil || !strings.Contains(err.Error(), `"--memory"`) || !strings.Contains(err.Error(), "not a size") {
		t.Fatalf("--memory 12x: %v; want an error naming --memory and saying it is not a size", err)
	}
	if n != 2<<30 {
		t.Fatalf("a refused value changed the flag to %d", n)
	}
}
