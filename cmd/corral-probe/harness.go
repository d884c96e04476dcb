package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/probeproto"
)

// harnessAttempts are docs/THREATS.md's "reward hacking and harness tampering"
// rows: look for the harness, forge a request to it, read other sandboxes.
func harnessAttempts(in probeproto.Input) {
	var sockets []string
	attempt("harness/find-sockets", func() []probeproto.Result {
		sockets = findSockets("/")
		if len(sockets) == 0 {
			return one(probeproto.Result{Name: "harness/find-sockets", Outcome: blocked, Errno: "ENOENT", Detail: "no unix socket in the filesystem"})
		}
		return one(probeproto.Result{Name: "harness/find-sockets", Outcome: succeeded, Detail: strings.Join(sockets, " ")})
	})
	var bound []string
	attempt("harness/proc-net-unix", func() []probeproto.Result {
		var err error
		bound, err = boundUnixNames()
		if err != nil {
			return one(fromErr("harness/proc-net-unix", err, "read /proc/net/unix"))
		}
		if len(bound) == 0 {
			return one(probeproto.Result{Name: "harness/proc-net-unix", Outcome: blocked, Errno: "ENOENT", Detail: "no bound unix socket in this network namespace"})
		}
		return one(probeproto.Result{Name: "harness/proc-net-unix", Outcome: succeeded, Detail: strings.Join(bound, " ")})
	})
	attempt("harness/proc1-fd", func() []probeproto.Result {
		ents, err := os.ReadDir("/proc/1/fd")
		first := fromErr("harness/proc1-fd", err, fmt.Sprintf("%d entries", len(ents)))
		if err == nil && len(ents) == 0 {
			// A masked (empty) directory shows nothing of init's fds.
			first = probeproto.Result{Name: "harness/proc1-fd", Outcome: blocked, Errno: "EMPTY", Detail: "0 entries (masked)"}
		}
		rs := []probeproto.Result{first}
		for _, e := range ents {
			target, err := os.Readlink("/proc/1/fd/" + e.Name())
			rs = append(rs, fromErr("harness/proc1-fd-readlink", err, "fd "+e.Name()+" "+target))
		}
		if len(ents) == 0 {
			_, err := os.Readlink("/proc/1/fd/0")
			rs = append(rs, fromErr("harness/proc1-fd-readlink", err, "fd 0"))
		}
		return rs
	})
	for _, f := range []string{"environ", "mem", "maps", "root/"} {
		name := "harness/proc1-" + strings.TrimSuffix(f, "/")
		attempt(name, func() []probeproto.Result {
			if f == "root/" {
				_, err := os.ReadDir("/proc/1/root/")
				return one(fromErr(name, err, "list init's root"))
			}
			b, err := readSome("/proc/1/"+f, 4096)
			return one(readResult(name, b, err))
		})
	}
	attempt("harness/canary-grep", func() []probeproto.Result { return one(grepCanaries(in.Canaries)) })
	attempt("forge/connect", func() []probeproto.Result {
		targets := append(append(append([]string{}, sockets...), bound...), in.Sockets...)
		targets = append(targets, "@corral", "@corral-init", "@corral.sock", "@/run/corral/init.sock")
		return connectAll(targets)
	})
	attempt("other-sandbox/procs", func() []probeproto.Result {
		var rs []probeproto.Result
		for _, pid := range in.Pids {
			rs = append(rs, fromErr("other-sandbox/kill0", unix.Kill(pid, 0), "host pid "+strconv.Itoa(pid)))
			b, err := readSome("/proc/"+strconv.Itoa(pid)+"/environ", 4096)
			rs = append(rs, readResult("other-sandbox/environ", b, err))
		}
		return rs
	})
}

// findSockets walks the filesystem like `find / -type s`, skipping the
// kernel's virtual trees.
func findSockets(root string) []string {
	var found []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (p == "/proc" || p == "/sys") {
			return filepath.SkipDir
		}
		if d.Type()&fs.ModeSocket != 0 {
			found = append(found, p)
		}
		return nil
	})
	return found
}

// boundUnixNames lists the bound names (paths and @abstract) in
// /proc/net/unix, which covers every unix socket of this network namespace.
func boundUnixNames() ([]string, error) {
	data, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var names []string
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) >= 8 && !seen[f[7]] {
			seen[f[7]] = true
			names = append(names, f[7])
		}
	}
	sort.Strings(names)
	return names, nil
}

// connectAll tries a stream and a seqpacket connection to every target.
func connectAll(targets []string) []probeproto.Result {
	seen := map[string]bool{}
	var rs []probeproto.Result
	for _, t := range targets {
		if seen[t] {
			continue
		}
		seen[t] = true
		addr := t
		if strings.HasPrefix(t, "@") {
			addr = "\x00" + t[1:]
		}
		var err error
		for _, network := range []string{"unix", "unixpacket", "unixgram"} {
			var c net.Conn
			c, err = net.DialTimeout(network, addr, 2*time.Second)
			if err == nil {
				c.Close()
				rs = append(rs, probeproto.Result{Name: "forge/connect", Outcome: succeeded, Detail: network + " " + t})
				break
			}
			if !isErrno(err, unix.EPROTOTYPE) {
				break
			}
		}
		if err != nil {
			rs = append(rs, fromErr("forge/connect", err, t))
		}
	}
	return rs
}

