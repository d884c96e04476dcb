"""A minimal websocket client (RFC 6455) for the live view: the HTTP/1.1
upgrade on the client's own address (unix socket or TCP, TLS for https),
then binary messages as one byte stream, as the Go SDK's DialLiveView
gives. Standard library only; no extensions, no text messages sent."""

import asyncio
import base64
import hashlib
import os
import struct
from typing import Optional

from ._http import Address, Connection, ProtocolError
from .errors import CorralError, UnavailableError, error_from_code

__all__ = ["LiveViewConnection", "dial"]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_OP_CONT, _OP_TEXT, _OP_BINARY, _OP_CLOSE, _OP_PING, _OP_PONG = 0, 1, 2, 8, 9, 10
# RFB server messages are at most a framebuffer update; bound one frame.
_MAX_FRAME = 64 << 20

# The live-view handler's HTTP refusals, as the SDK's error codes.
_STATUS_CODES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found"}


def _mask(key: bytes, data: bytes) -> bytes:
    n = len(data)
    if not n:
        return b""
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(k, "big")).to_bytes(n, "big")


class LiveViewConnection:
    """The VNC (RFB) byte stream of a live view: read the server's
    ProtocolVersion first, as from any VNC server. ``read`` returns ``b""``
    once the sandbox's screen (or the server) closed the websocket."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._buf = b""
        self._eof = False
        self._wlock = asyncio.Lock()

    async def read(self, n: int = 65536) -> bytes:
        """Up to n bytes of the stream (b"" at its end)."""
        while not self._buf and not self._eof:
            await self._next_message()
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    async def readexactly(self, n: int) -> bytes:
        """Exactly n bytes; ProtocolError if the stream ends first."""
        out = b""
        while len(out) < n:
            piece = await self.read(n - len(out))
            if not piece:
                raise ProtocolError(f"live view closed after {len(out)} of {n} bytes")
            out += piece
        return out

    async def write(self, data: bytes) -> None:
        """Send data as one binary message."""
        await self._send(_OP_BINARY, bytes(data))

    async def close(self) -> None:
        """Send a close frame (if the stream is still open) and close the socket."""
        try:
            if not self._eof and not self._conn.writer.is_closing():
                await asyncio.wait_for(self._send(_OP_CLOSE, struct.pack(">H", 1000)), 5)
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            self._eof = True
            self._conn.close()

    async def __aenter__(self) -> "LiveViewConnection":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(self, op: int, payload: bytes) -> None:
        key = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack(">BB", 0x80 | op, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack(">BBH", 0x80 | op, 0x80 | 126, n)
        else:
            head = struct.pack(">BBQ", 0x80 | op, 0x80 | 127, n)
        async with self._wlock:
            self._conn.writer.write(head + key + _mask(key, payload))
            await self._conn.writer.drain()

    async def _next_message(self) -> None:
        r = self._conn.reader
        try:
            b0, b1 = await r.readexactly(2)
            n = b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack(">H", await r.readexactly(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", await r.readexactly(8))
            if n > _MAX_FRAME:
                raise ProtocolError(f"live view: a frame of {n} bytes (at most {_MAX_FRAME})")
            key = await r.readexactly(4) if b1 & 0x80 else b""
            payload = await r.readexactly(n)
        except asyncio.IncompleteReadError:
            self._eof = True
            return
        if key:
            payload = _mask(key, payload)
        op = b0 & 0x0F
        if op in (_OP_BINARY, _OP_CONT):
            self._buf += payload
        elif op == _OP_PING:
            await self._send(_OP_PONG, payload)
        elif op == _OP_CLOSE:
            try:
                await self._send(_OP_CLOSE, payload[:2])
            except OSError:
                pass
            self._eof = True
            self._conn.close()
        # Text and pong frames carry nothing of the stream.


async def dial(addr: Address, ssl: Optional[object], url_path: str, timeout: float) -> LiveViewConnection:
    """Upgrade a new connection to addr at url_path to a websocket."""
    try:
        conn = await asyncio.wait_for(Connection.open(addr, ssl), timeout)  # type: ignore[arg-type]
    except (OSError, asyncio.TimeoutError) as e:
        raise UnavailableError(f"live view: dial {addr.text}: {e}") from e
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        head = (f"GET {url_path} HTTP/1.1\r\nHost: {addr.host_header}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        conn.writer.write(head.encode("latin-1"))
        await conn.writer.drain()
        status, headers = await asyncio.wait_for(conn._read_head(), timeout)
        if status != 101:
            n = int(headers.get("content-length", "0") or 0)
            body = await asyncio.wait_for(conn.reader.read(min(n, 4096)), timeout) if n else b""
            text = body.decode("utf-8", "replace").strip()
            raise error_from_code(_STATUS_CODES.get(status, "unavailable"), f"live view: HTTP {status}: {text}")
        want = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
        if headers.get("sec-websocket-accept") != want or headers.get("upgrade", "").lower() != "websocket":
            raise ProtocolError("live view: the server's upgrade answer is not a websocket's")
    except CorralError:
        conn.close()
        raise
    except (OSError, ProtocolError, asyncio.TimeoutError) as e:
        conn.close()
        raise UnavailableError(f"live view: {e}") from e
    except BaseException:
        conn.close()
        raise
    return LiveViewConnection(conn)
