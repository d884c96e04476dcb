"""Snapshots, restore and fork through the Python SDK against a live server.

Container sandboxes: a snapshot is refused naming CRIU, a fork carries the
files (not the processes), and bad inputs raise the typed errors. With
``CORRAL_TEST_MICROVM=1`` one microVM is booted (minutes under TCG, so it
is opt-in) and serves snapshot, restore and fork × 2.
"""

import asyncio
import os

from live import LiveTest, corral

MICROVM = os.environ.get("CORRAL_TEST_MICROVM", "") not in ("", "0")

# The microVM's default image has its shell at /.corral/sh; mv keeps /tmp/count whole.
COUNTER = ("/.corral/sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/count; "
           "sleep 0.2; done' >/dev/null 2>&1 &")


class SnapshotTest(LiveTest):
    async def test_container_snapshot_names_criu(self) -> None:
        sb = await self.make()
        with self.assertRaises(corral.UnimplementedError) as cm:
            await sb.snapshot()
        self.assertIn("criu", cm.exception.message.lower())
        self.assertEqual((await sb.refresh()).state, corral.State.RUNNING)

    async def test_bad_inputs(self) -> None:
        sb = await self.make()
        for n in (0, 65):
            with self.assertRaises(corral.InvalidArgumentError) as cm:
                await sb.fork(n)
            self.assertIn("count", cm.exception.message)
        self.assertEqual(len(await self.c.list(labels=self.labels)), 1, "a refused fork made sandboxes")
        with self.assertRaises(corral.NotFoundError):
            await self.c.restore("snap-0000000000000000")
        with self.assertRaises(corral.InvalidArgumentError) as bad:
            await self.c.restore("../x")
        self.assertIn("snapshot_id", bad.exception.message)
        with self.assertRaises(corral.NotFoundError):
            await self.c.delete_snapshot("snap-0000000000000000")
        self.assertNotIn("snap-0000000000000000", [s.id for s in await self.c.list_snapshots()])
        # A container has no screen to view.
        with self.assertRaises(corral.UnimplementedError):
            await self.c.live_view(sb.id)

    async def test_container_fork_carries_files(self) -> None:
        parent = await self.make()
        await parent.run("mkdir -p /work; echo step-3 > /work/state")
        res = await parent.fork(2)
        self.assertFalse(res.processes_carried)
        self.assertTrue(res.image)
        self.assertEqual([f.error for f in res.forks], [None, None])
        for i, f in enumerate(res.forks):
            self.assertEqual(f.info.labels["corral.fork-of"], parent.id)
            self.assertEqual((await f.sandbox.run("cat /work/state")).text, "step-3\n")
            await f.sandbox.run(f"echo fork-{i} >> /work/state")
        self.assertEqual((await res.forks[1].sandbox.run("cat /work/state")).text, "step-3\nfork-1\n")
        self.assertEqual((await parent.run("cat /work/state")).text, "step-3\n")

    def test_blocking_client_fork(self) -> None:
        with corral.Client(self.c.addr, token=self.c._t.token) as c:
            parent = c.create(image="busybox", memory_mb=64, labels=self.labels, idle_timeout=300)
            first = parent.run("mkdir -p /work; echo x >> /work/x", idempotent=True)
            again = c.attach(parent.id).run("mkdir -p /work; echo x >> /work/x", idempotent=True)
            self.assertEqual((first.replayed, again.replayed, again.exec_seq), (False, True, first.exec_seq))
            res = parent.fork(1)
            fork = res.forks[0].sandbox
            self.assertIsInstance(fork, corral.Sandbox)
            self.assertEqual(fork.run("cat /work/x").text, "x\n")
            with self.assertRaises(corral.InvalidArgumentError):
                parent.fork(0)
            with self.assertRaises(corral.NotFoundError):
                c.restore("snap-0000000000000000")
            self.assertIsInstance(c.list_snapshots(), list)

    async def test_microvm_snapshot_restore_fork(self) -> None:
        if not MICROVM:
            self.skipTest("CORRAL_TEST_MICROVM is not set: booting a microVM takes minutes under TCG")
        sb = await self.make(backend="microvm", image="", memory_mb=256, request_timeout=600)
        await sb.run(COUNTER)
        for _ in range(100):
            if (await sb.run("test -s /tmp/count")).ok:
                break
            await asyncio.sleep(0.1)
        await sb.run("echo parent > /tmp/who")
        snap = await sb.snapshot(request_timeout=600)
        self.assertEqual((snap.sandbox_id, snap.backend), (sb.id, "microvm"))
        self.assertGreater(snap.bytes, 0)
        self.assertIn(snap.id, [s.id for s in await self.c.list_snapshots()])
        at = int((await sb.run("cat /tmp/count")).text)

        restored = await self.c.restore(snap.id, labels={"role": "restored"}, request_timeout=600)
        self.assertNotEqual(restored.id, sb.id)
        self.assertEqual((restored.info.labels["role"], restored.info.labels["corral.restored-from"]),
                         ("restored", snap.id))
        self.assertEqual((await restored.run("cat /tmp/who")).text, "parent\n")
        await self.assert_counting(restored, 1)

        res = await sb.fork(2, request_timeout=900)
        self.assertTrue(res.processes_carried)
        self.assertEqual([f.error for f in res.forks], [None, None])
        self.assertEqual(len({sb.id, restored.id} | {f.sandbox.id for f in res.forks}), 4)
        for f in res.forks:
            await self.assert_counting(f.sandbox, at)
        await self.assert_counting(sb, at)
        await self.c.delete_snapshot(snap.id)
        self.assertNotIn(snap.id, [s.id for s in await self.c.list_snapshots()])
        with self.assertRaises(corral.NotFoundError):
            await self.c.restore(snap.id)

    async def assert_counting(self, sb: corral.AsyncSandbox, at_least: int) -> None:
        """The sandbox's counter is at least at_least and still goes up."""
        first = int((await sb.run("cat /tmp/count")).text)
        self.assertGreaterEqual(first, at_least)
        for _ in range(100):
            await asyncio.sleep(0.2)
            if int((await sb.run("cat /tmp/count")).text) > first:
                return
        self.fail(f"{sb.id}: the counter stopped at {first}")