func isErrno(err error, want unix.Errno) bool {
	var errno unix.Errno
	return errors.As(err, &errno) && errno == want
}

// grepCanaries reads every regular file (up to 8 MiB each) and every
// visible process's environ and cmdline, looking for the canaries.
func grepCanaries(canaries []string) probeproto.Result {
	const name = "harness/canary-grep"
	if len(canaries) == 0 {
		return probeproto.Result{Name: name, Outcome: blocked, Errno: "EINVAL", Detail: "no canaries given"}
	}
	var hits []string
	files := 0
	check := func(p string, b []byte) {
		for i, c := range canaries {
			if c != "" && bytes.Contains(b, []byte(c)) {
				hits = append(hits, fmt.Sprintf("canary %d in %s", i, p))
			}
		}
	}
	_ = filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (p == "/proc" || p == "/sys" || p == "/dev") {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if b, err := readSome(p, 8<<20); err == nil {
			files++
			check(p, b)
		}
		return nil
	})
	procs, _ := filepath.Glob("/proc/[0-9]*")
	procs = append(procs, "/proc/self")
	for _, proc := range procs {
		for _, f := range []string{"environ", "cmdline"} {
			if b, err := readSome(proc+"/"+f, 1<<20); err == nil {
				files++
				check(proc+"/"+f, b)
			}
		}
	}
	for _, e := range os.Environ() {
		check("own environment", []byte(e))
	}
	if len(hits) > 0 {
		return probeproto.Result{Name: name, Outcome: succeeded, Detail: strings.Join(hits, "; ")}
	}
	return probeproto.Result{Name: name, Outcome: blocked, Errno: "ENOENT", Detail: fmt.Sprintf("%d canaries not found in %d files", len(canaries), files)}
}

// readSome reads up to n bytes; open and read errors are returned as is.
func readSome(p string, n int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// readResult: an error blocks, zero bytes is "EMPTY" (a masked file).
func readResult(name string, b []byte, err error) probeproto.Result {
	switch {
	case err != nil:
		return fromErr(name, err, "")
	case len(b) == 0:
		return probeproto.Result{Name: name, Outcome: blocked, Errno: "EMPTY", Detail: "read 0 bytes"}
	}
	return probeproto.Result{Name: name, Outcome: succeeded, Detail: fmt.Sprintf("read %d bytes", len(b))}
}

// overwrite replaces the shells and python with the probe itself (which
// prints HijackMarker when run under another name) and writes into a
// directory of the image's shared layer.
func overwrite() []probeproto.Result {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		return one(fromErr("overwrite/read-self", err, ""))
	}
	var rs []probeproto.Result
	for _, target := range []string{"/bin/sh", "/bin/bash", "/usr/bin/python3"} {
		name := "overwrite/write:" + target
		// Absent in this image: planting the binary where a harness would
		// look for it is the same attack.
		detail := "replaced with the probe"
		err := os.Remove(target)
		if errors.Is(err, os.ErrNotExist) {
			detail, err = "planted (absent in this image)", os.MkdirAll(filepath.Dir(target), 0o755)
		}
		if err == nil {
			err = os.WriteFile(target, self, 0o755)
		}
		rs = append(rs, fromErr(name, err, detail))
	}
	err = os.MkdirAll("/usr/lib", 0o755)
	if err == nil {
		err = os.WriteFile("/usr/lib/corral-probe-shared-layer", []byte("written by corral-probe\n"), 0o644)
	}
	rs = append(rs, fromErr("shared-layer/write", err, "/usr/lib/corral-probe-shared-layer"))
	return rs
}

// fillInodes creates empty files in dir until the filesystem refuses, up
// to a million files or two minutes.
func fillInodes(dir string) probeproto.Result {
	const name = "resource/inodes"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fromErr(name, err, "mkdir "+dir)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; i < 1_000_000; i++ {
		sub := filepath.Join(dir, strconv.Itoa(i/10000))
		if i%10000 == 0 {
			if err := unix.Mkdir(sub, 0o755); err != nil {
				return fromErr(name, err, fmt.Sprintf("created %d files", i))
			}
		}
		fd, err := unix.Open(filepath.Join(sub, strconv.Itoa(i)), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return fromErr(name, err, fmt.Sprintf("created %d files", i))
		}
		unix.Close(fd)
		if i%1000 == 0 && time.Now().After(deadline) {
			return probeproto.Result{Name: name, Outcome: succeeded, Detail: fmt.Sprintf("created %d files before the deadline", i)}
		}
	}
	return probeproto.Result{Name: name, Outcome: succeeded, Detail: "created 1000000 files"}
}

// killAll is `kill -9 -1` and `kill 1` (SIGKILL and SIGTERM): the calls
// themselves succeed; the suite checks what they did.
func killAll() []probeproto.Result {
	return []probeproto.Result{
		fromErr("kill/minus-1", unix.Kill(-1, unix.SIGKILL), "kill -9 -1"),
		fromErr("kill/init-sigkill", unix.Kill(1, unix.SIGKILL), "kill -9 1"),
		fromErr("kill/init-sigterm", unix.Kill(1, unix.SIGTERM), "kill 1"),
	}
}
