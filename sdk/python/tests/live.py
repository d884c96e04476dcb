"""Shared setup of the tests that need a running corral server.

Set ``CORRAL_TEST_ADDR`` to the server's address (``unix:///…`` or
``127.0.0.1:PORT``); without it the live tests are skipped (and say so).
Every sandbox a test makes carries the label ``corral-pytest=<run id>`` and
a short idle timeout, and tearDown deletes whatever a test left.
"""

import asyncio
import os
import sys
import unittest
import uuid
from typing import Any, Dict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import corral  # noqa: E402

ADDR = os.environ.get("CORRAL_TEST_ADDR", "")
RUN_ID = os.environ.get("CORRAL_TEST_RUN_ID") or uuid.uuid4().hex[:10]
LABEL_KEY = "corral-pytest"
IMAGE = os.environ.get("CORRAL_TEST_IMAGE", "busybox")

needs_server = unittest.skipUnless(ADDR, "CORRAL_TEST_ADDR is not set: no live corral server to test against")


@needs_server
class LiveTest(unittest.IsolatedAsyncioTestCase):
    """Base class: ``self.c`` is an AsyncClient on ADDR; ``self.make()``
    creates a small labelled sandbox."""

    labels: Dict[str, str]

    async def asyncSetUp(self) -> None:
        self.c = corral.AsyncClient(ADDR, timeout=120)
        # A label per test, so list() assertions see only this test's sandboxes.
        self.labels = {LABEL_KEY: RUN_ID, "test": uuid.uuid4().hex[:8]}

    async def asyncTearDown(self) -> None:
        left = await self.c.list(labels=self.labels)
        await asyncio.gather(*(self.c.delete(s.id) for s in left))
        await self.c.close()

    async def make(self, **kw: Any) -> corral.AsyncSandbox:
        """Create a sandbox with test defaults (busybox, 64 MiB, labels)."""
        args: Dict[str, Any] = {"image": IMAGE, "memory_mb": 64, "labels": self.labels, "idle_timeout": 300}
        args.update(kw)
        return await self.c.create(**args)

    async def wait_gone(self, sb: corral.AsyncSandbox, pid: str, timeout: float = 15.0) -> bool:
        """Whether process pid disappears from the sandbox within timeout."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            if not (await sb.run(["kill", "-0", pid])).ok:
                return True
            await asyncio.sleep(0.1)
        return False

    async def started_pid(self, sb: corral.AsyncSandbox, path: str = "/tmp/pid") -> str:
        """Wait for a command to write its pid to path, and return it."""
        for _ in range(200):
            if await sb.files.exists(path):
                pid = (await sb.files.read(path)).decode().strip()
                if pid:
                    return pid
            await asyncio.sleep(0.05)
        self.fail(f"the command never wrote {path}")
