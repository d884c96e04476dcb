"""Every call of the SDK against a live server, and its error mapping."""

import asyncio

from live import IMAGE, LiveTest, corral


class SandboxCallsTest(LiveTest):
    async def test_create_get_list_delete(self) -> None:
        sb = await self.make(cpu=500, memory_mb=64, disk_mb=256, pids=100, env={"FOO": "bar"},
                             workdir="/tmp", user="0:0", idle_timeout=120, max_lifetime=3600)
        info = sb.info
        assert info is not None
        self.assertEqual((info.image, info.backend, info.state), (IMAGE, "container", corral.State.RUNNING))
        self.assertEqual(info.resources, corral.Resources(cpu=500, memory_bytes=64 << 20,
                                                          disk_bytes=256 << 20, pids=100))
        self.assertEqual((info.env["FOO"], info.workdir, info.user), ("bar", "/tmp", "0:0"))
        self.assertEqual((info.idle_timeout, info.max_lifetime), (120.0, 3600.0))
        self.assertEqual(info.labels, self.labels)
        self.assertIsNotNone(info.created_at)
        got = await self.c.get(sb.id)
        self.assertEqual((got.id, got.node_id), (sb.id, info.node_id))
        r = await sb.run("echo $FOO; pwd; id -u")
        self.assertEqual(r.text.split(), ["bar", "/tmp", "0"])
        self.assertEqual([s.id for s in await self.c.list(labels=self.labels)], [sb.id])
        self.assertTrue(await sb.delete())
        self.assertFalse(await self.c.delete(sb.id))  # idempotent
        self.assertEqual(await self.c.list(labels=self.labels), [])
        with self.assertRaises(corral.NotFoundError):
            await self.c.get(sb.id)

    async def test_fresh_create(self) -> None:
        # The server takes the field by its wire name (an unknown one fails
        # the call) and makes the sandbox from scratch.
        sb = await self.make(fresh=True)
        self.assertEqual((await sb.run("echo fresh")).text, "fresh\n")
        self.assertTrue(await sb.delete())

    async def test_list_pages_and_state(self) -> None:
        sbs = await asyncio.gather(*(self.make() for _ in range(3)))
        listed = await self.c.list(labels=self.labels, page_size=1)
        self.assertEqual(sorted(s.id for s in listed), sorted(s.id for s in sbs))
        await sbs[0].pause()
        self.assertEqual([s.id for s in await self.c.list(labels=self.labels, state="paused")], [sbs[0].id])
        running = await self.c.list(labels=self.labels, state=corral.State.RUNNING)
        self.assertEqual(len(running), 2)
        with self.assertRaises(ValueError):
            await self.c.list(state="sleeping")

    async def test_pause_resume(self) -> None:
        sb = await self.make()
        await sb.pause()
        self.assertEqual((await sb.refresh()).state, corral.State.PAUSED)
        await sb.resume()
        self.assertEqual((await sb.refresh()).state, corral.State.RUNNING)
        await sb.pause()
        self.assertEqual((await sb.run("echo up")).text, "up\n")  # a command resumes it
        self.assertEqual((await sb.refresh()).state, corral.State.RUNNING)

    async def test_sandbox_context_always_deletes(self) -> None:
        async with self.c.sandbox(image=IMAGE, memory_mb=64, labels=self.labels) as sb:
            self.assertTrue((await sb.run(["true"])).ok)
        with self.assertRaises(corral.NotFoundError):
            await self.c.get(sb.id)
        with self.assertRaises(ZeroDivisionError):
            async with self.c.sandbox(image=IMAGE, memory_mb=64, labels=self.labels) as sb:
                1 / 0
        self.assertEqual(await self.c.list(labels=self.labels), [])

        started = asyncio.Event()

        async def body() -> None:
            async with self.c.sandbox(image=IMAGE, memory_mb=64, labels=self.labels) as sb:
                started.set()
                await sb.run(["sleep", "60"])
        task = asyncio.ensure_future(body())
        await started.wait()
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        await self.c.close()  # waits for the shielded delete
        self.c = corral.AsyncClient(self.c.addr)
        self.assertEqual(await self.c.list(labels=self.labels), [])


