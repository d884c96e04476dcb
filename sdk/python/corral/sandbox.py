"""Handles on one sandbox: commands (:class:`AsyncSandbox`), files
(:class:`AsyncFiles`) and streamed command output (:class:`ExecStream`)."""

import asyncio
import hashlib
import itertools
import io
import tempfile
from typing import IO, TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from ._connect import ServerStream
from ._tar import extract, file_messages, tar_tree
from .errors import InternalError, NotFoundError
from .images import _SVC as _IMAGE_SVC
from .images import Packed, packed_from_json
from .network import Network, NetworkStats, mode_json
from .rollout import ForkResult, Snapshot, fork_outcomes
from .types import ExecChunk, ExecLogEntry, ExecResult, FileInfo, SandboxInfo
from .types import b64decode, b64encode, env_list, format_duration

if TYPE_CHECKING:
    from .client import AsyncClient

__all__ = ["AsyncSandbox", "AsyncFiles", "ExecStream", "Command", "exec_key"]

_ROLLOUT_SVC = "/corral.v1.RolloutService/"

_VM_SVC = "/corral.v1.VMService/"

Command = Union[str, Sequence[str]]
"""A command: a list is run as argv (no shell), a str with ``sh -c``."""

# Size of each WriteFile request when writing large data (as the Go SDK).
WRITE_CHUNK = 4 << 20
# When a command has no timeout of its own, the client waits this long for
# it (the server's default exec timeout) plus the client's call timeout.
SERVER_EXEC_TIMEOUT = 600.0
# Stdin above this size (or from a file) is streamed (RunStream) instead of
# sent in the request, whose size the server caps.
STREAM_STDIN = 4 << 20


