package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/probeproto"
)

// httpLoad sends GETs to url from conc keep-alive connections for dur: the
// load half of `corral bench net`, run the same way in a sandbox and on the
// host.
func httpLoad(args []string) {
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: corral-probe httpload URL SECONDS CONCURRENCY")
		os.Exit(2)
	}
	secs, err1 := strconv.ParseFloat(args[1], 64)
	conc, err2 := strconv.Atoi(args[2])
	if err1 != nil || err2 != nil || secs <= 0 || secs > 600 || conc <= 0 || conc > 1024 {
		fmt.Fprintln(os.Stderr, "corral-probe httpload: SECONDS in (0, 600], CONCURRENCY in [1, 1024]")
		os.Exit(2)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: conc, DisableCompression: true}
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	var ok, bad atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	deadline := start.Add(time.Duration(secs * float64(time.Second)))
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				resp, err := c.Get(args[0])
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %s", resp.Status)
					}
				}
				if err != nil {
					bad.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					time.Sleep(10 * time.Millisecond)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	r := probeproto.LoadResult{Requests: ok.Load(), Errors: bad.Load(), Seconds: el, PerS: float64(ok.Load()) / el}
	if e, _ := firstErr.Load().(string); e != "" {
		r.FirstErr = e
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
}
