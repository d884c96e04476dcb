# corral fncall warm python: a pre-started interpreter that forks one child
# per call. Requests and replies are JSON lines on stdin/stdout (the node's
# pipes). The child gets fresh stdio pipes, its own session, the call's CPU
# limit and a clean __main__; it never sees this process's channel. This
# process is non-dumpable, so no call can ptrace it or read its memory, and
# its saved uid is not the calls' (root's), so no call can change its rlimits
# (prlimit needs every uid of the target to match the caller's). Between
# calls the node's reset kills everything else and SIGCONTs this process.
#
# A call can still change this process's scheduling (its euid matches:
# nice, policy, affinity, I/O priority, OOM score), and every later call
# would inherit it; no call can lower its nice or leave SCHED_IDLE back
# (that needs CAP_SYS_NICE on the host). So before each fork the state is
# compared with the one at start, and a changed process retires (exits
# with "retired"): the node starts a fresh one for the call.
import base64, ctypes, io, json, os, resource, selectors, signal, sys, time

_libc = ctypes.CDLL(None)
_libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
os.setresuid(0, 0, 65534)
for _m in os.environ.get("CORRAL_PRELOAD", "").split(","):
    if _m:
        __import__(_m)
_OUT = os.dup(1)
os.dup2(os.open("/dev/null", os.O_RDWR), 1)
_RLIMITS = sorted(getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_"))


def sched_state():
    with open("/proc/self/oom_score_adj") as f:
        oom = f.read()
    return (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), os.sched_getparam(0).sched_priority,
            sorted(os.sched_getaffinity(0)), _libc.syscall(252, 1, 0),  # ioprio_get(IOPRIO_WHO_PROCESS, self)
            oom, [resource.getrlimit(r) for r in _RLIMITS])


_PRISTINE = sched_state()


def reap():
    """Reaps exited children that were not the call's (a CLONE_PARENT clone)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def reply(d):
    b = (json.dumps(d) + "\n").encode()
    while b:
        b = b[os.write(_OUT, b):]


def child(src, fds, cpu, env):
    os.setresuid(0, 0, 0)
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    if cpu > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    os.closerange(3, 65536)
    try:
        os.chdir("/tmp")
    except OSError:
        pass
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                  errors="backslashreplace", line_buffering=True)
    sys.argv = ["-c"]
    code = 0
    try:
        exec(compile(src, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:
        import traceback
        # Without this function's frame, as python3 -c prints it.
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        code = 1
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os._exit(code)


def collect(pid, rout, rerr, cap, wall):
    sel = selectors.DefaultSelector()
    pfd = os.pidfd_open(pid)
    sel.register(pfd, selectors.EVENT_READ, None)
    bufs = {rout: bytearray(), rerr: bytearray()}
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, fd)
    deadline, total, timed_out, truncated, exited = time.monotonic() + wall, 0, False, False, False
    while not exited:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(left):
            if key.data is None:
                exited = True
                continue
            try:
                b = os.read(key.data, 65536)
            except BlockingIOError:
                continue
            if not b:
                sel.unregister(key.data)
                continue
            bufs[key.data] += b
            total += len(b)
        if total > cap:
            truncated = True
            break
    if not exited:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            os.kill(pid, signal.SIGKILL)
    for fd in bufs:  # what the child wrote before it exited
        try:
            while total <= cap:
                b = os.read(fd, 65536)
                if not b:
                    break
                bufs[fd] += b
                total += len(b)
        except BlockingIOError:
            pass
    _, status, ru = os.wait4(pid, 0)
    sel.close()
    os.close(pfd)
    out, err = bytes(bufs[rout]), bytes(bufs[rerr])
    if truncated:
        out, err = out[:cap], err[:max(0, cap - len(out))]
    return status, ru, out, err, timed_out, truncated


def serve():
    reply({"pid": os.getpid()})
    for line in sys.stdin.buffer:
        req = json.loads(line)
        reap()
        if sched_state() != _PRISTINE:
            reply({"error": "retired: a call changed the warm python's scheduling state"})
            sys.exit(1)
        try:
            rin, win = os.pipe()
            rout, wout = os.pipe()
            rerr, werr = os.pipe()
            pid = os.fork()
        except Exception as e:  # the call has not run: the node runs it cold
            reply({"error": repr(e)})
            sys.exit(1)
        if pid == 0:
            child(req["src"], (rin, wout, werr), req.get("cpu", 0), req.get("env", {}))
        reply({"started": pid})
        for fd in (rin, wout, werr):
            os.close(fd)
        data = base64.b64decode(req.get("stdin", ""))
        try:
            if len(data) <= 65536:
                os.write(win, data)
        except OSError:
            pass
        os.close(win)
        status, ru, out, err, timed_out, truncated = collect(pid, rout, rerr, req["cap"], req["wall"])
        os.close(rout)
        os.close(rerr)
        reap()
        reply({"code": os.waitstatus_to_exitcode(status), "cpu_ns": int((ru.ru_utime + ru.ru_stime) * 1e9),
               "out": base64.b64encode(out).decode(), "err": base64.b64encode(err).decode(),
               "timed_out": timed_out, "truncated": truncated})


serve()
