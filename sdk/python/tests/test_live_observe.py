"""Stats and the event stream against a live server."""

import asyncio

from live import LiveTest, corral


class ObserveTest(LiveTest):
    async def test_stats(self) -> None:
        sb = await self.make(memory_mb=64)
        await sb.run("head -c 8388608 /dev/zero > /dev/shm/fill")
        [st] = await self.c.stats([sb.id], history=True)
        self.assertEqual((st.id, st.backend, st.state), (sb.id, "container", "running"))
        self.assertEqual(st.memory_limit_bytes, 64 << 20)
        self.assertGreaterEqual(st.current.memory_bytes, 8 << 20)
        self.assertGreaterEqual(st.current.pids, 1)
        with self.assertRaises(corral.NotFoundError):
            await self.c.stats([sb.id.split("-")[0] + "-000000000000"])

    async def test_events_resume_from_seq(self) -> None:
        sb = await self.make()
        await sb.pause()
        await sb.resume()
        await sb.delete()

        async def read(since: int, n: int) -> list:
            out = []
            async for e in self.c.events(since=since, sandbox_ids=[sb.id]):
                out.append(e)
                if len(out) == n:
                    break
            return out

        # Replay everything kept for this sandbox, then from the middle.
        seen = await asyncio.wait_for(read(0, 5), 30)
        self.assertEqual([e.type for e in seen], ["created", "started", "paused", "resumed", "deleted"])
        self.assertTrue(all(e.sandbox_id == sb.id for e in seen))
        self.assertEqual(seen[0].figures["memory_limit_bytes"], 64 << 20)
        again = await asyncio.wait_for(read(seen[1].seq, 3), 30)
        self.assertEqual([e.seq for e in again], [e.seq for e in seen[2:]])
        with self.assertRaises(ValueError):
            self.c.events(types=["nosuch"])
