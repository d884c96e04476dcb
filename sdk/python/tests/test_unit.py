"""Offline tests: JSON mapping helpers, error mapping, and the HTTP/Connect
transport against a tiny fake server (framing, keep-alive, retries)."""

import asyncio
import datetime as dt
import json
import os
import struct
import sys
import unittest
from typing import Callable, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import corral  # noqa: E402
from corral._http import Address  # noqa: E402
from corral.errors import error_from_code  # noqa: E402
from corral.types import b64decode, format_duration, parse_duration, parse_timestamp  # noqa: E402

Handler = Callable[[str, bytes], Tuple[int, List[Tuple[str, str]], List[bytes]]]


class FakeServer:
    """An HTTP/1.1 server answering each request with handler(path, body):
    (status, headers, body parts). A body of several parts is sent chunked."""

    def __init__(self, handler: Handler, close_after: bool = False) -> None:
        self.handler = handler
        self.close_after = close_after
        self.connections = 0
        self.requests: List[Tuple[str, dict]] = []
        self.writers: List[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def stop(self) -> None:
        self.server.close()
        for w in self.writers:
            w.close()
        await self.server.wait_closed()
        await asyncio.sleep(0.01)  # let the transports finish closing

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(w)
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await r.readexactly(int(headers.get("content-length", "0")))
                path = lines[0].split(" ")[1]
                self.requests.append((path, headers))
                status, hdrs, parts = self.handler(path, body)
                out = [f"HTTP/1.1 {status} X".encode()]
                out += [f"{k}: {v}".encode() for k, v in hdrs]
                if len(parts) == 1:
                    out.append(f"Content-Length: {len(parts[0])}".encode())
                    payload = parts[0]
                else:
                    out.append(b"Transfer-Encoding: chunked")
                    payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"
                if self.close_after:
                    out.append(b"Connection: close")
                w.write(b"\r\n".join(out) + b"\r\n\r\n" + payload)
                await w.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()
            try:
                await w.wait_closed()
            except ConnectionError:
                pass


def envelope(flags: int, msg: dict) -> bytes:
    data = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(data)) + data


class HelpersTest(unittest.TestCase):
    def test_durations(self) -> None:
        self.assertEqual(format_duration(1.5), "1.500000000s")
        self.assertEqual(format_duration(3), "3s")
        self.assertEqual(format_duration(0), "0s")
        self.assertAlmostEqual(parse_duration("0.103353410s"), 0.10335341)
        self.assertEqual(parse_duration("86400s"), 86400.0)
        self.assertEqual(parse_duration(None), 0.0)
        with self.assertRaises(ValueError):
            format_duration(-1)
        with self.assertRaises(TypeError):
            format_duration("1s")  # type: ignore[arg-type]

    def test_timestamps(self) -> None:
        t = parse_timestamp("2026-11-30T13:31:29.431507215Z")
        self.assertEqual(t, dt.datetime(2026, 11, 30, 13, 31, 29, 431507, tzinfo=dt.timezone.utc))
        t = parse_timestamp("2026-01-02T03:04:05+02:00")
        assert t is not None
        self.assertEqual(t.utcoffset(), dt.timedelta(hours=2))
        self.assertIsNone(parse_timestamp(""))

    def test_exec_key_matches_go_sdk(self) -> None:
        # client.ExecKey("n0a1b2c-00000001", "ep7/c2") in the Go SDK.
        self.assertEqual(corral.exec_key("n0a1b2c-00000001", "ep7/c2"), "step-922c7e2a348ffa65eb06ddc51e11f3e9")

    def test_base64(self) -> None:
        self.assertEqual(b64decode("aGkK"), b"hi\n")
        self.assertEqual(b64decode("_-8"), b"\xff\xef")
        self.assertEqual(b64decode(None), b"")

    def test_addresses(self) -> None:
        self.assertEqual(Address("unix:///a/b.sock").unix_path, "/a/b.sock")
        self.assertEqual(Address("/a/b.sock").unix_path, "/a/b.sock")
        a = Address("127.0.0.1:7070")
        self.assertEqual((a.host, a.port, a.tls), ("127.0.0.1", 7070, False))
        a = Address("https://corral.example")
        self.assertEqual((a.host, a.port, a.tls), ("corral.example", 443, True))
        for bad in ("", "ftp://x:1", "http://h:1/path", "unix://"):
            with self.assertRaises(ValueError, msg=bad):
                Address(bad)

    def test_error_classes(self) -> None:
        cases = {
            "not_found": corral.NotFoundError, "invalid_argument": corral.InvalidArgumentError,
            "failed_precondition": corral.FailedPreconditionError,
            "unavailable": corral.UnavailableError, "unimplemented": corral.UnimplementedError,
            "resource_exhausted": corral.ResourceExhaustedError,
            "deadline_exceeded": corral.DeadlineExceededError,
            "permission_denied": corral.PermissionDeniedError, "internal": corral.InternalError,
            "unknown": corral.InternalError, "already_exists": corral.AlreadyExistsError,
            "canceled": corral.CanceledError,
        }
        for code, cls in cases.items():
            e = error_from_code(code, "msg")
            self.assertIsInstance(e, cls)
            self.assertIsInstance(e, corral.CorralError)
            self.assertEqual(e.message, "msg")
        e = error_from_code("data_loss", "m")
        self.assertEqual((type(e), e.code, str(e)), (corral.CorralError, "data_loss", "data_loss: m"))
        self.assertIsInstance(error_from_code("deadline_exceeded", ""), TimeoutError)
        self.assertIsInstance(error_from_code("not_found", ""), LookupError)