def exec_request(sandbox_id: str, cmd: Command, *, env: Optional[Dict[str, str]] = None,
                 cwd: Optional[str] = None, user: Optional[str] = None,
                 stdin: Union[bytes, str, None] = None, timeout: Optional[float] = None,
                 output_limit: Optional[int] = None, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
    """The JSON ExecRequest for cmd (see :meth:`AsyncSandbox.run`)."""
    req: Dict[str, Any] = {"sandboxId": sandbox_id}
    if idempotency_key:
        req["idempotencyKey"] = idempotency_key
    if isinstance(cmd, str):
        req["argv"], req["shell"] = [cmd], True
    else:
        argv = list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("cmd: want a non-empty list of str (argv) or a str (shell script)")
        req["argv"] = argv
    if env:
        req["env"] = env_list(env)
    if cwd:
        req["cwd"] = cwd
    if user:
        req["user"] = user
    if stdin:
        req["stdin"] = b64encode(stdin.encode() if isinstance(stdin, str) else bytes(stdin))
    if timeout is not None:
        req["timeout"] = format_duration(timeout, "timeout")
    if output_limit:
        req["outputLimitBytes"] = str(int(output_limit))
    return req


def exec_key(sandbox_id: str, step: str) -> str:
    """The idempotency key of ``step`` in a sandbox (the Go SDK's ExecKey):
    the same sandbox and step always give the same key."""
    digest = hashlib.sha256((sandbox_id + "\0" + step).encode()).hexdigest()
    return "step-" + digest[:32]


class AsyncSandbox:
    """A handle on one sandbox; it holds only the id (and ``info`` from
    create) and the count of ``idempotent=True`` commands sent through it.

    Also an async context manager that deletes the sandbox on exit.
    """

    def __init__(self, client: "AsyncClient", sandbox_id: str, info: Optional[SandboxInfo] = None) -> None:
        self._c = client
        self.id = sandbox_id
        self.info = info
        self.files = AsyncFiles(self)
        self._steps = itertools.count()

    def _key(self, idempotency_key: Optional[str], step: Optional[str], idempotent: bool) -> Optional[str]:
        if idempotency_key:
            return idempotency_key
        if step:
            return exec_key(self.id, step)
        if idempotent:
            return exec_key(self.id, "#%d" % next(self._steps))
        return None

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r})"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._c._delete_shielded(self.id)

    async def refresh(self, *, request_timeout: Optional[float] = None) -> SandboxInfo:
        """Fetch the sandbox's current description (also stored in ``info``)."""
        self.info = await self._c.get(self.id, request_timeout=request_timeout)
        return self.info

    async def delete(self, *, request_timeout: Optional[float] = None) -> bool:
        """Delete the sandbox; False if it was already gone."""
        return await self._c.delete(self.id, request_timeout=request_timeout)

    async def pause(self, *, reclaim: bool = False, request_timeout: Optional[float] = None) -> Dict[str, int]:
        """Freeze every process; any later command or file call resumes it.

        ``reclaim`` also pushes the frozen memory out of RAM (a container's
        to the node's swap area: the server needs ``corral serve --swap``;
        a microVM's to a snapshot on disk) and returns the bytes resident
        before and after and swapped (``resident_before_bytes``, ...)."""
        d = await self._c._t.unary("Pause", {"id": self.id, "reclaim": reclaim}, timeout=request_timeout)
        return {k: int(d.get(j, 0)) for k, j in (("resident_before_bytes", "residentBeforeBytes"),
                                                  ("resident_after_bytes", "residentAfterBytes"),
                                                  ("swapped_bytes", "swappedBytes"))}

    async def resume(self, *, request_timeout: Optional[float] = None) -> None:
        """Thaw a paused sandbox."""
        await self._c._t.unary("Resume", {"id": self.id}, timeout=request_timeout)

    async def update_network(self, *, mode: Optional[str] = None, allow: Optional[List[str]] = None,
                             deny: Optional[List[str]] = None, replace: bool = False,
                             request_timeout: Optional[float] = None) -> Network:
        """Change the running sandbox's network policy and return the new
        one: ``mode`` (``"none"``, ``"allowlist"``, ``"open"``; None keeps
        it), ``allow`` rules added (or, with ``replace``, the whole list),
        ``deny`` rules removed. New rules apply to connections made after."""
        msg: Dict[str, Any] = {"id": self.id, "allow": list(allow or []), "deny": list(deny or []),
                               "replace": replace}
        if mode is not None:
            msg["mode"] = mode_json(mode)
        d = await self._c._t.unary("UpdateNetwork", msg, timeout=request_timeout)
        return Network._from_json(d.get("network"))

    async def network_stats(self, *, request_timeout: Optional[float] = None) -> NetworkStats:
        """What the sandbox's network policy refused, most refused first."""
        d = await self._c._t.unary("NetworkStats", {"id": self.id}, idempotent=True, timeout=request_timeout)
        return NetworkStats._from_json(d)

    async def screenshot(self, *, scale: float = 0.0, request_timeout: Optional[float] = None) -> bytes:
        """The screen of a ``vm`` sandbox as PNG bytes; ``0 < scale <= 1`` shrinks it.

        Other backends have no screen: :class:`corral.errors.UnimplementedError`."""
        r = await self._c._t.unary(_VM_SVC + "Screenshot", {"sandboxId": self.id, "scale": scale},
                                   timeout=request_timeout)
        return b64decode(r.get("png"))

    async def send_input(self, *events: Dict[str, Any], request_timeout: Optional[float] = None) -> None:
        """Keyboard and mouse events for a ``vm`` sandbox, in order. Each is one of
        ``{"text": "echo hi"}``, ``{"keys": "ctrl-alt-t"}``, ``{"click": True, "x": 10, "y": 20}``
        (``"button": "right"``), ``{"move": True, "x": .., "y": ..}`` or
        ``{"scroll": True, "x": .., "y": .., "scroll_delta": 3}``."""
        evs = []
        for e in events:
            ev = dict(e)
            if "scroll_delta" in ev:
                ev["scrollDelta"] = ev.pop("scroll_delta")
            evs.append(ev)
        await self._c._t.unary(_VM_SVC + "SendInput", {"sandboxId": self.id, "events": evs}, timeout=request_timeout)

    async def pack(self, name: str, *, exclude: Optional[List[str]] = None, default_excludes: bool = True,
                   composition: bool = True, request_timeout: Optional[float] = None) -> Packed:
        """Turn the sandbox's writes into the layer ``name`` (NAME@VERSION)
        and, with ``composition``, the composition ``name``: the sandbox's
        layers with the new one on top, to create sandboxes that start where
        this one is now (branching a trajectory). A running sandbox is
        paused while it is read. ``exclude`` adds absolute paths to leave
        out (``*`` and ``?`` match within a component) to the defaults
        (shell histories, /tmp, /run ...)."""
        msg = {"sandboxId": self.id, "name": name, "exclude": list(exclude or []),
               "noDefaultExcludes": not default_excludes, "noComposition": not composition}
        return packed_from_json(await self._c._t.unary(_IMAGE_SVC + "Pack", msg, timeout=request_timeout))

    async def snapshot(self, *, request_timeout: Optional[float] = None) -> Snapshot:
        """Save the sandbox's memory, devices and writable disk while it keeps
        running (microVMs; a paused one is resumed first). The snapshot is
        durable: it survives a daemon kill and restart. A container sandbox
        raises :class:`UnimplementedError` naming why (CRIU)."""
        d = await self._c._t.unary(_ROLLOUT_SVC + "Snapshot", {"sandboxId": self.id}, timeout=request_timeout)
        return Snapshot._from_json(d.get("snapshot"))

    async def fork(self, count: int, *, request_timeout: Optional[float] = None) -> ForkResult:
        """Make ``count`` (1 to 64) new sandboxes starting from this one as
        it is now, with its resources, settings and labels plus
        ``corral.fork-of``: a microVM's from one snapshot restored ``count``
        times (processes carried, each with a fresh identity), a container's
        from its files (``processes_carried`` False). Failures are per fork
        (``ForkResult.forks[i].error``); a bad count raises
        :class:`InvalidArgumentError` naming it."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count: want an int, got {count!r}")
        d = await self._c._t.unary(_ROLLOUT_SVC + "Fork", {"sandboxId": self.id, "count": count},
                                   timeout=request_timeout)
        return fork_outcomes(d, lambda sid, info: AsyncSandbox(self._c, sid, info))

    async def list_execs(self, since_seq: int = 0, *, request_timeout: Optional[float] = None) -> List[ExecLogEntry]:
        """The sandbox's logged commands (those that carried an idempotency
        key) numbered above ``since_seq``, oldest first: what a restarted
        trainer needs to fast-forward."""
        out: List[ExecLogEntry] = []
        while True:
            d = await self._c._t.unary(_ROLLOUT_SVC + "ListExecs",
                                       {"sandboxId": self.id, "sinceSeq": str(since_seq), "pageSize": 1000},
                                       idempotent=True, timeout=request_timeout)
            out.extend(ExecLogEntry._from_json(e) for e in d.get("entries", []))
            since_seq = int(d.get("nextSeq", 0))
            if since_seq == 0:
                return out

    def _exec_budget(self, timeout: Optional[float], request_timeout: Optional[float]) -> float:
        if request_timeout is not None:
            return self._c._t.budget(request_timeout)
        cmd = SERVER_EXEC_TIMEOUT if timeout is None else float(timeout)
        return cmd + self._c._t.timeout

    async def run(self, cmd: Command, *, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
                  user: Optional[str] = None, stdin: Union[bytes, str, IO[bytes], None] = None,
                  timeout: Optional[float] = None, output_limit: Optional[int] = None,
                  request_timeout: Optional[float] = None, idempotent: bool = False,
                  step: Optional[str] = None, idempotency_key: Optional[str] = None) -> ExecResult:
        """Run a command and return its result with the whole output.

        Args:
            cmd: argv list (no shell) or a str run with ``sh -c``.
            env: variables added to the sandbox's environment.
            cwd: working directory (default: the sandbox's workdir).
            user: user name, ``uid`` or ``uid:gid`` (default: the sandbox's).
            stdin: bytes (or str, UTF-8) fed to the command, or a binary
                file read to its end; a file or more than 4 MiB is streamed,
                with no size cap (stdin the command leaves unread is dropped).
            timeout: seconds before the server kills the command's process
                group (result ``timed_out``); None: the server default.
            output_limit: cap on stdout+stderr bytes (result ``truncated``).
            request_timeout: client deadline of the call; by default the
                command's timeout (or the server's 600 s) plus the client's
                ``timeout``.
            idempotency_key: names the command in the sandbox's exec log:
                it runs once, to its end even if this client goes away, and
                a repeat of the key returns the recorded result and output
                (``replayed``) instead of running it again.
            step: derive the key from the sandbox and this name.
            idempotent: derive the key from the sandbox and the number of
                ``idempotent`` commands this handle sent before, so a
                restarted trainer sending the same commands in the same order
                (on ``client.attach(id)``) gets the recorded results.

        Cancelling the awaiting task closes the connection, and the server
        then kills the command (unless it carries a key).
        """
        budget = self._exec_budget(timeout, request_timeout)
        key = self._key(idempotency_key, step, idempotent)
        if isinstance(stdin, str):
            stdin = stdin.encode()
        streamed = stdin is not None and (not isinstance(stdin, (bytes, bytearray, memoryview)) or len(stdin) > STREAM_STDIN)
        if streamed and key:
            # A keyed command is compared with its repeat, so its stdin goes whole in the request.
            raise ValueError("idempotency: a keyed command takes stdin as bytes of at most %d bytes, not a stream" % STREAM_STDIN)
        if streamed:
            src = stdin if not isinstance(stdin, (bytes, bytearray, memoryview)) else io.BytesIO(bytes(stdin))
            resp = await self._run_streamed(cmd, src, budget, env=env, cwd=cwd, user=user,
                                            timeout=timeout, output_limit=output_limit)
        else:
            req = exec_request(self.id, cmd, env=env, cwd=cwd, user=user, stdin=stdin,
                               timeout=timeout, output_limit=output_limit, idempotency_key=key)
            resp = await self._c._t.unary("Run", req, timeout=budget)
        return ExecResult._from_json(resp.get("result"), b64decode(resp.get("stdout")), b64decode(resp.get("stderr")))

    async def _run_streamed(self, cmd: Command, f: IO[bytes], budget: float, **opts: Any) -> Dict[str, Any]:
        first = {"exec": exec_request(self.id, cmd, **opts)}
        return await self._c._t.client_stream("RunStream", file_messages(f, first, "stdin"), timeout=budget)

    def exec_stream(self, cmd: Command, *, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
                    user: Optional[str] = None, stdin: Union[bytes, str, None] = None,
                    timeout: Optional[float] = None, output_limit: Optional[int] = None,
                    request_timeout: Optional[float] = None, idempotent: bool = False,
                    step: Optional[str] = None, idempotency_key: Optional[str] = None) -> "ExecStream":
        """Run a command, streaming its output as it arrives::

            async for chunk in sb.exec_stream(["make", "test"]):
                if chunk.stream == "result":
                    print("exit", chunk.result.exit_code)
                else:
                    print(chunk.stream, chunk.text, end="")

        Arguments are those of :meth:`run`. Leaving the loop early, an
        exception or cancelling the task kills the command on the server.
        """
        req = exec_request(self.id, cmd, env=env, cwd=cwd, user=user, stdin=stdin,
                           timeout=timeout, output_limit=output_limit,
                           idempotency_key=self._key(idempotency_key, step, idempotent))
        return ExecStream(self._c._t.stream("Exec", req, timeout=self._exec_budget(timeout, request_timeout)))


class ExecStream:
    """Output chunks of a running command, then one ``"result"`` chunk.

    After iteration ends, ``result`` holds the :class:`ExecResult` (without
    output). Use ``async with`` (or :meth:`aclose`) to stop early and kill
    the command deterministically.
    """

    def __init__(self, stream: ServerStream) -> None:
        self._s = stream
        self.result: Optional[ExecResult] = None

    def __aiter__(self) -> "ExecStream":
        return self

    async def __aenter__(self) -> "ExecStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._s.close()

    async def aclose(self) -> None:
        """Stop reading; if the command still runs, the server kills it."""
        self._s.close()

    async def __anext__(self) -> ExecChunk:
        try:
            msg = await self._s.__anext__()
        except StopAsyncIteration:
            if self.result is None:
                raise InternalError("exec stream ended without a result") from None
            raise
        if "stdout" in msg:
            return ExecChunk("stdout", b64decode(msg["stdout"]))
        if "stderr" in msg:
            return ExecChunk("stderr", b64decode(msg["stderr"]))
        if "result" in msg:
            self.result = ExecResult._from_json(msg["result"])
            return ExecChunk("result", result=self.result)
        return ExecChunk("stdout")  # an empty output event

    async def wait(self) -> ExecResult:
        """Read the stream to its end, collecting output into the result."""
        out: List[bytes] = []
        err: List[bytes] = []
        async for chunk in self:
            (out if chunk.stream == "stdout" else err).append(chunk.data)
        assert self.result is not None
        self.result.stdout, self.result.stderr = b"".join(out), b"".join(err)
        return self.result


class AsyncFiles:
    """File operations inside one sandbox; paths are absolute in the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    @property
    def _t(self) -> Any:
        return self._sb._c._t

    async def write(self, path: str, data: Union[bytes, str], *, mode: Optional[int] = None,
                    append: bool = False, make_parents: bool = True,
                    request_timeout: Optional[float] = None) -> int:
        """Create or replace path with data (str is UTF-8 encoded), or append
        to it; returns the number of bytes written. New files get mode (default 0o644);
        missing parents are created unless make_parents is False. Data over
        4 MiB is sent in several requests."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        written = 0
        for off in range(0, max(len(raw), 1), WRITE_CHUNK):
            req: Dict[str, Any] = {"sandboxId": self._sb.id, "path": path,
                                   "content": b64encode(raw[off:off + WRITE_CHUNK])}
            if mode is not None:
                req["mode"] = int(mode)
            if append or off > 0:
                req["append"] = True
            if make_parents:
                req["makeParents"] = True
            resp = await self._t.unary("WriteFile", req, timeout=request_timeout)
            written += int(resp.get("size", 0))
        return written

    async def write_from(self, path: str, f: IO[bytes], *, mode: Optional[int] = None,
                         make_parents: bool = True, request_timeout: Optional[float] = None) -> int:
        """Stream the open binary file f into path in one call (no size cap
        but the sandbox's disk quota); returns the bytes written."""
        first: Dict[str, Any] = {"sandboxId": self._sb.id, "path": path, "makeParents": make_parents}
        if mode is not None:
            first["mode"] = int(mode)
        resp = await self._t.client_stream("UploadFile", file_messages(f, first, "content"), timeout=request_timeout)
        return int(resp.get("size", 0))

    async def upload_dir(self, local: str, dest: str, *, request_timeout: Optional[float] = None) -> int:
        """Copy the tree of the local directory ``local`` into the sandbox
        directory ``dest`` (made when missing): files, directories, symlinks,
        hard links, modes, owners, mtimes and user.* xattrs. Returns the
        bytes of file content written."""
        f = await asyncio.get_running_loop().run_in_executor(None, tar_tree, local)
        first = {"sandboxId": self._sb.id, "path": dest}
        resp = await self._t.client_stream("CopyIn", file_messages(f, first, "data"), timeout=request_timeout)
        return int(resp.get("bytes", 0))

    async def download_dir(self, path: str, local: str, *, request_timeout: Optional[float] = None) -> None:
        """Make the local directory ``local`` (made when missing) a copy of
        the sandbox directory ``path``; nothing is written outside it."""
        loop = asyncio.get_running_loop()
        with tempfile.TemporaryFile() as f:
            stream = self._t.stream("CopyOut", {"sandboxId": self._sb.id, "path": path}, timeout=request_timeout)
            try:
                async for m in stream:
                    await loop.run_in_executor(None, f.write, b64decode(m.get("data")))
            finally:
                stream.close()
            f.seek(0)
            await loop.run_in_executor(None, extract, f, local, 1)

    async def read(self, path: str, *, offset: int = 0, limit: int = 0,
                   request_timeout: Optional[float] = None) -> bytes:
        """The file's bytes from offset (at most limit bytes; 0: to the end)."""
        req: Dict[str, Any] = {"sandboxId": self._sb.id, "path": path}
        if offset:
            req["offset"] = str(int(offset))
        if limit:
            req["limit"] = str(int(limit))
        msgs = await self._t.collect("ReadFile", req, idempotent=True, timeout=request_timeout)
        return b"".join(b64decode(m.get("data")) for m in msgs)

    async def read_text(self, path: str, *, encoding: str = "utf-8",
                        request_timeout: Optional[float] = None) -> str:
        """The whole file decoded (invalid bytes replaced)."""
        return (await self.read(path, request_timeout=request_timeout)).decode(encoding, "replace")

    async def list(self, path: str, *, request_timeout: Optional[float] = None) -> List[FileInfo]:
        """The entries of a directory, sorted by name."""
        resp = await self._t.unary("ListDir", {"sandboxId": self._sb.id, "path": path},
                                   idempotent=True, timeout=request_timeout)
        return [FileInfo._from_json(e) for e in resp.get("entries", [])]

    async def stat(self, path: str, *, request_timeout: Optional[float] = None) -> FileInfo:
        """Describe a file without following a final symlink."""
        resp = await self._t.unary("Stat", {"sandboxId": self._sb.id, "path": path},
                                   idempotent=True, timeout=request_timeout)
        return FileInfo._from_json(resp.get("info"))

    async def exists(self, path: str, *, request_timeout: Optional[float] = None) -> bool:
        """Whether path exists (a dangling symlink counts)."""
        try:
            await self.stat(path, request_timeout=request_timeout)
            return True
        except NotFoundError:
            return False

    async def remove(self, path: str, *, recursive: bool = False,
                     request_timeout: Optional[float] = None) -> None:
        """Remove a file or an empty directory, or a whole tree if recursive."""
        req: Dict[str, Any] = {"sandboxId": self._sb.id, "path": path}
        if recursive:
            req["recursive"] = True
        await self._t.unary("Remove", req, timeout=request_timeout)

    async def mkdir(self, path: str, *, parents: bool = False, mode: Optional[int] = None,
                    request_timeout: Optional[float] = None) -> None:
        """Create a directory (mode default 0o755), and its parents if asked."""
        req: Dict[str, Any] = {"sandboxId": self._sb.id, "path": path}
        if parents:
            req["parents"] = True
        if mode is not None:
            req["mode"] = int(mode)
        await self._t.unary("MakeDir", req, timeout=request_timeout)

