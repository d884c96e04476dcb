"""Live tests of fncall (AsyncClient.call / call_batch) against a server."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))

import corral  # noqa: E402
from live import ADDR, LiveTest  # noqa: E402


class FnCallTest(LiveTest):
    async def test_call_sh_verdicts(self) -> None:
        r = await self.c.call("echo hi; echo err >&2", language="sh")
        self.assertEqual((r.verdict, r.text, r.stderr), ("ok", "hi\n", b"err\n"))
        self.assertGreater(r.wall_time, 0)
        r = await self.c.call("exit 3", language="sh")
        self.assertEqual((r.verdict, r.exit_code), ("runtime_error", 3))
        r = await self.c.call("while :; do :; done", language="sh", timeout=0.3)
        self.assertEqual(r.verdict, "time_limit")
        r = await self.c.call("yes", language="sh", output_limit=1000)
        self.assertEqual(r.verdict, "output_limit")

    async def test_files_and_batch(self) -> None:
        r = await self.c.call("tr a-z A-Z < in > out", language="sh", files={"in": "abc"}, output_files=["out"])
        self.assertEqual(r.files, {"out": b"ABC"})
        rs = await self.c.call_batch([{"source": f"exit {i}", "language": "sh"} for i in range(5)])
        self.assertEqual([x.exit_code for x in rs], list(range(5)))

    async def test_bad_inputs(self) -> None:
        with self.assertRaises(corral.InvalidArgumentError) as cm:
            await self.c.call("x", language="cobol")
        self.assertIn("python, sh", str(cm.exception))
        with self.assertRaises(corral.InvalidArgumentError):
            await self.c.call("x" * (2 << 20), language="sh")


@unittest.skipUnless(ADDR, "CORRAL_TEST_ADDR is not set")
class SyncFnCallTest(unittest.TestCase):
    def test_sync_call(self) -> None:
        with corral.Client(ADDR) as c:
            r = c.call(args=["echo", "sync"])
            self.assertEqual(r.text, "sync\n")


if __name__ == "__main__":
    unittest.main()
