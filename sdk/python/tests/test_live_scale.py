"""Cancellation, concurrency, the 500-sandbox rollout and the blocking
client, against a live server."""

import asyncio
import os
import threading

from live import ADDR, IMAGE, LABEL_KEY, RUN_ID, LiveTest, corral, needs_server

import unittest

ROLLOUT_EPISODES = int(os.environ.get("CORRAL_TEST_ROLLOUT_EPISODES", "500"))
ROLLOUT_CONCURRENCY = int(os.environ.get("CORRAL_TEST_ROLLOUT_CONCURRENCY", "32"))


class CancellationTest(LiveTest):
    async def test_cancel_run_kills_command(self) -> None:
        sb = await self.make()
        task = asyncio.ensure_future(sb.run("echo $$ > /tmp/pid; exec sleep 60"))
        pid = await self.started_pid(sb)
        self.assertTrue((await sb.run(["kill", "-0", pid])).ok)  # running
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertTrue(await self.wait_gone(sb, pid), "the command survived its cancelled run()")

    async def test_cancel_exec_stream_kills_command(self) -> None:
        sb = await self.make()
        first = asyncio.Event()

        async def consume() -> None:
            async for chunk in sb.exec_stream("echo $$ > /tmp/pid; echo go; exec sleep 60"):
                if chunk.stream == "stdout":
                    first.set()
        task = asyncio.ensure_future(consume())
        await first.wait()
        pid = await self.started_pid(sb)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertTrue(await self.wait_gone(sb, pid), "the command survived its cancelled exec_stream()")

    async def test_leaving_stream_early_kills_command(self) -> None:
        sb = await self.make()
        async with sb.exec_stream("echo $$ > /tmp/pid2; while true; do echo tick; sleep 0.1; done") as stream:
            async for chunk in stream:
                if chunk.stream == "stdout":
                    break
        self.assertTrue(await self.wait_gone(sb, await self.started_pid(sb, "/tmp/pid2")))


class ConcurrencyTest(LiveTest):
    async def test_1000_concurrent_runs_share_a_bounded_pool(self) -> None:
        c = corral.AsyncClient(ADDR, max_connections=64)
        try:
            sbs = await asyncio.gather(*(self.make() for _ in range(4)))
            fds_before = len(os.listdir("/proc/self/fd"))
            results = await asyncio.gather(*(
                c.attach(sbs[i % 4].id).run(["echo", str(i)]) for i in range(1000)))
            self.assertEqual([r.text for r in results], [f"{i}\n" for i in range(1000)])
            self.assertLessEqual(c._t.pool.opened, 64)
            self.assertLessEqual(len(os.listdir("/proc/self/fd")) - fds_before, 64)
        finally:
            await c.close()


class RolloutTest(LiveTest):
    async def test_rollout_500_sandboxes(self) -> None:
        """The README's RL rollout, ROLLOUT_EPISODES episodes at once (at
        most ROLLOUT_CONCURRENCY in flight): all finish, none is left."""
        from corral.bench import episode

        sem = asyncio.Semaphore(ROLLOUT_CONCURRENCY)

        async def one(i: int) -> bool:
            async with sem:
                return await episode(self.c, 1000 + i, self.labels, IMAGE)

        scores = await asyncio.gather(*(one(i) for i in range(ROLLOUT_EPISODES)), return_exceptions=True)
        errors = [s for s in scores if isinstance(s, BaseException)]
        self.assertEqual(errors, [], f"{len(errors)} of {ROLLOUT_EPISODES} episodes failed")
        self.assertEqual(scores, [True] * ROLLOUT_EPISODES)
        self.assertEqual(await self.c.list(labels=self.labels), [])
        self.assertEqual(await self.c.list(labels={LABEL_KEY: RUN_ID, "test": self.labels["test"]}), [])


@needs_server
class SyncClientTest(unittest.TestCase):
    def test_sync_client(self) -> None:
        labels = {LABEL_KEY: RUN_ID, "test": "sync"}
        with corral.Client(ADDR) as c:
            with c.sandbox(image=IMAGE, memory_mb=64, labels=labels) as sb:
                self.assertEqual(sb.run(["echo", "hi"]).text, "hi\n")
                self.assertEqual(sb.run("exit 2").exit_code, 2)
                sb.files.write("/tmp/x", b"data")
                self.assertEqual(sb.files.read("/tmp/x"), b"data")
                self.assertEqual([e.name for e in sb.files.list("/tmp")], ["x"])
                self.assertEqual(sb.files.stat("/tmp/x").size, 4)
                sb.files.mkdir("/tmp/y")
                sb.files.remove("/tmp/y")
                chunks = list(sb.exec_stream("echo a; echo b >&2"))
                self.assertEqual([c.stream for c in chunks][-1], "result")
                sb.pause()
                self.assertEqual(sb.refresh().state, corral.State.PAUSED)
                sb.resume()
                self.assertEqual(c.get(sb.id).id, sb.id)
                self.assertEqual(len(c.list(labels=labels)), 1)
                # From several threads at once.
                out: list = []
                threads = [threading.Thread(target=lambda i=i: out.append(sb.run(["echo", str(i)]).text))
                           for i in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                self.assertEqual(sorted(out), sorted(f"{i}\n" for i in range(8)))
            with self.assertRaises(corral.NotFoundError):
                c.get(sb.id)
            self.assertEqual(c.list(labels=labels), [])


if __name__ == "__main__":
    unittest.main()
