"""The blocking client: :class:`Client` runs an :class:`AsyncClient` on a
private event loop in a daemon thread, so it works from plain scripts, from
many threads at once and from inside code that already runs a loop (e.g.
Jupyter). Methods take the same arguments as their async counterparts.

Interrupting a blocking call (Ctrl-C) cancels it on the loop, which closes
its connection and makes the server stop the command.
"""

import asyncio
import threading
from typing import Any, Awaitable, Dict, Iterator, List, Optional, TypeVar

from .client import AsyncClient
from .fncall import CallResult
from .iam import AuditEntry, Identity, Project, Quota, Token
from .images import Composition, Images, Layer, Packed, Removed
from .observe import Event, SandboxStats
from .sandbox import AsyncFiles, AsyncSandbox, Command, ExecStream
from .types import ExecChunk, ExecResult, FileInfo, SandboxInfo

__all__ = ["Client", "Sandbox", "Files", "SyncExecStream"]

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

    def create(self, image: str = "", **create_args: Any) -> "Sandbox":
        """Create a sandbox; arguments as :meth:`AsyncClient.create`."""
        return Sandbox(self, self._run(self._async.create(image, **create_args)))

    def sandbox(self, image: str = "", **create_args: Any) -> "Sandbox":
        """``with c.sandbox(image=...) as sb:`` creates a sandbox and deletes
        it on exit (also on an exception)."""
        return self.create(image, **create_args)

    def call(self, source: Optional[str] = None, **kw: Any) -> CallResult:
        """Run one stateless call (see :meth:`AsyncClient.call`)."""
        return self._run(self._async.call(source, **kw))

    def call_batch(self, calls: List[Dict[str, Any]], **kw: Any) -> List[CallResult]:
        """Run many calls in one request (see :meth:`AsyncClient.call_batch`)."""
        return self._run(self._async.call_batch(calls, **kw))

    def attach(self, sandbox_id: str) -> "Sandbox":
        """A handle on an existing sandbox, without a call."""
        return Sandbox(self, self._async.attach(sandbox_id))

    def get(self, sandbox_id: str, **kw: Any) -> SandboxInfo:
        """Describe a sandbox; see :meth:`AsyncClient.get`."""
        return self._run(self._async.get(sandbox_id, **kw))

    def list(self, **filters: Any) -> List[SandboxInfo]:
        """Sandboxes by labels / state, all pages; see :meth:`AsyncClient.list`."""
        return self._run(self._async.list(**filters))

    def delete(self, sandbox_id: str, **kw: Any) -> bool:
        """Delete a sandbox; False if it did not exist."""
        return self._run(self._async.delete(sandbox_id, **kw))

    def stats(self, ids: Optional[List[str]] = None, **kw: Any) -> List[SandboxStats]:
        """See :meth:`AsyncClient.stats`."""
        return self._run(self._async.stats(ids, **kw))

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

    def list_images(self, **kw: Any) -> Images:
        """The node's built images, compositions and layers."""
        return self._run(self._async.list_images(**kw))

    def create_layer(self, path: str, name: str, **kw: Any) -> Layer:
        """Build a layer from a directory or tar file on this machine, streamed."""
        return self._run(self._async.create_layer(path, name, **kw))

    def create_layer_from_node(self, path: str, name: str, **kw: Any) -> Layer:
        """Build a layer from a path on the server's machine (node administrator only)."""
        return self._run(self._async.create_layer_from_node(path, name, **kw))

    def upload_image(self, source: str, name: str, **kw: Any) -> Composition:
        """Import an OCI layout or docker archive from this machine (see :meth:`AsyncClient.upload_image`)."""
        return self._run(self._async.upload_image(source, name, **kw))

    def create_composition(self, ref: str, layers: List[str], **kw: Any) -> Composition:
        """Record a composition (see :meth:`AsyncClient.create_composition`)."""
        return self._run(self._async.create_composition(ref, layers, **kw))

    def remove_image(self, name: str, **kw: Any) -> Removed:
        """Remove an image, composition or layer (see :meth:`AsyncClient.remove_image`)."""
        return self._run(self._async.remove_image(name, **kw))

    def collect_garbage(self, **kw: Any) -> Removed:
        """Remove every layer nothing uses (see :meth:`AsyncClient.collect_garbage`)."""
        return self._run(self._async.collect_garbage(**kw))

    def whoami(self, **kw: Any) -> Identity:
        """Who the server takes the caller for (see :meth:`AsyncClient.whoami`)."""
        return self._run(self._async.whoami(**kw))

    def create_token(self, project: str, **kw: Any) -> "tuple[Token, str]":
        """Make a token; returns (token, secret) (see :meth:`AsyncClient.create_token`)."""
        return self._run(self._async.create_token(project, **kw))

    def list_tokens(self, project: str = "", **kw: Any) -> List[Token]:
        """The tokens the caller administers."""
        return self._run(self._async.list_tokens(project, **kw))

    def revoke_token(self, token_id: str, **kw: Any) -> None:
        """Revoke a token."""
        return self._run(self._async.revoke_token(token_id, **kw))

    def create_project(self, path: str, quota: Optional[Quota] = None, **kw: Any) -> Project:
        """Make a (sub)project (see :meth:`AsyncClient.create_project`)."""
        return self._run(self._async.create_project(path, quota, **kw))

    def list_projects(self, **kw: Any) -> List[Project]:
        """The projects the caller sees."""
        return self._run(self._async.list_projects(**kw))

    def get_project(self, path: str, **kw: Any) -> Project:
        """One project with quota and usage."""
        return self._run(self._async.get_project(path, **kw))

    def set_quota(self, path: str, quota: Quota, **kw: Any) -> Project:
        """Replace a (sub)project's quota."""
        return self._run(self._async.set_quota(path, quota, **kw))

    def delete_project(self, path: str, **kw: Any) -> None:
        """Delete a project and what it holds (see :meth:`AsyncClient.delete_project`)."""
        return self._run(self._async.delete_project(path, **kw))

    def share_image(self, name: str, project: str, **kw: Any) -> None:
        """Share an image name with a project (see :meth:`AsyncClient.share_image`)."""
        return self._run(self._async.share_image(name, project, **kw))

    def audit(self, project: str = "", **kw: Any) -> List[AuditEntry]:
        """Audit entries, oldest first (see :meth:`AsyncClient.audit`)."""
        return self._run(self._async.audit(project, **kw))


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

    def refresh(self, **kw: Any) -> SandboxInfo:
        """Fetch the current description."""
        return self._c._run(self._a.refresh(**kw))

    def delete(self, **kw: Any) -> bool:
        """Delete the sandbox; False if it was already gone."""
        return self._c._run(self._a.delete(**kw))

    def pause(self, **kw: Any) -> None:
        """Freeze every process in the sandbox."""
        self._c._run(self._a.pause(**kw))

    def resume(self, **kw: Any) -> None:
        """Thaw a paused sandbox."""
        self._c._run(self._a.resume(**kw))

    def screenshot(self, **kw: Any) -> bytes:
        """The screen of a ``vm`` sandbox as PNG bytes (see AsyncSandbox.screenshot)."""
        return self._c._run(self._a.screenshot(**kw))

    def send_input(self, *events: Dict[str, Any], **kw: Any) -> None:
        """Keyboard and mouse events for a ``vm`` sandbox (see AsyncSandbox.send_input)."""
        self._c._run(self._a.send_input(*events, **kw))

    def pack(self, name: str, **kw: Any) -> Packed:
        """Pack the sandbox's writes as a layer (see :meth:`AsyncSandbox.pack`)."""
        return self._c._run(self._a.pack(name, **kw))

    def run(self, cmd: Command, **kw: Any) -> ExecResult:
        """Run a command; arguments as :meth:`AsyncSandbox.run`."""
        return self._c._run(self._a.run(cmd, **kw))

    def exec_stream(self, cmd: Command, **kw: Any) -> "SyncExecStream":
        """Run a command, iterating its output chunks then the result chunk."""
        return SyncExecStream(self._c, self._a.exec_stream(cmd, **kw))


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


