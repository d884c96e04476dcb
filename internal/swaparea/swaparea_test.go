package swaparea

import (
	"log/slog"
	"os"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestSetupEnablesAndCloseRemoves(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: swapon(2)")
	}
	dir := t.TempDir()
	if _, err := Setup(dir, 32<<20, slog.Default()); err != nil {
		t.Fatal(err)
	}
	if !active(Path(dir)) {
		t.Fatalf("%s is not in /proc/swaps after Setup", Path(dir))
	}
	// A second Setup (a restart after a crash) replaces the first area.
	a, err := Setup(dir, 48<<20, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if active(Path(dir)) {
		t.Fatal("swap area still enabled after Close")
	}
	if _, err := os.Stat(Path(dir)); !os.IsNotExist(err) {
		t.Fatalf("swap file left: %v", err)
	}
	if _, err := Setup(dir, 1<<20, slog.Default()); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("1 MiB area: %v, want invalid argument", err)
	}
}