class RunTest(LiveTest):
    async def test_run_variants(self) -> None:
        sb = await self.make()
        r = await sb.run("echo out; echo err >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.ok), (b"out\n", b"err\n", 3, False))
        self.assertEqual((r.stdout_text, r.stderr_text), ("out\n", "err\n"))
        self.assertGreater(r.duration, 0)
        r = await sb.run(["sh", "-c", 'printf "%s|" "$@"', "x", "a b", "$HOME"])
        self.assertEqual(r.text, "a b|$HOME|")  # argv: no shell expansion
        r = await sb.run(["cat"], stdin=b"\x00\xffbinary")
        self.assertEqual(r.stdout, b"\x00\xffbinary")
        r = await sb.run("echo $A:$PWD", env={"A": "1"}, cwd="/etc")
        self.assertEqual(r.text, "1:/etc\n")
        self.assertEqual((await sb.run(["id", "-u"], user="65534")).text, "65534\n")

    async def test_limits_in_result(self) -> None:
        sb = await self.make()
        r = await sb.run(["sleep", "30"], timeout=0.5)
        self.assertTrue(r.timed_out)
        self.assertEqual((r.exit_code, r.signal), (-1, 9))
        r = await sb.run("kill -9 $$")
        self.assertEqual((r.exit_code, r.signal, r.timed_out), (-1, 9, False))
        r = await sb.run(["yes"], output_limit=1000)
        self.assertTrue(r.truncated)
        self.assertEqual(len(r.stdout), 1000)
        r = await sb.run("exec tail < /dev/zero", timeout=60)  # tail buffers: 64 MiB runs out
        self.assertTrue(r.oom_killed, r)

    async def test_exec_stream(self) -> None:
        sb = await self.make()
        chunks = [c async for c in sb.exec_stream("for i in 1 2 3; do echo $i; sleep 0.05; done; echo e >&2; exit 4")]
        self.assertEqual(b"".join(c.data for c in chunks if c.stream == "stdout"), b"1\n2\n3\n")
        self.assertEqual(b"".join(c.data for c in chunks if c.stream == "stderr"), b"e\n")
        self.assertEqual(chunks[-1].stream, "result")
        res = chunks[-1].result
        assert res is not None
        self.assertEqual(res.exit_code, 4)
        # Large output arrives in several messages.
        stream = sb.exec_stream(["head", "-c", "1000000", "/dev/zero"])
        res = await stream.wait()
        self.assertEqual((len(res.stdout), res.exit_code), (1000000, 0))
        self.assertIs(stream.result, res)


class FilesTest(LiveTest):
    async def test_file_calls(self) -> None:
        sb = await self.make()
        f = sb.files
        self.assertEqual(await f.write("/tmp/d/a.txt", "hello"), 5)  # parents made
        self.assertEqual(await f.write("/tmp/d/a.txt", b" world", append=True), 6)
        self.assertEqual(await f.read("/tmp/d/a.txt"), b"hello world")
        self.assertEqual(await f.read("/tmp/d/a.txt", offset=6, limit=3), b"wor")
        self.assertEqual(await f.read_text("/tmp/d/a.txt"), "hello world")
        await f.write("/tmp/d/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
        self.assertEqual((await sb.run(["/tmp/d/run.sh"])).text, "ran\n")
        st = await f.stat("/tmp/d/run.sh")
        self.assertEqual((st.name, st.path, st.size, st.mode & 0o777, st.is_dir), ("run.sh", "/tmp/d/run.sh", 19, 0o755, False))
        await f.mkdir("/tmp/d/sub/deeper", parents=True)
        self.assertEqual([e.name for e in await f.list("/tmp/d")], ["a.txt", "run.sh", "sub"])
        self.assertTrue((await f.stat("/tmp/d/sub")).is_dir)
        await f.remove("/tmp/d/a.txt")
        self.assertFalse(await f.exists("/tmp/d/a.txt"))
        with self.assertRaises(corral.FailedPreconditionError):
            await f.remove("/tmp/d")  # not empty
        await f.remove("/tmp/d", recursive=True)
        self.assertFalse(await f.exists("/tmp/d"))
        await sb.run("ln -s /etc/passwd /tmp/link")
        self.assertTrue((await f.stat("/tmp/link")).is_symlink)

    async def test_large_file(self) -> None:
        sb = await self.make()
        data = bytes(range(256)) * (9 * 4096 + 17)  # > 9 MiB: 3 write requests, many read messages
        self.assertEqual(await sb.files.write("/tmp/big.bin", data), len(data))
        self.assertEqual(await sb.files.read("/tmp/big.bin"), data)
        self.assertEqual((await sb.run(["wc", "-c", "/tmp/big.bin"])).text.split()[0], str(len(data)))


class ErrorMappingTest(LiveTest):
    async def test_errors(self) -> None:
        with self.assertRaises(corral.InvalidArgumentError):
            await self.c.get("noid")
        with self.assertRaises(corral.NotFoundError) as cm:
            await self.c.get("nffffff-000000000000")
        self.assertIn("nffffff", cm.exception.message)
        self.assertEqual(cm.exception.code, "not_found")
        with self.assertRaises(corral.NotFoundError):
            await self.make(image="no-such-image")
        # A backend corral knows that this node does not run, if any
        # (which depends on the host: microvm needs its agent, vm qemu).
        nodes = await self.c._t.unary("/corral.v1.ObserveService/Nodes", {}, idempotent=True)
        have = set(nodes["nodes"][0].get("backends", []))
        absent = [b for b in ("microvm", "vm") if b not in have]
        if absent:
            with self.assertRaises(corral.UnimplementedError):
                await self.make(backend=absent[0])
        with self.assertRaises(corral.InvalidArgumentError):
            await self.make(backend="bogus")
        with self.assertRaises(corral.InvalidArgumentError):
            await self.make(cpu=10_000_000)
        with self.assertRaises(corral.InvalidArgumentError) as bad_rule:
            await self.make(network=["*.org"])
        self.assertIn("network.allow[0]", bad_rule.exception.message)
        sb = await self.make()
        with self.assertRaises(corral.InvalidArgumentError):
            await sb.run(["true"], cwd="relative")
        with self.assertRaises(corral.NotFoundError):
            await sb.files.read("/no/such/file")
        with self.assertRaises(corral.NotFoundError):
            await sb.files.mkdir("/x/y/z")
        stopped = await self.make(max_lifetime=1)
        for _ in range(100):
            if (await stopped.refresh()).state == corral.State.STOPPED:
                break
            await asyncio.sleep(0.1)
        with self.assertRaises(corral.FailedPreconditionError):
            await stopped.run(["true"])
        await sb.delete()
        with self.assertRaises(corral.NotFoundError):
            await sb.run(["true"])

    async def test_unavailable_and_deadline(self) -> None:
        dead = corral.AsyncClient("127.0.0.1:1", retries=1)
        with self.assertRaises(corral.UnavailableError):
            await dead.list()
        await dead.close()
        sb = await self.make()
        with self.assertRaises(corral.DeadlineExceededError):
            await sb.run("echo $$ > /tmp/pid; exec sleep 60", request_timeout=1.0)
        # The client gave up and closed the connection: the server kills the command.
        self.assertTrue(await self.wait_gone(sb, await self.started_pid(sb)))


class ImageCallsTest(LiveTest):
    async def test_pack_branches_and_refcounts(self) -> None:
        sb = await self.make()
        await sb.run("mkdir -p /work && echo step-k > /work/state && echo noise > /tmp/x")
        name = "pytest-" + self.labels["test"] + "@1"
        packed = await sb.pack(name, exclude=["/work/never"])
        self.assertEqual(packed.layer.ref, name)
        self.assertTrue(packed.layer.blob_digest.startswith("sha256:"))
        assert packed.composition is not None
        self.assertEqual(packed.composition.layers[-1], name)
        branch = await self.make(image=name)
        self.assertEqual((await branch.run("cat /work/state; ls /tmp | wc -l")).text.split(), ["step-k", "0"])
        imgs = await self.c.list_images()
        self.assertIn(name, [comp.ref for comp in imgs.compositions])
        self.assertIn(name, [layer.ref for layer in imgs.layers])
        with self.assertRaises(corral.FailedPreconditionError) as cm:
            await self.c.remove_image(name)
        self.assertIn(branch.id, str(cm.exception))
        await branch.delete()
        removed = await self.c.remove_image(name)
        self.assertEqual((removed.compositions, [x.ref for x in removed.layers]), ([name], [name]))
        cname = "pytest-c-" + self.labels["test"] + "@1"
        comp = await self.c.create_composition(cname, ["busybox@1"], env={"PATH": "/bin"})
        self.assertEqual((comp.layers, comp.env), (["busybox@1"], ["PATH=/bin"]))
        with self.assertRaises(corral.AlreadyExistsError):
            await self.c.create_composition(cname, ["busybox"])
        self.assertEqual((await self.c.remove_image(cname)).compositions, [cname])
