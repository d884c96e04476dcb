// Command rollout is a small RL-style workload on corral through the Go SDK:
// many parallel episodes, each creating a sandbox, writing a task, running an
// "agent" step and a grader, committing with git, reading a result file,
// scoring it and deleting the sandbox. scripts/demo.sh runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/client"
)

// The task every episode solves: a function the "agent" writes and the
// grader tests. Episodes differ in n, so every score is checked.
const grader = `import json, sys
sys.path.insert(0, "/work")
from solution import primes
n = int(sys.argv[1])
got = primes(n)
want = [p for p in range(2, n) if all(p % d for d in range(2, int(p ** 0.5) + 1))]
json.dump({"n": n, "count": len(got), "ok": got == want}, open("/work/result.json", "w"))
`

const solution = `def primes(n):
    sieve = [True] * max(n, 2)
    out = []
    for i in range(2, n):
        if sieve[i]:
            out.append(i)
            for j in range(i * i, n, i):
                sieve[j] = False
    return out
`

type episodeStats struct {
	create, exec time.Duration
	ok           bool
	err          error
}

func main() {
	addr := flag.String("addr", client.DefaultAddress, "corral server address")
	image := flag.String("image", "debian", "image with python3 and git")
	episodes := flag.Int("episodes", 48, "number of episodes")
	concurrency := flag.Int("concurrency", 8, "episodes in flight")
	flag.Parse()

	c, err := client.New(*addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	start := time.Now()
	results := make([]episodeStats, *episodes)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range *concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < *episodes; i = int(next.Add(1)) - 1 {
				results[i] = episode(ctx, c, *image, 1000+i*137)
			}
		}()
	}
	wg.Wait()
	report(results, time.Since(start), *concurrency)
	left, err := c.List(ctx, client.ListOptions{Labels: map[string]string{"demo": "rollout"}})
	if err != nil || len(left) > 0 {
		log.Fatalf("sandboxes left behind: %d (%v)", len(left), err)
	}
	for _, r := range results {
		if r.err != nil || !r.ok {
			os.Exit(1)
		}
	}
}

func episode(ctx context.Context, c *client.Client, image string, n int) (st episodeStats) {
	t0 := time.Now()
	sb, err := c.Create(ctx, client.CreateOptions{
		Image:     image,
		Resources: client.Resources{CPUMillis: 1000, MemoryBytes: 256 << 20},
		Workdir:   "/work",
		Labels:    map[string]string{"demo": "rollout"},
	})
	if err != nil {
		st.err = err
		return st
	}
	defer sb.Delete(context.Background())
	st.create = time.Since(t0)
	f := sb.Files()
	if err := f.Write(ctx, "/work/solution.py", []byte(solution)); err != nil {
		st.err = err
		return st
	}
	if err := f.Write(ctx, "/work/grade.py", []byte(grader)); err != nil {
		st.err = err
		return st
	}
	t1 := time.Now()
	steps := []client.Command{
		{Shell: "git init -q . && git add -A && git -c user.email=a@b -c user.name=agent commit -qm 'attempt 1'"},
		{Args: []string{"python3", "grade.py", fmt.Sprint(n)}, Timeout: time.Minute},
		{Shell: "git log --oneline | wc -l"},
	}
	for _, cmd := range steps {
		res, err := sb.Run(ctx, cmd)
		if err != nil {
			st.err = err
			return st
		}
		if res.ExitCode != 0 {
			st.err = fmt.Errorf("%v%s: exit %d: %s", cmd.Args, cmd.Shell, res.ExitCode, res.Stderr)
			return st
		}
	}
	st.exec = time.Since(t1)
	data, err := f.Read(ctx, "/work/result.json")
	if err != nil {
		st.err = err
		return st
	}
	st.ok = strings.Contains(string(data), `"ok": true`)
	return st
}

func report(results []episodeStats, wall time.Duration, concurrency int) {
	var creates, execs []time.Duration
	ok, failed := 0, 0
	for _, r := range results {
		if r.err != nil {
			failed++
			fmt.Fprintln(os.Stderr, "episode failed:", r.err)
			continue
		}
		if r.ok {
			ok++
		}
		creates = append(creates, r.create)
		execs = append(execs, r.exec)
	}
	fmt.Printf("\ncorral rollout demo: %d episodes at concurrency %d in %s\n", len(results), concurrency, wall.Round(time.Millisecond))
	fmt.Printf("  solved %d, wrong %d, failed %d\n", ok, len(results)-ok-failed, failed)
	fmt.Printf("  episodes/s      %.1f\n", float64(len(results))/wall.Seconds())
	fmt.Printf("  create p50      %s\n", p50(creates))
	fmt.Printf("  3 commands p50  %s (git init+commit, python grader, git log)\n", p50(execs))
}

func p50(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2].Round(100 * time.Microsecond)
}
