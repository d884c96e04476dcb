"""Streamed uploads: directory trees in and out, layers from this machine,
files past the old per-request cap."""

import hashlib
import os
import tempfile

from live import ADDR, LiveTest, corral


def make_tree(root: str) -> None:
    os.makedirs(os.path.join(root, "a", "b"))
    with open(os.path.join(root, "a", "b", "data"), "wb") as f:
        f.write(os.urandom(3 << 20))
    with open(os.path.join(root, "a", "run.sh"), "w") as f:
        f.write("#!/bin/sh\necho hi\n")
    os.chmod(os.path.join(root, "a", "run.sh"), 0o750)
    os.symlink("b/data", os.path.join(root, "a", "link"))
    os.link(os.path.join(root, "a", "run.sh"), os.path.join(root, "hard"))
    os.utime(os.path.join(root, "a", "b", "data"), (1_600_000_000, 1_600_000_000))


class TransferTest(LiveTest):
    async def test_dir_round_trip(self) -> None:
        sb = await self.make(disk_mb=256)
        with tempfile.TemporaryDirectory() as tmp:
            src, back = os.path.join(tmp, "src"), os.path.join(tmp, "back")
            make_tree(src)
            written = await sb.files.upload_dir(src, "/work/tree")
            self.assertEqual(written, (3 << 20) + len("#!/bin/sh\necho hi\n"))
            r = await sb.run("cd /work/tree && stat -c '%a %h' a/run.sh && readlink a/link && stat -c %Y a/b/data")
            self.assertEqual(r.text, "750 2\nb/data\n1600000000\n")
            await sb.files.download_dir("/work/tree", back)
            for rel in ("a/b/data", "a/run.sh", "hard"):
                with open(os.path.join(src, rel), "rb") as x, open(os.path.join(back, rel), "rb") as y:
                    self.assertEqual(x.read(), y.read(), rel)
            self.assertEqual(os.readlink(os.path.join(back, "a", "link")), "b/data")
            self.assertEqual(os.stat(os.path.join(back, "a", "run.sh")).st_mode & 0o777, 0o750)
            self.assertEqual(os.stat(os.path.join(back, "hard")).st_ino, os.stat(os.path.join(back, "a", "run.sh")).st_ino)
            self.assertEqual(int(os.stat(os.path.join(back, "a", "b", "data")).st_mtime), 1_600_000_000)

    async def test_write_from_and_streamed_layer(self) -> None:
        sb = await self.make(disk_mb=256)
        data = os.urandom(20 << 20)
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.seek(0)
            self.assertEqual(await sb.files.write_from("/big", f, mode=0o600), len(data))
        r = await sb.run("sha256sum /big")
        self.assertEqual(r.text.split()[0], hashlib.sha256(data).hexdigest())
        with tempfile.TemporaryDirectory() as tmp:
            make_tree(tmp)
            name = f"pylayer-{self.labels['test']}@1"
            layer = await self.c.create_layer(tmp, name)
            self.assertTrue(layer.digest.startswith("sha256:"))
            await self.c.remove_image(name)

    async def test_node_path_refused(self) -> None:
        # The test daemon has no --import-root, and TCP callers are never
        # the node administrator: either way no node path is read.
        with self.assertRaises(corral.CorralError) as ctx:
            await self.c.create_layer_from_node("/etc", "stolen@1")
        on_socket = ADDR.startswith("unix://") or ADDR.startswith("/")
        self.assertIn("--import-root" if on_socket else "only the node administrator", str(ctx.exception))
