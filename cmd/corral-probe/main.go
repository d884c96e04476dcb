// Command corral-probe is the red-team probe: a static binary the red-team
// suite (internal/redteam) copies into a sandbox and runs as root there. It
// makes every attempt of docs/THREATS.md that can be made from inside a sandbox
// and prints one JSON line per attempt:
//
//	{"name":"ioctl/xfs-goingdown","outcome":"blocked","errno":"EPERM","detail":"..."}
//
// outcome is "blocked" when the attempt failed (errno says how; "ENOENT" also
// stands for "nothing found" in searches, "EMPTY" for a read that returned
// no bytes, as from a masked file) and "succeeded" when it worked. Every
// call gets valid arguments, so that a refusal comes from the policy, never
// from EFAULT; where success could hurt the host the arguments are chosen so
// that a call that got past the policy fails harmlessly later (invalid flags,
// a non-ELF module) and the errno shows it got that far.
//
// It is never part of an image and imports only the standard library,
// golang.org/x/sys/unix and internal/probeproto (its stdin and stdout
// types, shared with the suite), so that it builds with CGO_ENABLED=0,
// runs in any image and knows nothing of corral's internals.
//
// Modes (first argument): "attempts" (default) reads a JSON Input from
// stdin; "overwrite" replaces /bin/sh, /bin/bash and /usr/bin/python3 with
// the probe and writes into a shared layer; "inodes DIR" creates files until
// the disk refuses; "kill" sends SIGKILL to -1 and SIGKILL/SIGTERM to 1 (run
// last: it ends every other process of the sandbox); "net" reads a
// NetInput from stdin and makes the network rows; "httpload URL SECONDS
// CONCURRENCY" is the load generator of `corral bench net`; "sched" tries
// to leave SCHED_IDLE (in a best-effort sandbox); "connect TARGET..." tries
// the unix sockets named (paths, @abstract) as forge/connect rows; "dnsflood"
// reads a FloodInput and floods the node's DNS proxy; "dnsserver ADDR" is
// the suite's upstream resolver, run on the host; "hog SECONDS" and "kres"
// take and test per-user kernel counts, "spin SECS" and "detach N SECS WAIT"
// burn CPU in detached processes (kres.go); "mq", "pid" and "forkn" are
// steps of attacks across fncalls (calls.go); "flood PATH SECS" and
// "syncwrites PATH N" are the disk I/O row's attacker and victim (kres.go);
// "pagecache" probes a shared layer file's page-cache state and "resident
// PATH" prints how many of a file's pages are cached (neighbours.go);
// "workingset MIB DIR" is `corral bench pause`'s re-touched working set
// (workingset.go).
// Run under any other
// name (after "overwrite" replaced a binary) it prints HijackMarker.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/probeproto"
)

// HijackMarker is what the probe prints when it runs in place of a
// binary it overwrote.
const HijackMarker = "HIJACKED-BY-CORRAL-PROBE"

const (
	blocked   = "blocked"
	succeeded = "succeeded"
)

var out = json.NewEncoder(os.Stdout)

// emit writes each result as one JSON line.
func emit(rs ...probeproto.Result) {
	for _, r := range rs {
		_ = out.Encode(r)
	}
}

// fromErr turns a call's error into a Result: nil is a success.
func fromErr(name string, err error, detail string) probeproto.Result {
	if err == nil {
		return probeproto.Result{Name: name, Outcome: succeeded, Detail: detail}
	}
	return probeproto.Result{Name: name, Outcome: blocked, Errno: errnoName(err), Detail: detail}
}

func errnoName(err error) string {
	var rcode rcodeError
	if errors.As(err, &rcode) {
		return rcode.Error() // a DNS refusal: REFUSED, NXDOMAIN …
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		return "ETIMEDOUT"
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		if n := unix.ErrnoName(errno); n != "" {
			return n
		}
		return fmt.Sprintf("errno%d", int(errno))
	}
	return "ERROR:" + err.Error()
}

// attempt runs f and emits its results; a panic becomes a result too.
func attempt(name string, f func() []probeproto.Result) {
	defer func() {
		if p := recover(); p != nil {
			emit(probeproto.Result{Name: name, Outcome: blocked, Errno: "PANIC", Detail: fmt.Sprint(p)})
		}
	}()
	emit(f()...)
}

func one(r probeproto.Result) []probeproto.Result { return []probeproto.Result{r} }

func main() {
	debug.SetGCPercent(50)
	if base := filepath.Base(os.Args[0]); base != "corral-probe" {
		fmt.Println(HijackMarker, base)
		os.Exit(42)
	}
	mode := "attempts"
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "attempts":
		var in probeproto.Input
		if data, err := io.ReadAll(os.Stdin); err == nil && len(strings.TrimSpace(string(data))) > 0 {
			if err := json.Unmarshal(data, &in); err != nil {
				fmt.Fprintln(os.Stderr, "corral-probe: bad input:", err)
				os.Exit(2)
			}
		}
		runAttempts(in)
	case "overwrite":
		emit(overwrite()...)
	case "inodes":
		if len(os.Args) < 3 {
			fmt.Fprintln(os.Stderr, "usage: corral-probe inodes DIR")
			os.Exit(2)
		}
		emit(fillInodes(os.Args[2]))
	case "kill":
		emit(killAll()...)
	case "net":
		var in probeproto.NetInput
		if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
			fmt.Fprintln(os.Stderr, "corral-probe net: bad input:", err)
			os.Exit(2)
		}
		netAttempts(in)
	case "httpload":
		httpLoad(os.Args[2:])
	case "dnsflood":
		dnsFlood()
	case "dnsserver":
		dnsServer(os.Args[2])
	case "connect":
		emit(connectAll(os.Args[2:])...)
	case "sched":
		emit(schedAttempts()...)
	case "hog":
		hog(os.Args[2:])
	case "spin":
		if len(os.Args) > 2 {
			if v, err := strconv.ParseFloat(os.Args[2], 64); err == nil {
				spin(v)
			}
		}
	case "detach":
		detach(os.Args[2:])
	case "mq":
		emit(mqMode(os.Args[2:])...)
	case "pid":
		pidLine()
	case "forkn":
		forkN(os.Args[2:])
	case "syncwrites":
		if len(os.Args) == 4 {
			n, _ := strconv.Atoi(os.Args[3])
			syncWrites(os.Args[2], n)
		}
	case "flood":
		if len(os.Args) == 4 {
			secs, _ := strconv.ParseFloat(os.Args[3], 64)
			diskFlood(os.Args[2], secs)
		}
	case "pagecache":
		emit(pageCacheProbes()...)
	case "resident":
		if len(os.Args) > 2 {
			residentPages(os.Args[2])
		}
	case "kres":
		emit(kres()...)
	case "workingset":
		workingSet(os.Args[2:])
	case "noop":
	default:
		fmt.Fprintln(os.Stderr, "corral-probe: unknown mode", mode)
		os.Exit(2)
	}
}

func runAttempts(in probeproto.Input) {
	harnessAttempts(in)
	kernelAttempts(in)
	surfaceAttempts()
	neighbourAttempts()
}
