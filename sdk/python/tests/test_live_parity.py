"""The calls the Python SDK shares with the Go SDK beyond sandboxes and
files: network policy, image builds, registry imports and blob-store pulls."""

import hashlib
import io
import os
import unittest

import corral
from live import ADDR, IMAGE, LiveTest


class NetworkTest(LiveTest):
    async def test_network_policy(self) -> None:
        sb = await self.make(network="none")
        self.assertEqual(sb.info.network, corral.Network("none"))
        self.assertEqual((await self.c.get(sb.id)).network.mode, "none")
        stats = await sb.network_stats()
        self.assertEqual((stats.refused_total, stats.refusals), (0, []))
        # A sandbox made without a network cannot get one later: the
        # server says how to make one that can.
        with self.assertRaises(corral.FailedPreconditionError) as cm:
            await sb.update_network(allow=["pypi"])
        self.assertIn("mode allowlist", cm.exception.message)
        with self.assertRaises(corral.InvalidArgumentError) as bad:
            await self.make(network={"allow": ["pypi", "*.org"]})
        self.assertIn("network.allow[1]", bad.exception.message)

    def test_sync_network(self) -> None:
        with corral.Client(ADDR) as c:
            with c.sandbox(IMAGE, memory_mb=64, labels=self.labels, network="none") as sb:
                self.assertEqual(sb.info.network.mode if sb.info else "", "none")
                self.assertEqual(sb.network_stats().refused_total, 0)


class StreamedStdinTest(LiveTest):
    async def test_run_streamed_stdin(self) -> None:
        # Above the 16 MiB a request may carry: streamed (RunStream).
        data = os.urandom(20 << 20)
        sb = await self.make(disk_mb=256)
        r = await sb.run("sha256sum", stdin=data)
        self.assertEqual((r.exit_code, r.text.split()[0]), (0, hashlib.sha256(data).hexdigest()))
        # A command that stops reading early still answers.
        r = await sb.run(["head", "-c", "7"], stdin=io.BytesIO(data))
        self.assertEqual((r.exit_code, r.stdout), (0, data[:7]))
        r = await sb.run(["wc", "-c"], stdin=io.BytesIO(b""))
        self.assertEqual(r.text.strip(), "0")


class ImageCallsTest(LiveTest):
    async def test_build_image(self) -> None:
        out: list = []
        if not ADDR.startswith("unix://"):
            # Builds are the node administrator's: a project token may not.
            with self.assertRaises(corral.PermissionDeniedError):
                await self.c.build_image("busybox", output=out.append)
            return
        img = await self.c.build_image("busybox", rebuild=True, output=out.append)
        self.assertEqual(img.name, "busybox")
        self.assertEqual([layer.ref for layer in img.layers], ["busybox@1"])
        self.assertTrue(any("applets" in line for line in out), out)
        with self.assertRaises(corral.NotFoundError):
            await self.c.build_image("no-such-recipe")
        sb = await self.make()
        self.assertEqual((await sb.run(["true"])).exit_code, 0)

    async def test_import_and_pull_errors(self) -> None:
        # No registry listens there: the server's error comes back typed.
        with self.assertRaises(corral.CorralError) as cm:
            await self.c.import_image("127.0.0.1:9/none:1", "pyimport@1", insecure=True)
        self.assertIn("127.0.0.1:9", cm.exception.message)
        with self.assertRaises(corral.FailedPreconditionError) as pull:
            await self.c.pull_layer("sha256:" + "0" * 64, "pulled@1")
        self.assertIn("blob store", pull.exception.message)


if __name__ == "__main__":
    unittest.main()
