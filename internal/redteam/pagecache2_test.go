package redteam

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestPageCacheAcrossProjects (issue 21, finding 10, the stronger
// setting): sandbox X of project alpha watches, with mincore, a file of a
// layer it shares with sandbox Y of project beta while Y reads it. With
// the default shared layer mounts X sees Y's read (the documented
// residual); with `corral serve --layer-mounts per-project` each project
// has mounts (superblocks, page caches) of its own and X sees nothing.
func TestPageCacheAcrossProjects(t *testing.T) {
	testenv.RequireRoot(t)
	for i, mode := range []string{server.LayerMountsShared, server.LayerMountsPerProject} {
		addr := fmt.Sprintf("127.0.0.1:%d", 17150+i)
		srv := testenv.StartServer(t, testenv.WithAgent(t), func(c *server.Config) {
			c.Listen = addr
			c.LayerMounts = mode
			// The node's warm of a new mount would make the watched file
			// resident before anyone reads it. The residual is measured
			// without it: it stays for what the warm leaves out (layers
			// past its budget, lazily loaded ones, pages evicted since).
			c.LayerWarmBytes = -1
		})
		ctx := context.Background()
		admin := srv.Client
		// A layer of its own: a file nothing but the reader reads.
		dir := t.TempDir()
		data := make([]byte, 1<<20)
		_, _ = rand.Read(data)
		if err := os.WriteFile(filepath.Join(dir, "watched.bin"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		ref := testenv.UniqueName("watched") + "@1"
		if _, err := admin.CreateLayer(ctx, dir, ref); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CreateComposition(ctx, client.Composition{Ref: ref, Layers: []string{"busybox@1", ref}}); err != nil {
			t.Fatal(err)
		}
		var sbs []*client.Sandbox
		for _, project := range []string{"alpha", "beta"} {
			if _, err := admin.CreateProject(ctx, project, client.Quota{MaxSandboxes: 2}); err != nil {
				t.Fatal(err)
			}
			_, secret, err := admin.CreateToken(ctx, client.TokenOptions{Project: project})
			if err != nil {
				t.Fatal(err)
			}
			c, err := client.New(addr, client.WithToken(secret))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			sbs = append(sbs, testenv.NewSandbox(t, c, client.CreateOptions{Image: ref}))
		}
		x, y := sbs[0], sbs[1]
		installProbe(t, x)
		resident := func() int {
			var r struct {
				Resident int    `json:"resident"`
				Error    string `json:"error"`
			}
			out := testenv.Sh(t, x, "/corral-probe/corral-probe resident /watched.bin")
			if err := json.Unmarshal([]byte(out), &r); err != nil || r.Error != "" {
				t.Fatalf("resident: %q: %v", out, err)
			}
			return r.Resident
		}
		before := resident()
		testenv.Sh(t, y, "cat /watched.bin > /dev/null")
		after := resident()
		seen := after > before
		report.Logf("pagecache/neighbour-read [%s]: X (alpha) sees %d of 256 pages of the watched file resident before Y (beta) reads it, %d after", mode, before, after)
		row, r := "pagecache/neighbour-read-shared", Result{Outcome: "blocked"}
		if mode == server.LayerMountsPerProject {
			row = "pagecache/neighbour-read-per-project"
		}
		if seen {
			r.Outcome = "succeeded"
		}
		r.Name, r.Detail = row, fmt.Sprintf("layer mounts %s: resident pages before Y's read %d, after %d", mode, before, after)
		judge(t, "container", []Result{r})
	}
}
