package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestDiskLimit fills a sandbox's 16 MiB disk: the writer gets ENOSPC near
// 16 MiB while another sandbox still writes. It runs on whichever disk
// store the server picks for this host (auto).
func TestDiskLimit(t *testing.T) {
	srv := testenv.StartServer(t)
	const limit = 16 << 20
	opts := client.CreateOptions{Resources: client.Resources{DiskBytes: limit}}
	full := testenv.NewSandbox(t, srv.Client, opts)
	other := testenv.NewSandbox(t, srv.Client, opts)

	res := testenv.Run(t, full, client.Command{Shell: "dd if=/dev/zero of=/fill bs=1M 2>&1; echo rc=$?"})
	if out := string(res.Stdout); !strings.Contains(out, "No space left on device") || strings.Contains(out, "rc=0") {
		t.Fatalf("filling the disk: %q", out)
	}
	size, err := strconv.ParseInt(strings.TrimSpace(testenv.Sh(t, full, "stat -c %s /fill")), 10, 64)
	if err != nil || size < limit*9/10 || size > limit+limit/10 {
		t.Fatalf("filled %d bytes (%v), want about %d", size, err, limit)
	}
	// Whatever the first fill left (ext4 frees delalloc reserves after
	// writeback) is small, and then the disk is full again.
	res = testenv.Run(t, full, client.Command{Shell: "sync; dd if=/dev/zero of=/more bs=4k 2>&1; stat -c %s /more"})
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	more, err := strconv.ParseInt(lines[len(lines)-1], 10, 64)
	if !strings.Contains(string(res.Stdout), "No space left on device") || err != nil || more > 1<<20 {
		t.Fatalf("second fill: %q", res.Stdout)
	}
	t.Logf("filled %d bytes, then %d more", size, more)
	if out := testenv.Sh(t, other, "dd if=/dev/zero of=/data bs=1M count=8 2>/dev/null && stat -c %s /data"); out != strconv.Itoa(8<<20)+"\n" {
		t.Fatalf("second sandbox: %q", out)
	}
	if _, err := full.Files().Read(context.Background(), "/etc/passwd"); err != nil {
		t.Fatalf("full sandbox no longer serves reads: %v", err)
	}
}
