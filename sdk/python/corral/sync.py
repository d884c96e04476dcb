"""The blocking client: :class:`Client` runs an :class:`AsyncClient` on a
private event loop in a daemon thread, so it works from plain scripts, from
many threads at once and from inside code that already runs a loop (e.g.
Jupyter). Methods take the same arguments as their async counterparts.

Interrupting a blocking call (Ctrl-C) cancels it on the loop, which closes
its connection and makes the server stop the command.
"""

import asyncio
import threading
from typing import IO, Any, Awaitable, Callable, Dict, Iterator, List, Optional, TypeVar, Union

from .client import AsyncClient
from .fncall import CallResult
from .iam import AuditEntry, Identity, Project, Quota, Token
from .images import BuiltImage, Composition, Images, Imported, ImportProgress, Layer, Packed, Removed
from .network import Network, NetworkArg, NetworkStats
from .observe import Event, SandboxStats
from ._websocket import LiveViewConnection
from .rollout import ForkResult, LiveView, Snapshot
from .sandbox import AsyncFiles, AsyncSandbox, Command, ExecStream
from .types import BulkResult, ExecChunk, ExecLogEntry, ExecResult, FileInfo, SandboxInfo, State

__all__ = ["Client", "Sandbox", "Files", "SyncExecStream", "SyncLiveView"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="corral-client", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, aw: Awaitable[T]) -> T:
        """Run aw on the loop and block for its result."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("corral.Client called from its own loop thread; use AsyncClient there")

        async def wrap() -> T:
            return await aw

        fut = asyncio.run_coroutine_threadsafe(wrap(), self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()  # e.g. KeyboardInterrupt: cancel the call on the loop
            raise

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class Client:
    """Blocking corral client; arguments as :class:`AsyncClient`.

    Use ``with Client(addr) as c:`` or call :meth:`close`. Safe to share
    between threads.
    """

    def __init__(self, addr: Optional[str] = None, **options: Any) -> None:
        self._async = AsyncClient(addr, **options)
        self._lt = _LoopThread()
        self.addr = self._async.addr

    def __repr__(self) -> str:
        return f"Client({self.addr!r})"

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections and stop the client's thread."""
        if not self._lt.loop.is_closed():
            self._lt.run(self._async.close())
            self._lt.stop()

    def _run(self, aw: Awaitable[T]) -> T:
        return self._lt.run(aw)

    def create(self, image: str = "", *, backend: str = "", cpu: int = 0, memory_mb: float = 0,
               disk_mb: float = 0, pids: int = 0, env: Optional[Dict[str, str]] = None, workdir: str = "",
               user: str = "", labels: Optional[Dict[str, str]] = None, idle_timeout: Optional[float] = None,
               max_lifetime: Optional[float] = None, network: NetworkArg = None, fresh: bool = False,
               request_timeout: Optional[float] = None) -> "Sandbox":
        """Create a sandbox; arguments as :meth:`AsyncClient.create`."""
        return Sandbox(self, self._run(self._async.create(image, backend=backend, cpu=cpu,
                                                          memory_mb=memory_mb, disk_mb=disk_mb, pids=pids,
                                                          env=env, workdir=workdir, user=user, labels=labels,
                                                          idle_timeout=idle_timeout,
                                                          max_lifetime=max_lifetime, network=network,
                                                          fresh=fresh, request_timeout=request_timeout)))

    def sandbox(self, image: str = "", **create_args: Any) -> "Sandbox":
        """``with c.sandbox(image=...) as sb:`` creates a sandbox and deletes
        it on exit (also on an exception)."""
        return self.create(image, **create_args)

    def call(self, source: Optional[str] = None, **kw: Any) -> CallResult:
        """Run one stateless call (see :meth:`AsyncClient.call`)."""
        return self._run(self._async.call(source, **kw))

    def call_batch(self, calls: List[Dict[str, Any]], *,
                   request_timeout: Optional[float] = None) -> List[CallResult]:
        """Run many calls in one request (see :meth:`AsyncClient.call_batch`)."""
        return self._run(self._async.call_batch(calls, request_timeout=request_timeout))

    def attach(self, sandbox_id: str) -> "Sandbox":
        """A handle on an existing sandbox, without a call."""
        return Sandbox(self, self._async.attach(sandbox_id))

    def get(self, sandbox_id: str, *, request_timeout: Optional[float] = None) -> SandboxInfo:
        """Describe a sandbox; see :meth:`AsyncClient.get`."""
        return self._run(self._async.get(sandbox_id, request_timeout=request_timeout))

    def list(self, *, labels: Optional[Dict[str, str]] = None, state: Union[State, str, None] = None,
             page_size: int = 0, request_timeout: Optional[float] = None) -> List[SandboxInfo]:
        """Sandboxes by labels / state, all pages; see :meth:`AsyncClient.list`."""
        return self._run(self._async.list(labels=labels, state=state, page_size=page_size,
                                          request_timeout=request_timeout))

    def delete(self, sandbox_id: str, *, request_timeout: Optional[float] = None) -> bool:
        """Delete a sandbox; False if it did not exist."""
        return self._run(self._async.delete(sandbox_id, request_timeout=request_timeout))

    def stats(self, ids: Optional[List[str]] = None, *, history: bool = False,
              request_timeout: Optional[float] = None) -> List[SandboxStats]:
        """See :meth:`AsyncClient.stats`."""
        return self._run(self._async.stats(ids, history=history, request_timeout=request_timeout))

    def events(self, **kw: Any) -> Iterator[Event]:
        """Blocking iterator over :meth:`AsyncClient.events`; close it (or
        leave a ``for`` loop and drop it) to end the watch."""
        agen = self._async.events(**kw)
        try:
            while True:
                try:
                    yield self._run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._run(agen.aclose())

    def list_images(self, *, request_timeout: Optional[float] = None) -> Images:
        """The node's built images, compositions and layers."""
        return self._run(self._async.list_images(request_timeout=request_timeout))

    def create_layer(self, path: str, name: str, *, request_timeout: Optional[float] = None) -> Layer:
        """Build a layer from a directory or tar file on this machine, streamed."""
        return self._run(self._async.create_layer(path, name, request_timeout=request_timeout))

    def create_layer_from_node(self, path: str, name: str, *,
                               request_timeout: Optional[float] = None) -> Layer:
        """Build a layer from a path on the server's machine (node administrator only)."""
        return self._run(self._async.create_layer_from_node(path, name, request_timeout=request_timeout))

    def upload_image(self, source: str, name: str, *, request_timeout: Optional[float] = None) -> Composition:
        """Import an OCI layout or docker archive from this machine (see :meth:`AsyncClient.upload_image`)."""
        return self._run(self._async.upload_image(source, name, request_timeout=request_timeout))

    def create_composition(self, ref: str, layers: List[str], *, env: Optional[Dict[str, str]] = None,
                           request_timeout: Optional[float] = None) -> Composition:
        """Record a composition (see :meth:`AsyncClient.create_composition`)."""
        return self._run(self._async.create_composition(ref, layers, env=env,
                                                        request_timeout=request_timeout))

    def pause_many(self, labels: Dict[str, str], *, reclaim: bool = False,
                   request_timeout: Optional[float] = None) -> BulkResult:
        """Pause a whole job by its labels (see :meth:`AsyncClient.pause_many`)."""
        return self._run(self._async.pause_many(labels, reclaim=reclaim, request_timeout=request_timeout))

    def resume_many(self, labels: Dict[str, str], *, request_timeout: Optional[float] = None) -> BulkResult:
        """Resume a whole job by its labels (see :meth:`AsyncClient.resume_many`)."""
        return self._run(self._async.resume_many(labels, request_timeout=request_timeout))

    def restore(self, snapshot_id: str, *, labels: Optional[Dict[str, str]] = None,
                request_timeout: Optional[float] = None) -> "Sandbox":
        """A new sandbox from a snapshot (see :meth:`AsyncClient.restore`)."""
        return Sandbox(self, self._run(self._async.restore(snapshot_id, labels=labels,
                                                           request_timeout=request_timeout)))

    def list_snapshots(self, *, request_timeout: Optional[float] = None) -> List[Snapshot]:
        """The caller's snapshots, oldest first (see :meth:`AsyncClient.list_snapshots`)."""
        return self._run(self._async.list_snapshots(request_timeout=request_timeout))

    def delete_snapshot(self, snapshot_id: str, *, request_timeout: Optional[float] = None) -> None:
        """Remove a snapshot; sandboxes restored from it stay."""
        self._run(self._async.delete_snapshot(snapshot_id, request_timeout=request_timeout))

    def live_view(self, sandbox_id: str, *, ttl: float = 0, request_timeout: Optional[float] = None) -> LiveView:
        """A one-time live-view grant (see :meth:`AsyncClient.live_view`)."""
        return self._run(self._async.live_view(sandbox_id, ttl=ttl, request_timeout=request_timeout))

    def dial_live_view(self, lv: LiveView, *, timeout: Optional[float] = None) -> "SyncLiveView":
        """Open a live view's VNC stream (see :meth:`AsyncClient.dial_live_view`)."""
        return SyncLiveView(self, self._run(self._async.dial_live_view(lv, timeout=timeout)))

    def remove_image(self, name: str, *, request_timeout: Optional[float] = None) -> Removed:
        """Remove an image, composition or layer (see :meth:`AsyncClient.remove_image`)."""
        return self._run(self._async.remove_image(name, request_timeout=request_timeout))

    def collect_garbage(self, *, request_timeout: Optional[float] = None) -> Removed:
        """Remove every layer nothing uses (see :meth:`AsyncClient.collect_garbage`)."""
        return self._run(self._async.collect_garbage(request_timeout=request_timeout))

    def import_image(self, source: str, name: str, *, insecure: bool = False,
                     progress: Optional[Callable[[ImportProgress], None]] = None,
                     request_timeout: Optional[float] = None) -> Imported:
        """Have the server pull a registry image (see :meth:`AsyncClient.import_image`)."""
        return self._run(self._async.import_image(source, name, insecure=insecure, progress=progress,
                                                  request_timeout=request_timeout))

    def pull_layer(self, digest: str, name: str = "", *, request_timeout: Optional[float] = None) -> Layer:
        """Learn a layer from the shared blob store (see :meth:`AsyncClient.pull_layer`)."""
        return self._run(self._async.pull_layer(digest, name, request_timeout=request_timeout))

    def build_image(self, name: str, *, rebuild: bool = False, output: Optional[Callable[[str], None]] = None,
                    request_timeout: Optional[float] = 1800) -> BuiltImage:
        """Have the server build a built-in image (see :meth:`AsyncClient.build_image`)."""
        return self._run(self._async.build_image(name, rebuild=rebuild, output=output,
                                                 request_timeout=request_timeout))

    def whoami(self, *, request_timeout: Optional[float] = None) -> Identity:
        """Who the server takes the caller for (see :meth:`AsyncClient.whoami`)."""
        return self._run(self._async.whoami(request_timeout=request_timeout))

    def create_token(self, project: str, *, role: str = "member", ttl: float = 0, description: str = "",
                     request_timeout: Optional[float] = None) -> "tuple[Token, str]":
        """Make a token; returns (token, secret) (see :meth:`AsyncClient.create_token`)."""
        return self._run(self._async.create_token(project, role=role, ttl=ttl, description=description,
                                                  request_timeout=request_timeout))

    def list_tokens(self, project: str = "", *, request_timeout: Optional[float] = None) -> List[Token]:
        """The tokens the caller administers."""
        return self._run(self._async.list_tokens(project, request_timeout=request_timeout))

    def revoke_token(self, token_id: str, *, request_timeout: Optional[float] = None) -> None:
        """Revoke a token."""
        return self._run(self._async.revoke_token(token_id, request_timeout=request_timeout))

    def create_project(self, path: str, quota: Optional[Quota] = None, *,
                       request_timeout: Optional[float] = None) -> Project:
        """Make a (sub)project (see :meth:`AsyncClient.create_project`)."""
        return self._run(self._async.create_project(path, quota, request_timeout=request_timeout))

    def list_projects(self, *, request_timeout: Optional[float] = None) -> List[Project]:
        """The projects the caller sees."""
        return self._run(self._async.list_projects(request_timeout=request_timeout))

    def get_project(self, path: str, *, request_timeout: Optional[float] = None) -> Project:
        """One project with quota and usage."""
        return self._run(self._async.get_project(path, request_timeout=request_timeout))

    def set_quota(self, path: str, quota: Quota, *, request_timeout: Optional[float] = None) -> Project:
        """Replace a (sub)project's quota."""
        return self._run(self._async.set_quota(path, quota, request_timeout=request_timeout))

    def delete_project(self, path: str, *, keep: bool = False,
                       request_timeout: Optional[float] = None) -> None:
        """Delete a project and what it holds (see :meth:`AsyncClient.delete_project`)."""
        return self._run(self._async.delete_project(path, keep=keep, request_timeout=request_timeout))

    def share_image(self, name: str, project: str, *, unshare: bool = False,
                    request_timeout: Optional[float] = None) -> None:
        """Share an image name with a project (see :meth:`AsyncClient.share_image`)."""
        return self._run(self._async.share_image(name, project, unshare=unshare,
                                                 request_timeout=request_timeout))

    def audit(self, project: str = "", *, after: str = "", limit: int = 0,
              request_timeout: Optional[float] = None) -> List[AuditEntry]:
        """Audit entries, oldest first (see :meth:`AsyncClient.audit`)."""
        return self._run(self._async.audit(project, after=after, limit=limit,
                                           request_timeout=request_timeout))


