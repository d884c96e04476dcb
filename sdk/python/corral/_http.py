"""A small HTTP/1.1 client on asyncio streams, with a keep-alive pool.

Only what the Connect protocol needs: POST requests with a known body,
responses framed by Content-Length, chunked transfer encoding or connection
close. One :class:`Pool` per server address keeps idle connections for reuse
and caps the connections open at once with a semaphore, so thousands of
concurrent calls from one event loop queue for a connection instead of
exhausting file descriptors.

A connection that saw an error, a cancellation or an unfinished body is
closed, never reused: closing it is also how a cancelled call tells the
server to stop (the server cancels the request's context on disconnect).
"""

import asyncio
import os
import ssl as _ssl
from collections import deque
from typing import AsyncIterator, Deque, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

__all__ = ["Address", "Connection", "Pool", "ProtocolError", "Response"]

_MAX_HEAD = 64 * 1024
_READ_CHUNK = 256 * 1024


class ProtocolError(Exception):
    """The server's bytes are not valid HTTP/1.1 (or the connection broke)."""


class Address:
    """Where a corral server listens: a unix socket or a TCP host and port.

    Accepted forms: ``unix:///path.sock``, ``/path.sock``, ``http://host:port``,
    ``https://host:port`` and ``host:port``.
    """

    def __init__(self, addr: str) -> None:
        if not addr:
            raise ValueError("corral: empty server address")
        self.text = addr
        self.unix_path: Optional[str] = None
        self.host = ""
        self.port = 0
        self.tls = False
        if addr.startswith("unix://"):
            self.unix_path = addr[len("unix://"):]
        elif addr.startswith("/"):
            self.unix_path = addr
        else:
            url = urlsplit(addr if "://" in addr else "http://" + addr)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(
                    f"corral: address {addr!r} is neither unix://PATH, http(s)://HOST:PORT nor HOST:PORT")
            self.tls = url.scheme == "https"
            self.host = url.hostname
            self.port = url.port or (443 if self.tls else 80)
            if url.path not in ("", "/"):
                raise ValueError(f"corral: address {addr!r} must not have a path")
        if self.unix_path is not None:
            if not self.unix_path:
                raise ValueError(f"corral: address {addr!r} has an empty socket path")
            self.host_header = "corral"
        else:
            self.host_header = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"Address({self.text!r})"