class TransportTest(unittest.IsolatedAsyncioTestCase):
    async def serve(self, handler: Handler, close_after: bool = False) -> Tuple[FakeServer, corral.AsyncClient]:
        srv = FakeServer(handler, close_after)
        addr = await srv.start()
        c = corral.AsyncClient(addr, timeout=5, retries=2)
        self.addAsyncCleanup(srv.stop)
        self.addAsyncCleanup(c.close)
        return srv, c

    async def test_keep_alive_reuses_connections(self) -> None:
        info = {"sandbox": {"id": "n1-ab", "state": "SANDBOX_STATE_PAUSED", "resources": {"memoryBytes": "1048576"}}}
        srv, c = await self.serve(lambda p, b: (200, [("Content-Type", "application/json")], [json.dumps(info).encode()]))
        for _ in range(5):
            got = await c.get("n1-ab")
        self.assertEqual((got.state, got.resources.memory_mb), (corral.State.PAUSED, 1.0))
        self.assertEqual(srv.connections, 1)
        path, headers = srv.requests[0]
        self.assertEqual(path, "/corral.v1.SandboxService/Get")
        self.assertEqual(headers["content-type"], "application/json")
        self.assertEqual(headers["connect-protocol-version"], "1")
        self.assertTrue(0 < int(headers["connect-timeout-ms"]) <= 5000)

    async def test_token_is_sent_as_bearer(self) -> None:
        srv = FakeServer(lambda p, b: (200, [], [b'{"nodeAdmin":false,"project":"p","role":"viewer"}']))
        addr = await srv.start()
        self.addAsyncCleanup(srv.stop)
        c = corral.AsyncClient(addr, token="corral_0123456789ab_s3cret")
        self.addAsyncCleanup(c.close)
        me = await c.whoami()
        self.assertEqual((me.node_admin, me.project, me.role), (False, "p", "viewer"))
        path, headers = srv.requests[0]
        self.assertEqual(path, "/corral.v1.IAMService/WhoAmI")
        self.assertEqual(headers["authorization"], "Bearer corral_0123456789ab_s3cret")
        c2 = corral.AsyncClient(addr, token="")
        self.addAsyncCleanup(c2.close)
        await c2.whoami()
        self.assertNotIn("authorization", srv.requests[1][1])

    async def test_connection_close_is_honoured(self) -> None:
        srv, c = await self.serve(lambda p, b: (200, [], [b'{"existed":true}']), close_after=True)
        self.assertTrue(await c.delete("n1-ab"))
        self.assertTrue(await c.delete("n1-ab"))
        self.assertEqual(srv.connections, 2)

    async def test_error_body_and_plain_status(self) -> None:
        bodies = iter([(404, [], [b'{"code":"not_found","message":"sandbox n1-ab not found"}']),
                       (503, [], [b"upstream down"]), (503, [], [b"x"]), (503, [], [b"x"])])
        _, c = await self.serve(lambda p, b: next(bodies))
        with self.assertRaises(corral.NotFoundError) as cm:
            await c.get("n1-ab")
        self.assertEqual(cm.exception.message, "sandbox n1-ab not found")
        with self.assertRaises(corral.UnavailableError):  # retried twice, then raised
            await c.get("n1-ab")

    async def test_idempotent_calls_retry_others_do_not(self) -> None:
        calls = {"n": 0}

        def handler(path: str, body: bytes) -> Tuple[int, list, list]:
            calls["n"] += 1
            if calls["n"] % 2 == 1:
                return 503, [], [b'{"code":"unavailable","message":"busy"}']
            return 200, [], [b"{}"]
        _, c = await self.serve(handler)
        await c.list()  # fails once, retried
        self.assertEqual(calls["n"], 2)
        with self.assertRaises(corral.UnavailableError):
            await c.attach("n1-ab").pause()  # not idempotent: not retried
        self.assertEqual(calls["n"], 3)

    async def test_fork_failures_are_per_fork(self) -> None:
        resp = {"image": "", "processesCarried": True, "snapshotId": "snap-00000000000000aa",
                "forks": [{"sandbox": {"id": "n1-000000000001", "labels": {"corral.fork-of": "n1-ab"}}},
                          {"error": "quota: sandboxes 4 of 4 in use"}]}
        srv, c = await self.serve(lambda p, b: (200, [], [json.dumps(resp).encode()]))
        res = await c.attach("n1-ab").fork(2)
        self.assertEqual(srv.requests[0][0], "/corral.v1.RolloutService/Fork")
        self.assertEqual((res.processes_carried, res.snapshot, len(res.forks)), (True, "snap-00000000000000aa", 2))
        first, second = res.forks
        self.assertTrue(first.ok)
        self.assertEqual((first.sandbox.id, first.info.labels["corral.fork-of"]), ("n1-000000000001", "n1-ab"))
        self.assertIsNone(second.sandbox)
        self.assertIsInstance(second.error, corral.InternalError)
        self.assertIn("quota", second.error.message)
        self.assertEqual(res.failures, [second.error])
        with self.assertRaises(TypeError):
            await c.attach("n1-ab").fork("2")  # type: ignore[arg-type]

    async def test_snapshot_list_with_missing_nodes(self) -> None:
        resp = {"snapshots": [{"id": "snap-00000000000000aa", "sandboxId": "n1-ab", "backend": "microvm",
                               "bytes": "4096", "created": "2026-01-02T03:04:05Z"}],
                "nodeFailures": [{"nodeId": "n2", "error": "unreachable"}]}
        _, c = await self.serve(lambda p, b: (200, [], [json.dumps(resp).encode()]))
        with self.assertRaises(corral.UnavailableError) as cm:
            await c.list_snapshots()
        self.assertIn("n2: unreachable", cm.exception.message)
        snaps = cm.exception.snapshots  # type: ignore[attr-defined]
        self.assertEqual((snaps[0].id, snaps[0].bytes, snaps[0].created.year), ("snap-00000000000000aa", 4096, 2026))

    async def test_live_view_grant(self) -> None:
        resp = {"path": "/v1/liveview/n1-ab", "token": "t/k+1", "expiresUnix": "1767225600"}
        srv, c = await self.serve(lambda p, b: (200, [], [json.dumps(resp).encode()]))
        lv = await c.live_view("n1-ab", ttl=30)
        self.assertEqual(srv.requests[0][0], "/corral.v1.VMService/LiveView")
        self.assertEqual(lv.url_path, "/v1/liveview/n1-ab?token=t%2Fk%2B1")
        self.assertEqual(lv.url("http://h:1/"), "ws://h:1/v1/liveview/n1-ab?token=t%2Fk%2B1")
        self.assertEqual(lv.url("https://h:1"), "wss://h:1/v1/liveview/n1-ab?token=t%2Fk%2B1")
        self.assertEqual(lv.expires.year, 2026)
        with self.assertRaises(ValueError):
            lv.url("unix:///run/corral.sock")
        with self.assertRaises(ValueError):
            await c.live_view("n1-ab", ttl=-1)

    async def test_streaming_chunked_envelopes(self) -> None:
        msgs = [envelope(0, {"stdout": "aGkK"}), envelope(0, {"stderr": "ZQ=="}),
                envelope(0, {"result": {"exitCode": 3, "duration": "1.5s"}}), envelope(2, {})]
        # Split the envelopes across chunk boundaries at odd places.
        raw = b"".join(msgs)
        parts = [raw[:3], raw[3:17], raw[17:40], raw[40:]]
        srv, c = await self.serve(lambda p, b: (200, [("Content-Type", "application/connect+json")], parts))
        chunks = [ch async for ch in c.attach("n1-ab").exec_stream(["x"])]
        self.assertEqual([(ch.stream, ch.data) for ch in chunks[:2]], [("stdout", b"hi\n"), ("stderr", b"e")])
        res = chunks[2].result
        assert res is not None
        self.assertEqual((res.exit_code, res.duration), (3, 1.5))
        res2 = await c.attach("n1-ab").exec_stream("x").wait()
        self.assertEqual((res2.stdout, res2.stderr, res2.exit_code), (b"hi\n", b"e", 3))
        self.assertEqual(srv.connections, 1)  # the stream's connection was reused
        self.assertEqual(srv.requests[0][1]["content-type"], "application/connect+json")

    async def test_stream_end_error(self) -> None:
        parts = [envelope(0, {"data": "YWJj"}), envelope(2, {"error": {"code": "not_found", "message": "gone"}})]
        _, c = await self.serve(lambda p, b: (200, [], parts))
        with self.assertRaises(corral.NotFoundError):
            await c.attach("n1-ab").files.read("/x")

    async def test_stream_without_end(self) -> None:
        _, c = await self.serve(lambda p, b: (200, [], [envelope(0, {"stdout": "aGkK"}), b""]))
        with self.assertRaises(corral.UnavailableError):
            await c.attach("n1-ab").exec_stream("x").wait()

    async def test_refused_connection_is_unavailable(self) -> None:
        c = corral.AsyncClient("127.0.0.1:1", retries=1, timeout=5)
        with self.assertRaises(corral.UnavailableError):
            await c.get("n1-ab")
        await c.close()

    async def test_client_deadline(self) -> None:
        async def slow(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await asyncio.sleep(10)
        server = await asyncio.start_server(slow, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = corral.AsyncClient(f"127.0.0.1:{port}", timeout=0.3)
        try:
            with self.assertRaises(corral.DeadlineExceededError):
                await c.attach("n1-ab").pause()
            with self.assertRaises(TimeoutError):
                await c.attach("n1-ab").pause(request_timeout=0.2)
        finally:
            await c.close()
            server.close()

    def test_network_argument(self) -> None:
        from corral.network import network_json
        allow = {"mode": "NETWORK_MODE_ALLOWLIST", "allow": ["pypi", "example.org:443"]}
        self.assertIsNone(network_json(None))
        self.assertEqual(network_json("none"), {"mode": "NETWORK_MODE_NONE"})
        self.assertEqual(network_json("open"), {"mode": "NETWORK_MODE_OPEN"})
        self.assertEqual(network_json(["pypi", "example.org:443"]), allow)
        self.assertEqual(network_json({"allow": ["pypi", "example.org:443"]}), allow)
        self.assertEqual(network_json(corral.Network("allowlist", ["pypi", "example.org:443"])), allow)
        with self.assertRaises(ValueError):
            network_json("everything")
        with self.assertRaises(ValueError):
            network_json({"allowed": ["pypi"]})
        self.assertEqual(corral.Network._from_json({"mode": "NETWORK_MODE_OPEN"}), corral.Network("open"))


if __name__ == "__main__":
    unittest.main()


class LiveViewSocketTest(unittest.IsolatedAsyncioTestCase):
    """The live view's websocket client against a small RFC 6455 server."""

    async def ws_server(self, refuse: int = 0) -> Tuple[str, List[Tuple[int, bytes]]]:
        import base64
        import hashlib
        got: List[Tuple[int, bytes]] = []

        async def read_frame(r: asyncio.StreamReader) -> Tuple[int, bytes]:
            b0, b1 = await r.readexactly(2)
            self.assertTrue(b1 & 0x80, "client frames must be masked")
            n = b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack(">H", await r.readexactly(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", await r.readexactly(8))
            key = await r.readexactly(4)
            data = bytes(c ^ key[i % 4] for i, c in enumerate(await r.readexactly(n)))
            return b0 & 0x0F, data

        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                await serve1(r, w)
            except Exception as e:  # surfaces in the test's assertions
                got.append((-1, repr(e).encode()))
                w.close()

        async def serve1(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            head = (await r.readuntil(b"\r\n\r\n")).decode()
            got.append((0, head.split("\r\n")[0].encode()))
            if refuse:
                body = b"live view: permission denied: token refused"
                w.write(b"HTTP/1.1 %d Forbidden\r\nContent-Length: %d\r\n\r\n%s" % (refuse, len(body), body))
                await w.drain()
                w.close()
                return
            key = [ln.split(":", 1)[1].strip() for ln in head.split("\r\n") if ln.lower().startswith("sec-websocket-key")][0]
            acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
            w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    b"Sec-WebSocket-Accept: " + acc + b"\r\n\r\n")
            w.write(b"\x82\x0cRFB 003.008\n")  # one binary message
            w.write(b"\x89\x02hi")  # a ping the client must answer
            big = bytes(range(256)) * 300
            w.write(b"\x82\x7f" + struct.pack(">Q", len(big)) + big)
            await w.drain()
            while True:
                op, data = await read_frame(r)
                got.append((op, data))
                if op == 8:
                    w.write(b"\x88\x02\x03\xe8")
                    await w.drain()
                    w.close()
                    return

        srv = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.addAsyncCleanup(srv.wait_closed)
        self.addCleanup(srv.close)
        return "127.0.0.1:%d" % srv.sockets[0].getsockname()[1], got

    async def test_stream_over_websocket(self) -> None:
        addr, got = await self.ws_server()
        c = corral.AsyncClient(addr, timeout=5)
        self.addAsyncCleanup(c.close)
        lv = corral.LiveView(path="/v1/liveview/n1-ab", token="t k", expires=None)
        conn = await c.dial_live_view(lv)
        self.assertEqual(await conn.readexactly(12), b"RFB 003.008\n")
        await conn.write(b"RFB 003.008\n")
        big = await conn.readexactly(256 * 300)
        self.assertEqual(big[:3] + big[-1:], b"\x00\x01\x02\xff")
        await conn.write(b"x" * 70000)  # a frame with a 64-bit length
        await conn.write(b"y" * 300)  # and a 16-bit one
        await conn.close()
        self.assertEqual(got[0], (0, b"GET /v1/liveview/n1-ab?token=t%20k HTTP/1.1"))
        # The client's version, then the pong it sent on reading past the ping.
        self.assertEqual([op for op, _ in got[1:]], [2, 10, 2, 2, 8])
        self.assertEqual((got[1][1], got[2][1], len(got[3][1]), got[4][1]), (b"RFB 003.008\n", b"hi", 70000, b"y" * 300))

    async def test_refused_token(self) -> None:
        addr, _ = await self.ws_server(refuse=403)
        c = corral.AsyncClient(addr, timeout=5)
        self.addAsyncCleanup(c.close)
        with self.assertRaises(corral.PermissionDeniedError) as cm:
            await c.dial_live_view(corral.LiveView(path="/v1/liveview/n1-ab", token="x", expires=None))
        self.assertIn("token refused", cm.exception.message)
