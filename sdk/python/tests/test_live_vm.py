"""The vm backend's screen and input calls through the Python SDK.

A container sandbox has no screen: both calls raise UnimplementedError.
With ``CORRAL_TEST_VM_IMAGE`` set (a VM image on the server, e.g. debian@12)
one vm sandbox is booted: its screenshot is a PNG, and typed text reaches
its console, and its live view's websocket speaks VNC (minutes under TCG,
so it is opt-in).
"""

import asyncio
import os

from live import LiveTest

import corral

VM_IMAGE = os.environ.get("CORRAL_TEST_VM_IMAGE", "")


class TestVM(LiveTest):
    async def test_container_has_no_screen(self) -> None:
        sb = await self.make()
        with self.assertRaises(corral.UnimplementedError):
            await sb.screenshot()
        with self.assertRaises(corral.UnimplementedError):
            await sb.send_input({"text": "hi"})
        with self.assertRaises(corral.UnimplementedError):
            await self.c.live_view(sb.id)
        # A token the server never granted is refused at the websocket.
        forged = corral.LiveView(path="/v1/liveview/" + sb.id, token="x.y", expires=None)
        with self.assertRaises(corral.PermissionDeniedError):
            await self.c.dial_live_view(forged)

    async def test_vm_screen_and_input(self) -> None:
        if not VM_IMAGE:
            self.skipTest("CORRAL_TEST_VM_IMAGE is not set: no VM image to boot")
        # Under TCG a boot takes minutes.
        sb = await self.make(backend="vm", image=VM_IMAGE, memory_mb=512, request_timeout=600)
        png = await sb.screenshot(scale=0.5)
        self.assertTrue(png.startswith(b"\x89PNG\r\n\x1a\n"))
        lv = await self.c.live_view(sb.id, ttl=30)
        async with await self.c.dial_live_view(lv) as view:
            self.assertEqual((await view.readexactly(12))[:4], b"RFB ")  # the VNC server's ProtocolVersion
        with self.assertRaises(corral.PermissionDeniedError):  # one connection per grant
            await self.c.dial_live_view(lv)
        # Keys typed before the autologin shell runs on tty1 are flushed.
        for _ in range(60):
            if b"tty1" in (await sb.run("who")).stdout:
                break
            await asyncio.sleep(1)
        await sb.send_input({"text": "echo corral > /tmp/py"}, {"keys": "enter"})
        for _ in range(60):
            r = await sb.run("cat /tmp/py 2>/dev/null || true")
            if r.stdout == b"corral\n":
                break
            await asyncio.sleep(1)
        self.assertEqual(r.stdout, b"corral\n")