class Connection:
    """One HTTP/1.1 connection: send a request, then read its response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False

    @classmethod
    async def open(cls, addr: Address, ssl: Optional[_ssl.SSLContext]) -> "Connection":
        """Dial addr (a unix socket or TCP, with TLS for https)."""
        if addr.unix_path is not None:
            reader, writer = await asyncio.open_unix_connection(addr.unix_path, limit=_MAX_HEAD)
        else:
            ctx = None
            if addr.tls:
                ctx = ssl or _ssl.create_default_context()
            reader, writer = await asyncio.open_connection(addr.host, addr.port, ssl=ctx, limit=_MAX_HEAD)
        return cls(reader, writer)

    def usable(self) -> bool:
        """Whether an idle connection can take another request."""
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        """Close the socket now (synchronously; safe during cancellation)."""
        transport = self.writer.transport
        if transport is not None and not transport.is_closing():
            transport.abort()

    async def request(self, addr: Address, path: str, headers: Dict[str, str], body: bytes) -> "Response":
        """Send one POST request and read the response's status and headers."""
        lines = [f"POST {path} HTTP/1.1", f"Host: {addr.host_header}", f"Content-Length: {len(body)}"]
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if len(body) < 64 * 1024:
            self.writer.write(head + body)
        else:
            self.writer.writelines((head, body))
        await self.writer.drain()
        while True:
            status, resp_headers = await self._read_head()
            if status >= 200:
                return Response(self, status, resp_headers)
            # 1xx (e.g. 100 Continue): a final response follows.

    async def request_chunked(self, addr: Address, path: str, headers: Dict[str, str],
                              chunks: AsyncIterator[bytes]) -> "Response":
        """Send one POST request with a chunked body of unknown length (a
        client stream) and read the response's status and headers. A
        server that answers before reading everything (an error) is heard:
        sending stops at the first failed write."""
        lines = [f"POST {path} HTTP/1.1", f"Host: {addr.host_header}", "Transfer-Encoding: chunked"]
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        try:
            async for piece in chunks:
                if piece:
                    self.writer.writelines((b"%x\r\n" % len(piece), piece, b"\r\n"))
                    await self.writer.drain()
            self.writer.write(b"0\r\n\r\n")
            await self.writer.drain()
        except (ConnectionResetError, BrokenPipeError):
            pass  # the server answered early; its answer says why
        while True:
            status, resp_headers = await self._read_head()
            if status >= 200:
                return Response(self, status, resp_headers)

    async def _read_head(self) -> Tuple[int, Dict[str, str]]:
        try:
            raw = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                raise ProtocolError("server closed the connection before responding") from None
            raise ProtocolError("connection closed in the middle of a response head") from None
        except asyncio.LimitOverrunError:
            raise ProtocolError(f"response head larger than {_MAX_HEAD} bytes") from None
        lines = raw[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = headers[key] + ", " + value if key in headers else value
        if parts[0] == "HTTP/1.0" and "keep-alive" not in headers.get("connection", "").lower():
            headers["connection"] = "close"
        return int(parts[1]), headers


class Response:
    """A response whose body is read incrementally (any framing).

    ``complete`` turns true once the body has been read to its end; only
    then (and without ``Connection: close``) can the connection be reused.
    """

    def __init__(self, conn: Connection, status: int, headers: Dict[str, str]) -> None:
        self.conn = conn
        self.status = status
        self.headers = headers
        self._reader = conn.reader
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._remaining = -1  # bytes left (Content-Length or current chunk); -1: until EOF
        self.complete = False
        if not self._chunked and "content-length" in headers:
            try:
                self._remaining = int(headers["content-length"])
            except ValueError:
                raise ProtocolError(f"bad Content-Length {headers['content-length']!r}") from None
            self.complete = self._remaining == 0
        elif self._chunked:
            self._remaining = 0

    @property
    def keep_alive(self) -> bool:
        """Whether the connection may be reused after this response."""
        return self.complete and "close" not in self.headers.get("connection", "").lower()

    async def read(self, n: int = _READ_CHUNK) -> bytes:
        """Read up to n body bytes; b"" at the end of the body."""
        if self.complete or n <= 0:
            return b""
        if self._chunked:
            if self._remaining == 0 and not await self._next_chunk():
                return b""
            data = await self._readexactly(min(n, self._remaining))
            self._remaining -= len(data)
            if self._remaining == 0:
                if await self._readexactly(2) != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
            return data
        if self._remaining < 0:
            data = await self._reader.read(n)
            if not data:
                self.complete = True
            return data
        data = await self._readexactly(min(n, self._remaining))
        self._remaining -= len(data)
        self.complete = self._remaining == 0
        return data

    async def readexactly(self, n: int) -> bytes:
        """Read exactly n body bytes; fewer only if the body ends first."""
        first = await self.read(n)
        if len(first) == n or not first:
            return first
        parts: List[bytes] = [first]
        got = len(first)
        while got < n:
            data = await self.read(n - got)
            if not data:
                break
            parts.append(data)
            got += len(data)
        return b"".join(parts)

    async def read_all(self, limit: int = 512 << 20) -> bytes:
        """Read the rest of the body (at most limit bytes)."""
        if not self._chunked and self._remaining > 0:
            if self._remaining > limit:
                raise ProtocolError(f"response body of {self._remaining} bytes exceeds {limit}")
            return await self.readexactly(self._remaining)
        parts: Deque[bytes] = deque()
        size = 0
        while True:
            data = await self.read()
            if not data:
                return b"".join(parts)
            size += len(data)
            if size > limit:
                raise ProtocolError(f"response body exceeds {limit} bytes")
            parts.append(data)

    async def _next_chunk(self) -> bool:
        line = await self._readline()
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
        if size > 0:
            self._remaining = size
            return True
        while await self._readline():  # trailers, up to the empty line
            pass
        self.complete = True
        return False

    async def _readline(self) -> bytes:
        try:
            return (await self._reader.readuntil(b"\r\n"))[:-2]
        except asyncio.IncompleteReadError:
            raise ProtocolError("connection closed in the middle of a chunked body") from None
        except asyncio.LimitOverrunError:
            raise ProtocolError("chunk header too long") from None

    async def _readexactly(self, n: int) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise ProtocolError("connection closed in the middle of a response body") from None


class Pool:
    """Keep-alive connections to one address, at most ``max_connections`` open.

    ``acquire`` waits for a free slot, then reuses the most recently idle
    connection or dials a new one; ``release`` returns it (or closes it).
    Create and use a pool from one event loop only.
    """

    def __init__(self, addr: Address, max_connections: int, ssl: Optional[_ssl.SSLContext] = None) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.addr = addr
        self.max_connections = max_connections
        self._ssl = ssl
        self._idle: Deque[Connection] = deque()
        self._sem: Optional[asyncio.Semaphore] = None  # made on first use, in the loop
        self._closed = False
        self.opened = 0  # connections dialled so far (for tests and stats)

    async def acquire(self) -> Connection:
        """Wait for a slot and return a connection holding it."""
        if self._closed:
            raise ProtocolError("client is closed")
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.max_connections)
        await self._sem.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if conn.usable():
                    conn.reused = True
                    return conn
                conn.close()
            conn = await Connection.open(self.addr, self._ssl)
            self.opened += 1
            return conn
        except BaseException:
            self._sem.release()
            raise

    def release(self, conn: Connection, reuse: bool) -> None:
        """Give back a connection from acquire; it is closed unless reuse."""
        if reuse and not self._closed and conn.usable():
            self._idle.append(conn)
        else:
            conn.close()
        if self._sem is not None:
            self._sem.release()

    def close(self) -> None:
        """Close idle connections; connections in use close on release."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()


def default_address() -> str:
    """The address from $CORRAL_ADDR, else corral's default unix socket."""
    return os.environ.get("CORRAL_ADDR") or "unix:///var/lib/corral/corral.sock"
