"""Live tests of projects, tokens, quotas and the audit log.

On the unix socket the client is the node administrator; on TCP it holds
an admin token of a project (scripts/test-python.sh makes one), so both
runs make a subproject with a quota of one sandbox and a member token for
it; on TCP that token is then used, exhausted and revoked.
"""

import uuid

import corral
from live import ADDR, IMAGE, LiveTest


class IAMTest(LiveTest):
    async def test_subproject_token_quota_and_audit(self) -> None:
        me = await self.c.whoami()
        if not me.node_admin:
            self.assertEqual(me.role, "admin", "the TCP run needs an admin token (CORRAL_TOKEN)")
            assert me.token is not None
            await self.check(me, me.project)
            return
        root = f"pytest-{uuid.uuid4().hex[:8]}"
        await self.c.create_project(root, corral.Quota(max_sandboxes=2))
        try:
            await self.check(me, root)
        finally:
            await self.c.delete_project(root)

    async def check(self, me: corral.Identity, root: str) -> None:
        sub = f"{root}/agent-{uuid.uuid4().hex[:6]}"
        p = await self.c.create_project(sub, corral.Quota(max_sandboxes=1, calls_per_sec=5))
        self.assertEqual((p.path, p.quota.max_sandboxes), (sub, 1))
        tok, secret = await self.c.create_token(sub, role="member", ttl=600, description="pytest")
        self.assertTrue(secret.startswith("corral_" + tok.id + "_"))
        self.assertIsNotNone(tok.expires_at)
        self.assertIn(tok.id, [t.id for t in await self.c.list_tokens(sub)])
        if me.node_admin:
            with self.assertRaises(corral.ResourceExhaustedError) as cm:
                await self.c.create_project(f"{root}/big", corral.Quota(max_sandboxes=5))
            self.assertIn(f"project {root}: quota max_sandboxes", cm.exception.message)
        entries = await self.c.audit(limit=100)
        self.assertTrue(any(e.procedure.endswith("/CreateToken") and tok.id in e.summary and e.result == "ok"
                            for e in entries), entries[-5:])
        async for e in self.c.follow_audit(limit=1, request_timeout=30):
            self.assertTrue(e.key and e.procedure)  # the latest entry comes first
            break
        if not me.node_admin:
            async with corral.AsyncClient(ADDR, token=secret) as agent:
                who = await agent.whoami()
                self.assertEqual((who.project, who.role), (sub, "member"))
                sb = await agent.create(image=IMAGE, memory_mb=64, labels=self.labels, idle_timeout=120)
                with self.assertRaises(corral.ResourceExhaustedError) as cm:
                    await agent.create(image=IMAGE, memory_mb=64, labels=self.labels, idle_timeout=120)
                self.assertIn(f"project {sub}: quota max_sandboxes: limit 1, in use 1", cm.exception.message)
                with self.assertRaises(corral.PermissionDeniedError):
                    await agent.create_project(f"{sub}/deeper")
                # The parent's admin sees the agent's sandbox.
                self.assertIn(sb.id, [s.id for s in await self.c.list(labels=self.labels)])
                await sb.delete()
            await self.c.revoke_token(tok.id)
            async with corral.AsyncClient(ADDR, token=secret) as agent:
                with self.assertRaises(corral.UnauthenticatedError):
                    await agent.list()
        await self.c.delete_project(sub)
        self.assertNotIn(sub, [q.path for q in await self.c.list_projects()])
