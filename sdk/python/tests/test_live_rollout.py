"""Idempotency keys and the exec log against a live server."""

import asyncio

from live import LiveTest, corral


class ExecLogTest(LiveTest):
    async def test_idempotent_commands_run_once(self) -> None:
        sb = await self.make()
        script = "echo x >> /tmp/once; wc -l < /tmp/once"
        first = await sb.run(script, idempotent=True)
        second = await sb.run("echo y >> /tmp/once", idempotent=True)
        self.assertEqual((first.exec_seq, first.replayed, second.exec_seq), (1, False, 2))
        # A restarted trainer: a new handle numbers its commands from 0 again.
        again = self.c.attach(sb.id)
        r1 = await again.run(script, idempotent=True)
        r2 = await again.run("echo y >> /tmp/once", idempotent=True)
        self.assertTrue(r1.replayed and r2.replayed)
        self.assertEqual((r1.exec_seq, r1.text), (1, first.text))
        self.assertEqual((await sb.run("cat /tmp/once")).text, "x\ny\n")
        log = await sb.list_execs()
        self.assertEqual([(e.seq, e.state, e.idempotency_key) for e in log],
                         [(1, "done", corral.exec_key(sb.id, "#0")), (2, "done", corral.exec_key(sb.id, "#1"))])
        self.assertEqual([e.seq for e in await sb.list_execs(1)], [2])
        with self.assertRaises(corral.InvalidArgumentError):
            await sb.run("echo other", step="#0", idempotency_key=corral.exec_key(sb.id, "#0"))

    async def test_reclaim_needs_a_swap_area(self) -> None:
        # scripts/test-python.sh starts its daemon without --swap.
        sb = await self.make()
        with self.assertRaises(corral.FailedPreconditionError) as cm:
            await sb.pause(reclaim=True)
        self.assertIn("--swap", str(cm.exception))
        self.assertEqual((await sb.refresh()).state, corral.State.RUNNING)

    async def test_pause_and_resume_a_job_by_label(self) -> None:
        job = {**self.labels, "job": "j"}
        members = await asyncio.gather(*(self.make(labels=job) for _ in range(3)))
        other = await self.make(labels={**self.labels, "job": "other"})
        with self.assertRaises(corral.InvalidArgumentError):
            await self.c.pause_many({})
        paused = await self.c.pause_many(job)
        self.assertEqual((paused.done, paused.failures, paused.node_failures), (3, {}, {}))
        self.assertEqual({(await s.refresh()).state for s in members}, {corral.State.PAUSED})
        self.assertEqual((await other.refresh()).state, corral.State.RUNNING)
        resumed = await self.c.resume_many(job)
        self.assertEqual((resumed.done, resumed.failures), (3, {}))
        self.assertEqual({(await s.refresh()).state for s in members}, {corral.State.RUNNING})
