//go:build linux && amd64

package seccomp

import (
	"context"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// workloadProbes are what init and agents do after the filter is in: they must keep working.
func workloadProbes() []probe {
	ps := []probe{
		{name: "exec/true", want: wantOK, run: func(string) result { return fromErr(exec.Command("/bin/true").Run()) }},
		{name: "goroutines", want: wantOK, run: goroutines},
		{name: "readfile", want: wantOK, run: func(string) result {
			b, err := os.ReadFile("/proc/self/status")
			if err != nil {
				return fromErr(err)
			}
			return expect(strings.Contains(string(b), "Seccomp:\t2"), "no Seccomp: 2 in /proc/self/status")
		}},
		{name: "tsync-every-thread", want: wantOK, run: everyThreadFiltered},
		{name: "unix-socket-roundtrip", want: wantOK, run: unixRoundtrip},
		{name: "scm-rights", want: wantOK, run: passFD},
		{name: "setuid-setgid-setgroups", want: wantOK, run: func(string) result {
			if os.Geteuid() != 0 {
				return result{Skip: "needs root"}
			}
			for _, err := range []error{syscall.Setgroups([]int{0}), syscall.Setgid(0), syscall.Setuid(0)} {
				if err != nil {
					return fromErr(err)
				}
			}
			return result{}
		}},
		{name: "kill-setpgid-prctl", want: wantOK, run: func(string) result {
			for _, err := range []error{unix.Kill(os.Getpid(), 0), unix.Setpgid(0, 0),
				unix.Prctl(unix.PR_SET_NAME, uintptr(cstr("probe")), 0, 0, 0)} {
				if err != nil {
					return fromErr(err)
				}
			}
			return result{}
		}},
		{name: "child-inherits-filter", want: wantOK, run: func(string) result {
			out, err := exec.Command("/bin/sh", "-c", "grep Seccomp: /proc/self/status").Output()
			if err != nil {
				return fromErr(err)
			}
			return expect(strings.Contains(string(out), "Seccomp:\t2"), "child: %q", out)
		}},
		{name: "workload/busybox-sh", want: wantOK, run: runs("b\n", "busybox", "sh", "-c", "echo a | tr a b")},
		{name: "workload/python3", want: wantOK, run: runs("ok\n", "python3", "-c",
			"import subprocess,threading,socket,multiprocessing as m;"+
				"socket.getaddrinfo('localhost',80);"+
				"t=threading.Thread(target=lambda:None);t.start();t.join();"+
				"p=m.Pool(2);assert p.map(abs,[-1,-2])==[1,2];p.close();"+
				"print(subprocess.run(['echo','ok'],capture_output=True,text=True).stdout,end='')")},
		{name: "workload/pip", want: wantOK, run: runs("", "python3", "-m", "pip", "--version")},
		{name: "workload/git", want: wantOK, run: func(dir string) result {
			return runs("", "sh", "-c", "cd "+dir+" && git init -q repo && cd repo && echo x > f && git add f &&"+
				" git -c user.name=t -c user.email=t@t commit -qm x && git log --oneline | grep -q x")(dir)
		}},
		{name: "workload/gcc", want: wantOK, run: func(dir string) result {
			src := filepath.Join(dir, "hello.c")
			if err := os.WriteFile(src, []byte("#include <stdio.h>\nint main(){puts(\"hello\");}\n"), 0o644); err != nil {
				return fromErr(err)
			}
			if r := runs("", "gcc", "-O1", "-o", filepath.Join(dir, "hello"), src)(dir); r.Errno != 0 || r.Skip != "" {
				return r
			}
			return runs("hello\n", filepath.Join(dir, "hello"))(dir)
		}},
		{name: "workload/node", want: wantOK, run: runs("2\n", "node", "-e",
			"require('fs').readFile('/proc/self/status',(e,b)=>{if(e)throw e;console.log(1+1)})")},
	}
	for _, f := range []struct {
		name  string
		flags uintptr
	}{{"NEWUSER", unix.CLONE_NEWUSER}, {"NEWNS", unix.CLONE_NEWNS}, {"NEWPID", unix.CLONE_NEWPID},
		{"NEWNET", unix.CLONE_NEWNET}, {"NEWUTS", unix.CLONE_NEWUTS}, {"NEWIPC", unix.CLONE_NEWIPC},
		{"NEWCGROUP", unix.CLONE_NEWCGROUP}} {
		ps = append(ps, probe{name: "clone/" + f.name, want: eperm, run: func(string) result {
			cmd := exec.Command("/bin/true")
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: f.flags}
			return fromErr(cmd.Run())
		}})
	}
	return ps
}

// runs runs argv (skipping when the program is not installed) and compares its stdout with
// want unless want is empty.
func runs(want string, argv ...string) func(string) result {
	return func(string) result {
		if _, err := exec.LookPath(argv[0]); err != nil {
			return result{Skip: argv[0] + " not installed"}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			r := fromErr(err)
			if r.Errno == 0 || r.Errno == otherErr {
				r.Errno = otherErr
			}
			r.Note += ": " + stderr.String()
			return r
		}
		return expect(want == "" || string(out) == want, "%s printed %q, want %q; stderr %s", argv[0], out, want, stderr.String())
	}
}

func goroutines(string) result {
	var wg sync.WaitGroup
	sums := make(chan [32]byte, 64)
	for i := range 500 {
		wg.Go(func() {
			b := []byte{byte(i)}
			for range 2000 {
				s := sha256.Sum256(b)
				b = s[:]
			}
			sums <- [32]byte(b)
		})
	}
	go func() { wg.Wait(); close(sums) }()
	n := 0
	for range sums {
		n++
		if n%100 == 0 {
			runtime.GC()
			time.Sleep(time.Millisecond)
		}
	}
	return expect(n == 500, "got %d results", n)
}

// everyThreadFiltered checks TSYNC: every thread of the process, including those the Go
// runtime started before Install, is in seccomp filter mode.
func everyThreadFiltered(string) result {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fromErr(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "status"))
		if err != nil {
			return fromErr(err)
		}
		if !strings.Contains(string(b), "Seccomp:\t2") {
			return expect(false, "thread %s is not filtered", task.Name())
		}
	}
	return expect(len(tasks) > 1, "only %d thread", len(tasks))
}

func unixRoundtrip(dir string) result {
	l, err := net.Listen("unix", filepath.Join(dir, "ctl.sock"))
	if err != nil {
		return fromErr(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, 4)
		if _, err := io.ReadFull(c, b); err == nil {
			c.Write([]byte(strings.ToUpper(string(b))))
		}
	}()
	c, err := net.Dial("unix", filepath.Join(dir, "ctl.sock"))
	if err != nil {
		return fromErr(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		return fromErr(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil {
		return fromErr(err)
	}
	return expect(string(b) == "PING", "got %q", b)
}

// passFD sends an fd over a unix socket with sendmsg/recvmsg, as init's control socket does.
func passFD(string) result {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fromErr(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fromErr(err)
	}
	defer unix.Close(null)
	if err := unix.Sendmsg(fds[0], []byte("fd"), unix.UnixRights(null), nil, 0); err != nil {
		return fromErr(err)
	}
	b, oob := make([]byte, 8), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(fds[1], b, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return fromErr(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return expect(false, "control messages: %v %v", msgs, err)
	}
	got, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(got) != 1 {
		return expect(false, "rights: %v %v", got, err)
	}
	defer unix.Close(got[0])
	var st unix.Stat_t
	return fromErr(unix.Fstat(got[0], &st))
}
