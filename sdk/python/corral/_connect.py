"""ConnectRPC's JSON protocol over the HTTP/1.1 pool in :mod:`corral._http`.

Unary calls POST ``application/json`` and get one JSON message back, or a
``{"code", "message"}`` error body with a non-200 status. Client-streaming
calls (uploads) send their envelopes as a chunked body and read the answer
as a stream of one message and the end. Server-streaming
calls POST one enveloped message as ``application/connect+json`` and read a
sequence of envelopes (1 flag byte, 4-byte big-endian length, JSON); the
last has flag 0x02 and holds ``{}`` or ``{"error": {...}}``.

Every call has a deadline (sent to the server as ``Connect-Timeout-Ms`` and
enforced here); idempotent calls are retried with backoff on
``unavailable``. A call that is cancelled or times out closes its
connection, which makes the server cancel the request.
"""

import asyncio
import json
import random
import ssl as _ssl
import struct
import sys
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, TypeVar

from ._http import Address, Connection, Pool, ProtocolError, Response
from .errors import CorralError, DeadlineExceededError, InternalError, UnavailableError
from .errors import error_from_code, error_from_http_status

__all__ = ["Transport", "ServerStream"]

_SERVICE = "/corral.v1.SandboxService/"


def _path(method: str) -> str:
    """The URL path of a method: SandboxService's by default, or a full
    ``/package.Service/Method`` path as given."""
    return method if method.startswith("/") else _SERVICE + method
_USER_AGENT = "corral-python/0.1"
_HAS_TIMEOUT_AT = sys.version_info >= (3, 11)
_END_STREAM = 0x02
_COMPRESSED = 0x01

T = TypeVar("T")


