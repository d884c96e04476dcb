"""The asyncio client: :class:`AsyncClient` creates, finds and deletes
sandboxes; commands and files go through the :class:`AsyncSandbox` it
returns."""

import asyncio
import os
import ssl as _ssl
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Set, Union

from ._connect import Transport
from ._http import default_address
from ._tar import file_messages, tar_tree
from .errors import InternalError, NotFoundError, UnavailableError
from .fncall import _BATCH, _CALL, CallResult, call_request
from .iam import IAMMixin
from .images import _SVC, BuiltImage, Composition, Images, Imported, ImportProgress, Layer, Removed
from .images import images_from_json
from .network import NetworkArg, network_json
from .observe import _SVC as _OBS, WATCH_TIMEOUT, Event, SandboxStats, event_from_json, stats_from_json
from .observe import watch_request
from ._websocket import LiveViewConnection, dial as _dial_ws
from .rollout import LiveView, Snapshot
from .sandbox import _ROLLOUT_SVC, _VM_SVC, AsyncSandbox
from .types import BulkResult, SandboxInfo, State, env_list, format_duration

__all__ = ["AsyncClient"]

_MIB = 1 << 20


class AsyncClient(IAMMixin):
    """A connection pool to one corral server, for one asyncio event loop.

    Args:
        addr: ``unix:///path.sock``, ``/path.sock``, ``http://host:port``,
            ``https://host:port`` or ``host:port``; default ``$CORRAL_ADDR``,
            else ``unix:///var/lib/corral/corral.sock``.
        timeout: default client deadline of each call, in seconds (commands
            get their own timeout on top, see :meth:`AsyncSandbox.run`).
        max_connections: connections open at once (default 256); further
            calls wait for a free one, so thousands of concurrent calls need
            no more file descriptors than this.
        retries: extra attempts for idempotent calls (get, list, delete, file
            read/stat/list) after a connection error or ``unavailable``.
        ssl: TLS context for ``https://`` addresses.
        token: the bearer token TCP calls need (default ``$CORRAL_TOKEN``;
            the node's unix socket ignores it: it is the node administrator).

    Use ``async with AsyncClient(...) as c:`` or call :meth:`close`.
    """

    def __init__(self, addr: Optional[str] = None, *, timeout: float = 120.0, max_connections: int = 256,
                 retries: int = 3, ssl: Optional[_ssl.SSLContext] = None, token: Optional[str] = None) -> None:
        self.addr = addr or default_address()
        if token is None:
            token = os.environ.get("CORRAL_TOKEN", "")
        self._t = Transport(self.addr, max_connections=max_connections, timeout=timeout,
                            retries=retries, ssl=ssl, token=token)
        self._background: Set["asyncio.Future[Any]"] = set()

    def __repr__(self) -> str:
        return f"AsyncClient({self.addr!r})"

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Wait for deletes started by ``sandbox()`` exits, then close idle
        connections."""
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        self._t.close()

    async def create(self, image: str = "", *, backend: str = "", cpu: int = 0, memory_mb: float = 0,
                     disk_mb: float = 0, pids: int = 0, env: Optional[Dict[str, str]] = None,
                     workdir: str = "", user: str = "", labels: Optional[Dict[str, str]] = None,
                     idle_timeout: Optional[float] = None, max_lifetime: Optional[float] = None,
                     network: NetworkArg = None, fresh: bool = False,
                     request_timeout: Optional[float] = None) -> AsyncSandbox:
        """Create a sandbox and return once it is ready for commands.

        Args:
            image: e.g. ``"busybox"`` or ``"debian"`` (default: the server's).
            backend: ``"container"`` (default); ``"fncall"``, ``"microvm"``,
                ``"vm"`` raise :class:`UnimplementedError` until they exist.
            cpu: millicores (1000 = one core); 0 takes the server default.
            memory_mb, disk_mb: limits in MiB; 0 takes the server default.
            pids: maximum processes and threads; 0 takes the server default.
            env: environment of every command.
            workdir, user: defaults of every command.
            labels: key/value labels to find the sandbox by (:meth:`list`).
            idle_timeout: stop after this many seconds without a request
                (None: server default; 0: never).
            max_lifetime: stop this many seconds after creation.
            network: what the sandbox may reach: None or ``"none"``
                (loopback only, the default), ``"open"``, a list of allow
                rules (``["pypi", "example.org:443"]``) or a
                :class:`Network`; see :mod:`corral.network`. A bad rule
                raises InvalidArgumentError naming it.
            fresh: a sandbox made from scratch and torn down by its delete:
                never one the server made ahead of demand or recycled from
                the project's deletes, and never recycled itself.
        """
        resources: Dict[str, str] = {}
        for key, value, scale in (("cpuMillis", cpu, 1), ("memoryBytes", memory_mb, _MIB),
                                  ("diskBytes", disk_mb, _MIB), ("pids", pids, 1)):
            if value:
                if value < 0:
                    raise ValueError(f"{key}: {value!r} must not be negative")
                resources[key] = str(int(value * scale))
        req: Dict[str, Any] = {}
        for key, val in (("image", image), ("backend", backend), ("workdir", workdir), ("user", user)):
            if val:
                req[key] = val
        if resources:
            req["resources"] = resources
        if env:
            req["env"] = env_list(env)
        if labels:
            req["labels"] = {str(k): str(v) for k, v in labels.items()}
        if idle_timeout is not None:
            req["idleTimeout"] = format_duration(idle_timeout, "idle_timeout")
        if max_lifetime is not None:
            req["maxLifetime"] = format_duration(max_lifetime, "max_lifetime")
        policy = network_json(network)
        if policy is not None:
            req["network"] = policy
        if fresh:
            req["fresh"] = True
        resp = await self._t.unary("Create", req, timeout=request_timeout)
        info = SandboxInfo._from_json(resp.get("sandbox") or {})
        return AsyncSandbox(self, info.id, info)

    async def call(self, source: Optional[str] = None, *, request_timeout: Optional[float] = None,
                   **call_args: Any) -> CallResult:
        """Run one stateless call in a warm pooled sandbox (fncall).

        ``await c.call("print(1)", language="python")``, or
        ``await c.call(args=["echo", "hi"])``. Keyword arguments: language
        (``"python"``, ``"sh"``), args, image, stdin, env, files (path ->
        content, relative to /tmp), output_files, timeout and cpu_timeout
        (seconds), memory_mb, output_limit (bytes). The result's ``verdict``
        says how the call ended; bad arguments raise InvalidArgumentError.
        """
        budget = request_timeout
        if budget is None:  # the call's own wall limit (server default 10 s) comes first
            budget = float(call_args.get("timeout") or 10) + self._t.timeout
        resp = await self._t.unary(_CALL, call_request(source, **call_args), timeout=budget)
        return CallResult._from_json(resp.get("result"))

    async def call_batch(self, calls: List[Dict[str, Any]], *,
                         request_timeout: Optional[float] = None) -> List[CallResult]:
        """Run many calls in one request (concurrently on the server);
        each item holds :meth:`call`'s arguments (``source`` included).
        Results come back in order."""
        reqs = [call_request(**dict(c)) for c in calls]
        budget = request_timeout
        if budget is None:  # as if the calls ran one after another
            budget = sum(float(c.get("timeout") or 10) for c in calls) + self._t.timeout
        resp = await self._t.unary(_BATCH, {"calls": reqs}, timeout=budget)
        return [CallResult._from_json(r) for r in resp.get("results") or []]

    def sandbox(self, image: str = "", **create_args: Any) -> "_SandboxContext":
        """``async with c.sandbox(image=..., ...) as sb:`` creates a sandbox
        (arguments of :meth:`create`) and always deletes it on exit, also on
        an exception or cancellation (the delete then finishes in the
        background and :meth:`close` waits for it)."""
        return _SandboxContext(self, image, create_args)

    async def list_images(self, *, request_timeout: Optional[float] = None) -> Images:
        """The node's built images, compositions and layers."""
        return images_from_json(await self._t.unary(_SVC + "ListImages", {}, idempotent=True, timeout=request_timeout))

    async def create_layer(self, path: str, name: str, *, request_timeout: Optional[float] = None) -> Layer:
        """Build the layer ``name`` (NAME@VERSION) from a directory or tar file
        at ``path`` on this machine, streamed to the server as a tar (the
        server reads no path of its own: see :meth:`create_layer_from_node`)."""
        f = await asyncio.get_running_loop().run_in_executor(None, tar_tree, path)
        d = await self._t.client_stream(_SVC + "UploadLayer", file_messages(f, {"name": name}, "data"),
                                        timeout=request_timeout)
        return Layer._from_json(d.get("layer", {}))

    async def create_layer_from_node(self, path: str, name: str, *,
                                     request_timeout: Optional[float] = None) -> Layer:
        """Build the layer ``name`` from a directory or tar file at ``path`` on
        the server's machine: only for the node administrator (root on the
        unix socket), and only under the server's ``--import-root``."""
        d = await self._t.unary(_SVC + "CreateLayer", {"path": path, "name": name}, timeout=request_timeout)
        return Layer._from_json(d.get("layer", {}))

    async def upload_image(self, source: str, name: str, *,
                           request_timeout: Optional[float] = None) -> Composition:
        """Import ``oci:DIR[:REF]`` (an OCI layout directory) or
        ``docker-archive:FILE[:REPO:TAG]`` (a ``docker save`` tarball) from
        this machine, streamed to the server, as the composition ``name``."""
        for prefix, fmt in (("oci:", "ARCHIVE_FORMAT_OCI_LAYOUT"), ("docker-archive:", "ARCHIVE_FORMAT_DOCKER_ARCHIVE")):
            if source.startswith(prefix):
                path, _, which = source[len(prefix):].partition(":")
                break
        else:
            raise ValueError(f"source {source!r} is neither oci:DIR nor docker-archive:FILE")
        f = await asyncio.get_running_loop().run_in_executor(None, tar_tree, path)
        first = {"format": fmt, "image": which, "name": name}
        d = await self._t.client_stream(_SVC + "UploadImage", file_messages(f, first, "data"), timeout=request_timeout)
        return Composition._from_json(d.get("composition", {}))

    async def import_image(self, source: str, name: str, *, insecure: bool = False,
                           progress: Optional[Callable[[ImportProgress], None]] = None,
                           request_timeout: Optional[float] = None) -> Imported:
        """Have the server pull the registry image ``source``
        (``host/repo:tag``) and record it as the composition ``name``
        (NAME@VERSION); ``progress`` is called as layers convert. For an
        OCI layout or ``docker save`` file on this machine use
        :meth:`upload_image`; ``insecure`` allows a registry over plain HTTP."""
        msg = {"source": source, "name": name, "insecure": insecure}
        stream = self._t.stream(_SVC + "ImportImage", msg, timeout=request_timeout)
        try:
            async for m in stream:
                if "progress" in m and progress is not None:
                    progress(ImportProgress._from_json(m["progress"]))
                elif "result" in m:
                    return Imported._from_json(m["result"])
        finally:
            stream.close()
        raise InternalError(f"import {source}: the stream ended without a result")

    async def pull_layer(self, digest: str, name: str = "", *,
                         request_timeout: Optional[float] = None) -> Layer:
        """Learn the layer ``digest`` another node published to the shared
        blob store, as ``name`` (NAME@VERSION; empty: the publisher's):
        only its metadata becomes local, file data is fetched on first
        read. FailedPreconditionError when the node has no blob store."""
        d = await self._t.unary(_SVC + "PullLayer", {"digest": digest, "name": name}, timeout=request_timeout)
        return Layer._from_json(d.get("layer", {}))

    async def build_image(self, name: str, *, rebuild: bool = False,
                          output: Optional[Callable[[str], None]] = None,
                          request_timeout: Optional[float] = 1800) -> BuiltImage:
        """Have the server build a built-in image (``"busybox"``,
        ``"debian"``) into its own store; ``output`` gets the build's output
        as it streams. Only the node administrator may (root on the unix
        socket); ``rebuild`` replaces an existing image no sandbox uses."""
        stream = self._t.stream(_SVC + "BuildImage", {"name": name, "rebuild": rebuild}, timeout=request_timeout)
        try:
            async for m in stream:
                if "output" in m and output is not None:
                    output(m["output"])
                elif "image" in m:
                    return BuiltImage._from_json(m["image"])
        finally:
            stream.close()
        raise InternalError(f"build {name}: the stream ended without a result")

    async def create_composition(self, ref: str, layers: List[str], *, env: Optional[Dict[str, str]] = None,
                                 request_timeout: Optional[float] = None) -> Composition:
        """Record the composition ``ref``: ``layers`` base first, each
        NAME@VERSION or NAME (its latest version)."""
        msg = {"composition": {"ref": ref, "layers": list(layers), "env": env_list(env)}}
        d = await self._t.unary(_SVC + "CreateComposition", msg, timeout=request_timeout)
        return Composition._from_json(d.get("composition", {}))

    async def pause_many(self, labels: Dict[str, str], *, reclaim: bool = False,
                         request_timeout: Optional[float] = None) -> BulkResult:
        """Pause every running sandbox of the caller's carrying all of
        ``labels`` (at least one: a whole job at once); with ``reclaim``
        push their memory out as ``AsyncSandbox.pause(reclaim=True)`` does.
        Failures are per sandbox (and, through a cluster's control plane,
        per node); see docs/rollouts.md."""
        d = await self._t.unary(_ROLLOUT_SVC + "PauseMany", {"labels": dict(labels), "reclaim": reclaim},
                                timeout=request_timeout)
        return BulkResult._from_json(d, "paused")

    async def resume_many(self, labels: Dict[str, str], *, request_timeout: Optional[float] = None) -> BulkResult:
        """Resume every paused sandbox of the caller's carrying all of ``labels``."""
        d = await self._t.unary(_ROLLOUT_SVC + "ResumeMany", {"labels": dict(labels)}, timeout=request_timeout)
        return BulkResult._from_json(d, "resumed")

    async def restore(self, snapshot_id: str, *, labels: Optional[Dict[str, str]] = None,
                      request_timeout: Optional[float] = None) -> AsyncSandbox:
        """Make a new sandbox from a snapshot, continuing its processes with
        a fresh identity (sandbox id, agent secret, hostname, addresses) in
        the snapshot's project; ``labels`` are laid over the source's."""
        msg: Dict[str, Any] = {"snapshotId": snapshot_id}
        if labels:
            msg["labels"] = {str(k): str(v) for k, v in labels.items()}
        d = await self._t.unary(_ROLLOUT_SVC + "Restore", msg, timeout=request_timeout)
        info = SandboxInfo._from_json(d.get("sandbox") or {})
        return AsyncSandbox(self, info.id, info)

    async def list_snapshots(self, *, request_timeout: Optional[float] = None) -> List[Snapshot]:
        """The snapshots the caller may see, oldest first. Through a cluster
        whose nodes did not all answer it raises :class:`UnavailableError`
        naming them, with the snapshots it got in its ``snapshots``."""
        d = await self._t.unary(_ROLLOUT_SVC + "ListSnapshots", {}, idempotent=True, timeout=request_timeout)
        out = [Snapshot._from_json(s) for s in d.get("snapshots", [])]
        failed = d.get("nodeFailures", [])
        if failed:
            why = "; ".join(f"{f.get('nodeId', '')}: {f.get('error', '')}" for f in failed)
            err = UnavailableError(f"snapshots of {len(failed)} node(s) missing: {why}")
            err.snapshots = out  # type: ignore[attr-defined]
            raise err
        return out

    async def delete_snapshot(self, snapshot_id: str, *, request_timeout: Optional[float] = None) -> None:
        """Remove a snapshot; sandboxes restored from it stay."""
        await self._t.unary(_ROLLOUT_SVC + "DeleteSnapshot", {"snapshotId": snapshot_id}, timeout=request_timeout)

    async def live_view(self, sandbox_id: str, *, ttl: float = 0,
                        request_timeout: Optional[float] = None) -> LiveView:
        """Grant a live view of a vm sandbox's screen, keyboard and mouse:
        a one-time token for one websocket connection (VNC/RFB) to
        ``LiveView.url(addr)`` on this server's TCP listener. ``ttl``
        seconds (0: a minute, at most an hour) bound how long the token
        waits for its connection."""
        if ttl < 0:
            raise ValueError(f"ttl: {ttl!r} must not be negative")
        msg = {"sandboxId": sandbox_id, "ttlSeconds": min(int(ttl), 2**31 - 1)}  # the server names the limit
        return LiveView._from_json(await self._t.unary(_VM_SVC + "LiveView", msg, timeout=request_timeout))

    async def dial_live_view(self, lv: LiveView, *, timeout: Optional[float] = None) -> LiveViewConnection:
        """Open the live view ``lv`` grants (using up its token) on this
        client's address, unix socket or TCP, and return the VNC (RFB) byte
        stream. A refused token raises :class:`PermissionDeniedError`."""
        return await _dial_ws(self._t.addr, self._t.pool._ssl, lv.url_path, self._t.budget(timeout))

    async def remove_image(self, name: str, *, request_timeout: Optional[float] = None) -> Removed:
        """Remove a built image, or a composition and/or layer NAME@VERSION.
        A layer in use raises :class:`FailedPreconditionError` naming its users."""
        d = await self._t.unary(_SVC + "RemoveImage", {"name": name}, timeout=request_timeout)
        return Removed._from_json(d.get("removed", {}))

    async def collect_garbage(self, *, request_timeout: Optional[float] = None) -> Removed:
        """Remove every layer no sandbox, composition or image uses (each
        name's latest version stays)."""
        d = await self._t.unary(_SVC + "CollectGarbage", {}, timeout=request_timeout)
        return Removed._from_json(d.get("removed", {}))

    async def stats(self, ids: Optional[List[str]] = None, *, history: bool = False,
                    request_timeout: Optional[float] = None) -> List[SandboxStats]:
        """CPU, memory, disk, PIDs and network figures of the sandboxes
        ``ids`` (every one when empty); ``history`` adds the sampled series."""
        msg: Dict[str, Any] = {"ids": list(ids or []), "history": history}
        return stats_from_json(await self._t.unary(_OBS + "Stats", msg, idempotent=True, timeout=request_timeout))

    def events(self, *, since: Optional[int] = None, project: str = "",
               labels: Optional[Dict[str, str]] = None, sandbox_ids: Optional[List[str]] = None,
               types: Optional[List[str]] = None, timeout: Optional[float] = None) -> AsyncIterator[Event]:
        """Iterate lifecycle events (``async for e in c.events(...)``). With
        ``since``, the kept events after that sequence number come first
        (also across daemon restarts), then live ones; without it, live ones
        only. Filters must all match; a bad one raises ValueError here.
        ``timeout`` ends the watch (default: practically never)."""
        return self._watch(watch_request(since, project, labels, sandbox_ids, types), timeout)

    async def _watch(self, req: Dict[str, Any], timeout: Optional[float]) -> AsyncIterator[Event]:
        stream = self._t.stream(_OBS + "WatchEvents", req, timeout=timeout or WATCH_TIMEOUT)
        try:
            async for m in stream:
                if m.get("event"):
                    yield event_from_json(m["event"])
        finally:
            stream.close()

    def attach(self, sandbox_id: str) -> AsyncSandbox:
        """A handle on an existing sandbox, without a call."""
        return AsyncSandbox(self, sandbox_id)

    async def get(self, sandbox_id: str, *, request_timeout: Optional[float] = None) -> SandboxInfo:
        """Describe a sandbox (NotFoundError if it does not exist)."""
        resp = await self._t.unary("Get", {"id": sandbox_id}, idempotent=True, timeout=request_timeout)
        return SandboxInfo._from_json(resp.get("sandbox") or {})

    async def list(self, *, labels: Optional[Dict[str, str]] = None, state: Union[State, str, None] = None,
                   page_size: int = 0, request_timeout: Optional[float] = None) -> List[SandboxInfo]:
        """Every sandbox carrying all of labels (and in state, if given),
        oldest first, fetching all pages."""
        req: Dict[str, Any] = {}
        if labels:
            req["labels"] = {str(k): str(v) for k, v in labels.items()}
        if state is not None:
            try:
                st = State(state.value if isinstance(state, State) else str(state).lower())
            except ValueError:
                raise ValueError(f"state: unknown state {state!r} (running, paused or stopped)") from None
            if st is not State.UNSPECIFIED:
                req["state"] = st.proto
        if page_size:
            req["pageSize"] = int(page_size)
        out: List[SandboxInfo] = []
        while True:
            resp = await self._t.unary("List", req, idempotent=True, timeout=request_timeout)
            out.extend(SandboxInfo._from_json(s) for s in resp.get("sandboxes", []))
            token = resp.get("nextPageToken")
            if not token:
                return out
            req["pageToken"] = token

    async def delete(self, sandbox_id: str, *, request_timeout: Optional[float] = None) -> bool:
        """Delete a sandbox; returns False if it did not exist (no error).

        With a project token the server answers NotFound for a sandbox that
        is gone or not the project's (not revealing which): False too."""
        try:
            resp = await self._t.unary("Delete", {"id": sandbox_id}, idempotent=True, timeout=request_timeout)
        except NotFoundError:
            return False
        return bool(resp.get("existed", False))

    async def _delete_shielded(self, sandbox_id: str) -> None:
        """Delete that completes even if the awaiting task is cancelled."""
        task = asyncio.ensure_future(self.delete(sandbox_id))
        self._background.add(task)
        task.add_done_callback(_forget(self._background))
        await asyncio.shield(task)


def _forget(tasks: Set["asyncio.Future[Any]"]) -> Any:
    def done(task: "asyncio.Future[Any]") -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failure surfaces through the awaiter
    return done


class _SandboxContext:
    """The async context manager returned by :meth:`AsyncClient.sandbox`."""

    def __init__(self, client: AsyncClient, image: str, create_args: Dict[str, Any]) -> None:
        self._c = client
        self._image = image
        self._args = create_args
        self._sb: Optional[AsyncSandbox] = None

    async def __aenter__(self) -> AsyncSandbox:
        self._sb = await self._c.create(self._image, **self._args)
        return self._sb

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._sb is None:
            return
        try:
            await self._c._delete_shielded(self._sb.id)
        except Exception:
            if exc_type is None:
                raise
            # The body's exception matters more; the delete's is dropped.