class Sandbox:
    """Blocking handle on one sandbox; a context manager that deletes it."""

    def __init__(self, client: Client, inner: AsyncSandbox) -> None:
        self._c = client
        self._a = inner
        self.id = inner.id
        self.files = Files(client, inner.files)

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"

    @property
    def info(self) -> Optional[SandboxInfo]:
        """The description from create or the last :meth:`refresh`."""
        return self._a.info

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.delete()
        except Exception:
            if exc_type is None:
                raise

    def refresh(self, *, request_timeout: Optional[float] = None) -> SandboxInfo:
        """Fetch the current description."""
        return self._c._run(self._a.refresh(request_timeout=request_timeout))

    def delete(self, *, request_timeout: Optional[float] = None) -> bool:
        """Delete the sandbox; False if it was already gone."""
        return self._c._run(self._a.delete(request_timeout=request_timeout))

    def pause(self, *, reclaim: bool = False, request_timeout: Optional[float] = None) -> Dict[str, int]:
        """Freeze every process in the sandbox (``reclaim=True``: see :meth:`AsyncSandbox.pause`)."""
        return self._c._run(self._a.pause(reclaim=reclaim, request_timeout=request_timeout))

    def resume(self, *, request_timeout: Optional[float] = None) -> None:
        """Thaw a paused sandbox."""
        self._c._run(self._a.resume(request_timeout=request_timeout))

    def screenshot(self, **kw: Any) -> bytes:
        """The screen of a ``vm`` sandbox as PNG bytes (see AsyncSandbox.screenshot)."""
        return self._c._run(self._a.screenshot(**kw))

    def send_input(self, *events: Dict[str, Any], **kw: Any) -> None:
        """Keyboard and mouse events for a ``vm`` sandbox (see AsyncSandbox.send_input)."""
        self._c._run(self._a.send_input(*events, **kw))

    def pack(self, name: str, *, exclude: Optional[List[str]] = None, default_excludes: bool = True,
             composition: bool = True, request_timeout: Optional[float] = None) -> Packed:
        """Pack the sandbox's writes as a layer (see :meth:`AsyncSandbox.pack`)."""
        return self._c._run(self._a.pack(name, exclude=exclude, default_excludes=default_excludes,
                                         composition=composition, request_timeout=request_timeout))

    def update_network(self, *, mode: Optional[str] = None, allow: Optional[List[str]] = None,
                       deny: Optional[List[str]] = None, replace: bool = False,
                       request_timeout: Optional[float] = None) -> Network:
        """Change the network policy (see :meth:`AsyncSandbox.update_network`)."""
        return self._c._run(self._a.update_network(mode=mode, allow=allow, deny=deny, replace=replace,
                                                   request_timeout=request_timeout))

    def network_stats(self, *, request_timeout: Optional[float] = None) -> NetworkStats:
        """What the network policy refused (see :meth:`AsyncSandbox.network_stats`)."""
        return self._c._run(self._a.network_stats(request_timeout=request_timeout))

    def run(self, cmd: Command, *, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
            user: Optional[str] = None, stdin: Union[bytes, str, IO[bytes], None] = None,
            timeout: Optional[float] = None, output_limit: Optional[int] = None,
            request_timeout: Optional[float] = None, idempotent: bool = False,
            step: Optional[str] = None, idempotency_key: Optional[str] = None) -> ExecResult:
        """Run a command; arguments as :meth:`AsyncSandbox.run` (``idempotent``,
        ``step`` and ``idempotency_key`` included)."""
        return self._c._run(self._a.run(cmd, env=env, cwd=cwd, user=user, stdin=stdin, timeout=timeout,
                                        output_limit=output_limit, request_timeout=request_timeout,
                                        idempotent=idempotent, step=step, idempotency_key=idempotency_key))

    def exec_stream(self, cmd: Command, *, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
                    user: Optional[str] = None, stdin: Union[bytes, str, None] = None,
                    timeout: Optional[float] = None, output_limit: Optional[int] = None,
                    request_timeout: Optional[float] = None, idempotent: bool = False,
                    step: Optional[str] = None, idempotency_key: Optional[str] = None) -> "SyncExecStream":
        """Run a command, iterating its output chunks then the result chunk."""
        return SyncExecStream(self._c, self._a.exec_stream(cmd, env=env, cwd=cwd, user=user, stdin=stdin,
                                                           timeout=timeout, output_limit=output_limit,
                                                           request_timeout=request_timeout,
                                                           idempotent=idempotent, step=step,
                                                           idempotency_key=idempotency_key))

    def snapshot(self, *, request_timeout: Optional[float] = None) -> Snapshot:
        """Save the running sandbox's state (see :meth:`AsyncSandbox.snapshot`)."""
        return self._c._run(self._a.snapshot(request_timeout=request_timeout))

    def fork(self, count: int, *, request_timeout: Optional[float] = None) -> ForkResult:
        """Make count new sandboxes from this one (see :meth:`AsyncSandbox.fork`);
        the forks' handles are blocking :class:`Sandbox` objects."""
        res = self._c._run(self._a.fork(count, request_timeout=request_timeout))
        for f in res.forks:
            if f.sandbox is not None:
                f.sandbox = Sandbox(self._c, f.sandbox)
        return res

    def list_execs(self, since_seq: int = 0, **kw: Any) -> List[ExecLogEntry]:
        """The sandbox's exec log above since_seq (see :meth:`AsyncSandbox.list_execs`)."""
        return self._c._run(self._a.list_execs(since_seq, **kw))