class Files:
    """Blocking file operations in one sandbox; see :class:`AsyncFiles`."""

    def __init__(self, client: Client, inner: AsyncFiles) -> None:
        self._c = client
        self._a = inner

    def write(self, path: str, data: Any, **kw: Any) -> int:
        """Create, replace or append to a file; returns its size."""
        return self._c._run(self._a.write(path, data, **kw))

    def write_from(self, path: str, f: Any, **kw: Any) -> int:
        """Stream an open binary file into path (no size cap)."""
        return self._c._run(self._a.write_from(path, f, **kw))

    def upload_dir(self, local: str, dest: str, **kw: Any) -> int:
        """Copy a local directory tree into the sandbox (see :meth:`AsyncFiles.upload_dir`)."""
        return self._c._run(self._a.upload_dir(local, dest, **kw))

    def download_dir(self, path: str, local: str, **kw: Any) -> None:
        """Copy a sandbox directory tree to a local directory."""
        self._c._run(self._a.download_dir(path, local, **kw))

    def read(self, path: str, **kw: Any) -> bytes:
        """The file's bytes (offset= and limit= select a range)."""
        return self._c._run(self._a.read(path, **kw))

    def read_text(self, path: str, **kw: Any) -> str:
        """The file decoded as text."""
        return self._c._run(self._a.read_text(path, **kw))

    def list(self, path: str, **kw: Any) -> List[FileInfo]:
        """The entries of a directory."""
        return self._c._run(self._a.list(path, **kw))

    def stat(self, path: str, **kw: Any) -> FileInfo:
        """Describe a file."""
        return self._c._run(self._a.stat(path, **kw))

    def exists(self, path: str, **kw: Any) -> bool:
        """Whether path exists."""
        return self._c._run(self._a.exists(path, **kw))

    def remove(self, path: str, **kw: Any) -> None:
        """Remove a file or directory (recursive=True for a tree)."""
        self._c._run(self._a.remove(path, **kw))

    def mkdir(self, path: str, **kw: Any) -> None:
        """Create a directory (parents=True for missing parents)."""
        self._c._run(self._a.mkdir(path, **kw))

