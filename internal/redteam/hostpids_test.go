package redteam

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/runtime/cgroup"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestHostPIDsRunLow (THREATS: many sandboxes each using its full pids
// limit until the host's PID space runs low): the sandboxes' parent lies in
// a pids cgroup of 400 tasks, standing for the host's PID space. Sandboxes
// are made and each fills itself with processes until a create is refused:
// the refusal must be ResourceExhausted naming the limit, the daemon must
// keep answering (and keep refusing cleanly), and once two of the hogs are
// deleted the others must answer execs again.
func TestHostPIDsRunLow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		skipRows(t, backend, "resource/host-pids-refused", "resource/host-pids-daemon", "resource/host-pids-neighbours")
		lim := pidsLimitedCgroup(t, 400)
		srv := testenv.StartServer(t, testenv.WithAgent(t), func(cfg *server.Config) {
			cfg.CgroupParent = lim + "/" + testenv.UniqueName("corral-test")
		})
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		var hogs []*client.Sandbox
		var refusal error
		for range 40 {
			sb, err := srv.Client.Create(ctx, client.CreateOptions{Backend: backend, Resources: client.Resources{Pids: 64}})
			if err != nil {
				refusal = err
				break
			}
			hogs = append(hogs, sb)
			t.Cleanup(func() { _ = sb.Delete(context.Background()) })
			// Fails once the cap is reached: that is the point.
			_, _ = sb.Run(ctx, client.Command{Shell: "i=0; while [ $i -lt 55 ]; do sleep 600 >/dev/null 2>&1 & i=$((i+1)); done", Timeout: 20 * time.Second})
		}
		// Admission names the limit; a create racing the hogs' forks past
		// the reading finds no PID at its spawn and says so.
		refused := refusal != nil && client.IsResourceExhausted(refusal) &&
			(strings.Contains(refusal.Error(), "pids.max") || strings.Contains(refusal.Error(), "no PID left"))
		_, listErr := srv.Client.List(ctx, client.ListOptions{})
		_, again := srv.Client.Create(ctx, client.CreateOptions{Backend: backend})
		for _, sb := range hogs[:min(2, len(hogs))] {
			if err := sb.Delete(ctx); err != nil {
				t.Fatal(err)
			}
		}
		answered, rest := 0, hogs[min(2, len(hogs)):]
		for _, sb := range rest {
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				res, err := sb.Run(ctx, client.Command{Args: []string{"echo", "ok"}})
				if err == nil && res.ExitCode == 0 {
					answered++
					break
				}
				if time.Now().After(deadline) {
					t.Logf("sandbox %s after two hogs were deleted: %v %+v", sb.ID(), err, res)
					break
				}
			}
		}
		judge(t, backend, []Result{
			check("resource/host-pids-refused", refused, "%d sandboxes, then: %v", len(hogs), refusal),
			check("resource/host-pids-daemon", listErr == nil && client.IsResourceExhausted(again),
				"list at the limit: %v; another create: %v", listErr, again),
			check("resource/host-pids-neighbours", len(rest) > 0 && answered == len(rest),
				"%d of %d answered once two hogs were deleted", answered, len(rest)),
		})
	})
}

// pidsLimitedCgroup makes a cgroup in every hierarchy with pids.max = max
// and returns its name; it is removed after the test's server.
func pidsLimitedCgroup(t *testing.T, max int) string {
	t.Helper()
	h, err := cgroup.Detect()
	if err != nil {
		t.Skipf("needs cgroups: %v", err)
	}
	pids := h.V1["pids"]
	if pids == "" && h.V2Controllers["pids"] {
		pids = h.V2
	}
	if pids == "" {
		t.Skip("needs the pids cgroup controller")
	}
	name := testenv.UniqueName("redteam-pids")
	seen := map[string]bool{}
	var dirs []string
	for _, mnt := range append(mapValues(h.V1), h.V2) {
		if mnt != "" && !seen[mnt] {
			seen[mnt] = true
			dirs = append(dirs, filepath.Join(mnt, name))
		}
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Errorf("remove cgroup %s: %v", d, err)
			}
		}
	})
	if err := os.WriteFile(filepath.Join(pids, name, "pids.max"), []byte(fmt.Sprint(max)), 0); err != nil {
		t.Fatal(err)
	}
	return name
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