class SyncExecStream:
    """Blocking iterator over :class:`ExecChunk` (see :class:`ExecStream`);
    a context manager that kills the command if left early."""

    def __init__(self, client: Client, inner: ExecStream) -> None:
        self._c = client
        self._a = inner

    @property
    def result(self) -> Optional[ExecResult]:
        """The result, once the stream has ended."""
        return self._a.result

    def __iter__(self) -> Iterator[ExecChunk]:
        return self

    def __next__(self) -> ExecChunk:
        try:
            return self._c._run(self._a.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def __enter__(self) -> "SyncExecStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading; the server kills the command if it still runs."""
        self._c._run(self._a.aclose())

    def wait(self) -> ExecResult:
        """Read to the end; the result then holds the collected output."""
        return self._c._run(self._a.wait())


class SyncLiveView:
    """Blocking :class:`corral._websocket.LiveViewConnection`; a context
    manager that closes it."""

    def __init__(self, client: Client, inner: LiveViewConnection) -> None:
        self._c = client
        self._a = inner

    def read(self, n: int = 65536) -> bytes:
        """Up to n bytes of the VNC stream (b"" at its end)."""
        return self._c._run(self._a.read(n))

    def readexactly(self, n: int) -> bytes:
        """Exactly n bytes of the VNC stream."""
        return self._c._run(self._a.readexactly(n))

    def write(self, data: bytes) -> None:
        """Send bytes to the VNC server."""
        self._c._run(self._a.write(data))

    def close(self) -> None:
        """Close the websocket."""
        self._c._run(self._a.close())

    def __enter__(self) -> "SyncLiveView":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Files:
    """Blocking file operations in one sandbox; see :class:`AsyncFiles`."""

    def __init__(self, client: Client, inner: AsyncFiles) -> None:
        self._c = client
        self._a = inner

    def write(self, path: str, data: Any, *, mode: Optional[int] = None, append: bool = False,
              make_parents: bool = True, request_timeout: Optional[float] = None) -> int:
        """Create, replace or append to a file; returns its size."""
        return self._c._run(self._a.write(path, data, mode=mode, append=append, make_parents=make_parents,
                                          request_timeout=request_timeout))

    def write_from(self, path: str, f: Any, *, mode: Optional[int] = None, make_parents: bool = True,
                   request_timeout: Optional[float] = None) -> int:
        """Stream an open binary file into path (no size cap)."""
        return self._c._run(self._a.write_from(path, f, mode=mode, make_parents=make_parents,
                                               request_timeout=request_timeout))

    def upload_dir(self, local: str, dest: str, *, request_timeout: Optional[float] = None) -> int:
        """Copy a local directory tree into the sandbox (see :meth:`AsyncFiles.upload_dir`)."""
        return self._c._run(self._a.upload_dir(local, dest, request_timeout=request_timeout))

    def download_dir(self, path: str, local: str, *, request_timeout: Optional[float] = None) -> None:
        """Copy a sandbox directory tree to a local directory."""
        self._c._run(self._a.download_dir(path, local, request_timeout=request_timeout))

    def read(self, path: str, *, offset: int = 0, limit: int = 0,
             request_timeout: Optional[float] = None) -> bytes:
        """The file's bytes (offset= and limit= select a range)."""
        return self._c._run(self._a.read(path, offset=offset, limit=limit, request_timeout=request_timeout))

    def read_text(self, path: str, *, encoding: str = "utf-8",
                  request_timeout: Optional[float] = None) -> str:
        """The file decoded as text."""
        return self._c._run(self._a.read_text(path, encoding=encoding, request_timeout=request_timeout))

    def list(self, path: str, *, request_timeout: Optional[float] = None) -> List[FileInfo]:
        """The entries of a directory."""
        return self._c._run(self._a.list(path, request_timeout=request_timeout))

    def stat(self, path: str, *, request_timeout: Optional[float] = None) -> FileInfo:
        """Describe a file."""
        return self._c._run(self._a.stat(path, request_timeout=request_timeout))

    def exists(self, path: str, *, request_timeout: Optional[float] = None) -> bool:
        """Whether path exists."""
        return self._c._run(self._a.exists(path, request_timeout=request_timeout))

    def remove(self, path: str, *, recursive: bool = False, request_timeout: Optional[float] = None) -> None:
        """Remove a file or directory (recursive=True for a tree)."""
        self._c._run(self._a.remove(path, recursive=recursive, request_timeout=request_timeout))

    def mkdir(self, path: str, *, parents: bool = False, mode: Optional[int] = None,
              request_timeout: Optional[float] = None) -> None:
        """Create a directory (parents=True for missing parents)."""
        self._c._run(self._a.mkdir(path, parents=parents, mode=mode, request_timeout=request_timeout))