def _dumps(msg: Dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode("utf-8")


def _transport_error(method: str, addr: Address, exc: BaseException) -> UnavailableError:
    text = str(exc) or type(exc).__name__
    return UnavailableError(f"{method} on {addr.text}: {text}")


def _error_body(status: int, data: bytes) -> CorralError:
    """The exception for a non-200 Connect response."""
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        return error_from_code(body["code"], str(body.get("message", "")))
    return error_from_http_status(status, data)


async def _within(deadline: float, budget: float, method: str, aw: Awaitable[T]) -> T:
    """Await aw, cancelling it and raising DeadlineExceededError at deadline."""
    loop = asyncio.get_running_loop()
    remaining = deadline - loop.time()
    if remaining <= 0:
        if asyncio.iscoroutine(aw):
            aw.close()
        raise DeadlineExceededError(f"{method}: client deadline of {budget:g}s passed")
    try:
        if _HAS_TIMEOUT_AT:
            async with asyncio.timeout_at(deadline):  # type: ignore[attr-defined]
                return await aw
        return await asyncio.wait_for(aw, remaining)
    except CorralError:
        raise
    except asyncio.TimeoutError:
        raise DeadlineExceededError(f"{method}: client deadline of {budget:g}s passed") from None


class Transport:
    """Calls corral.v1.SandboxService methods on one server address.

    Args:
        addr: server address (see :class:`corral._http.Address`).
        max_connections: connections open at once; more calls wait.
        timeout: default deadline of a call, in seconds.
        retries: extra attempts of idempotent calls on ``unavailable``.
        ssl: TLS context for ``https://`` addresses (default: system CAs).
        token: bearer token sent on every call ("" sends none).
    """

    def __init__(self, addr: str, *, max_connections: int, timeout: float, retries: int,
                 ssl: Optional[_ssl.SSLContext] = None, token: str = "") -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.addr = Address(addr)
        self.pool = Pool(self.addr, max_connections, ssl)
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.token = token

    def budget(self, timeout: Optional[float]) -> float:
        """The deadline budget for a call: timeout, or the client default."""
        if timeout is None:
            return self.timeout
        if timeout <= 0:
            raise ValueError(f"request_timeout must be positive, got {timeout!r}")
        return float(timeout)

    def _headers(self, content_type: str, deadline: float) -> Dict[str, str]:
        ms = max(1, int((deadline - asyncio.get_running_loop().time()) * 1000))
        headers = {
            "Content-Type": content_type,
            "Connect-Protocol-Version": "1",
            "Connect-Timeout-Ms": str(min(ms, 9_999_999_999)),
            "User-Agent": _USER_AGENT,
        }
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        return headers

    async def _acquire(self, method: str) -> Connection:
        try:
            return await self.pool.acquire()
        except (OSError, ProtocolError) as e:
            raise _transport_error(method, self.addr, e) from e

    async def retrying(self, method: str, idempotent: bool, budget: float,
                       attempt: Callable[[float], Awaitable[T]]) -> T:
        """Run attempt(deadline) under the call's deadline, retrying
        idempotent calls on UnavailableError with jittered backoff."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        tries = 0
        while True:
            try:
                return await _within(deadline, budget, method, attempt(deadline))
            except UnavailableError:
                if not idempotent or tries >= self.retries:
                    raise
                delay = min(0.05 * (2 ** tries) * (1 + random.random()), 2.0)
                if loop.time() + delay >= deadline:
                    raise
                tries += 1
                await asyncio.sleep(delay)

    async def unary(self, method: str, msg: Dict[str, Any], *, idempotent: bool = False,
                    timeout: Optional[float] = None) -> Dict[str, Any]:
        """Call a unary method and return its response message."""
        body = _dumps(msg)
        return await self.retrying(method, idempotent, self.budget(timeout),
                                   lambda deadline: self._unary_once(method, body, deadline))

    async def _unary_once(self, method: str, body: bytes, deadline: float) -> Dict[str, Any]:
        conn = await self._acquire(method)
        reuse = False
        try:
            resp = await conn.request(self.addr, _path(method), self._headers("application/json", deadline), body)
            data = await resp.read_all()
            reuse = resp.keep_alive
        except (OSError, ProtocolError) as e:
            raise _transport_error(method, self.addr, e) from e
        finally:
            self.pool.release(conn, reuse)
        if resp.status != 200:
            raise _error_body(resp.status, data)
        try:
            out = json.loads(data) if data else {}
        except ValueError as e:
            raise InternalError(f"{method}: response is not JSON: {e}") from None
        if not isinstance(out, dict):
            raise InternalError(f"{method}: response is not a JSON object")
        return out

    def stream(self, method: str, msg: Dict[str, Any], *, timeout: Optional[float] = None) -> "ServerStream":
        """Start a server-streaming call; iterate the result for messages."""
        return ServerStream(self, method, _dumps(msg), self.budget(timeout))

    async def collect(self, method: str, msg: Dict[str, Any], *, idempotent: bool = False,
                      timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        """Run a server-streaming call to its end and return every message
        (retried as a whole when idempotent)."""
        body = _dumps(msg)

        async def once(deadline: float) -> List[Dict[str, Any]]:
            stream = ServerStream(self, method, body, 0.0, deadline=deadline)
            try:
                return [m async for m in stream]
            finally:
                stream.close()

        return await self.retrying(method, idempotent, self.budget(timeout), once)

    async def client_stream(self, method: str, messages: AsyncIterator[Dict[str, Any]], *,
                            timeout: Optional[float] = None) -> Dict[str, Any]:
        """Call a client-streaming method: send every message of messages
        (a chunked HTTP/1.1 body of envelopes), then return the one answer.
        Never retried: messages can be read only once."""
        budget = self.budget(timeout)
        deadline = asyncio.get_running_loop().time() + budget
        return await _within(deadline, budget, method, self._client_stream_once(method, messages, deadline))

    async def _client_stream_once(self, method: str, messages: AsyncIterator[Dict[str, Any]],
                                  deadline: float) -> Dict[str, Any]:
        async def envelopes() -> AsyncIterator[bytes]:
            async for m in messages:
                body = _dumps(m)
                yield struct.pack(">BI", 0, len(body)) + body

        conn = await self._acquire(method)
        reuse = False
        try:
            resp = await conn.request_chunked(self.addr, _path(method),
                                              self._headers("application/connect+json", deadline), envelopes())
            if resp.status != 200:
                raise _error_body(resp.status, await resp.read_all(limit=1 << 20))
            out: Optional[Dict[str, Any]] = None
            while True:
                head = await resp.readexactly(5)
                if len(head) < 5:
                    raise ProtocolError("stream ended without an end-of-stream message")
                flags, size = struct.unpack(">BI", head)
                data = await resp.readexactly(size)
                msg = json.loads(data) if data else {}
                if not flags & _END_STREAM:
                    out = msg
                    continue
                rest = await resp.read_all(limit=1 << 20)
                reuse = resp.keep_alive and not rest
                err = msg.get("error") if isinstance(msg, dict) else None
                if err:
                    raise error_from_code(str(err.get("code", "unknown")), str(err.get("message", "")))
                if out is None:
                    raise InternalError(f"{method}: the stream ended without an answer")
                return out
        except (OSError, ProtocolError) as e:
            raise _transport_error(method, self.addr, e) from e
        except ValueError as e:
            raise InternalError(f"{method}: stream message is not JSON: {e}") from None
        finally:
            self.pool.release(conn, reuse)

    def close(self) -> None:
        """Close idle connections; calls in flight keep theirs until done."""
        self.pool.close()


class ServerStream:
    """The messages of one server-streaming call, as an async iterator.

    Leaving early (``break``, an exception, cancellation, the deadline) or
    calling :meth:`aclose` closes the connection, which cancels the call on
    the server. Also usable as ``async with``.
    """

    def __init__(self, transport: Transport, method: str, body: bytes, budget: float,
                 deadline: Optional[float] = None) -> None:
        self._t = transport
        self._method = method
        self._body = body
        self._budget = budget
        self._deadline = deadline  # set on first use when None
        self._conn: Optional[Connection] = None
        self._resp: Optional[Response] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.done = False

    def __aiter__(self) -> "ServerStream":
        return self

    async def __aenter__(self) -> "ServerStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    async def __anext__(self) -> Dict[str, Any]:
        if self.done:
            raise StopAsyncIteration
        if self._deadline is None:
            self._deadline = asyncio.get_running_loop().time() + self._budget
        budget = self._budget or self._t.timeout
        try:
            msg = await _within(self._deadline, budget, self._method, self._next())
        except BaseException:
            self._release(False)
            raise
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def _start(self) -> Response:
        self._loop = asyncio.get_running_loop()
        self._conn = await self._t._acquire(self._method)
        assert self._deadline is not None
        headers = self._t._headers("application/connect+json", self._deadline)
        envelope = struct.pack(">BI", 0, len(self._body)) + self._body
        resp = await self._conn.request(self._t.addr, _path(self._method), headers, envelope)
        if resp.status != 200:
            data = await resp.read_all(limit=1 << 20)
            self._release(resp.keep_alive)
            raise _error_body(resp.status, data)
        return resp

    async def _next(self) -> Optional[Dict[str, Any]]:
        """The next message, or None after a clean end of stream."""
        try:
            if self._resp is None:
                self._resp = await self._start()
            resp = self._resp
            head = await resp.readexactly(5)
            if len(head) < 5:
                raise ProtocolError("stream ended without an end-of-stream message")
            flags, size = struct.unpack(">BI", head)
            data = await resp.readexactly(size)
            if len(data) < size:
                raise ProtocolError("stream ended in the middle of a message")
        except (OSError, ProtocolError) as e:
            raise _transport_error(self._method, self._t.addr, e) from e
        if flags & _COMPRESSED:
            raise InternalError(f"{self._method}: server sent a compressed message (none was negotiated)")
        try:
            msg = json.loads(data) if data else {}
        except ValueError as e:
            raise InternalError(f"{self._method}: stream message is not JSON: {e}") from None
        if not flags & _END_STREAM:
            return msg
        try:
            rest = await resp.read_all(limit=1 << 20)  # the chunked terminator
        except (OSError, ProtocolError):
            rest = b"?"
        self._release(resp.keep_alive and not rest)
        err = msg.get("error") if isinstance(msg, dict) else None
        if err:
            raise error_from_code(str(err.get("code", "unknown")), str(err.get("message", "")))
        return None

    def _release(self, reuse: bool) -> None:
        self.done = True
        conn, self._conn = self._conn, None
        if conn is not None:
            self._t.pool.release(conn, reuse)

    def close(self) -> None:
        """Stop reading; the connection is closed unless the stream ended."""
        self._release(False)

    async def aclose(self) -> None:
        """Async spelling of :meth:`close`."""
        self.close()

    def __del__(self) -> None:
        # Abandoned mid-stream (e.g. `break` in `async for`): close the socket
        # now and give the slot back on the loop's thread.
        conn = self._conn
        if conn is None:
            return
        conn.close()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._release, False)
            except RuntimeError:
                pass
