"""The SDK's tar extraction never writes outside its destination."""

import io
import os
import sys
import tarfile
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from corral._tar import extract  # noqa: E402


def archive(*members: tarfile.TarInfo) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tw:
        for m in members:
            tw.addfile(m, io.BytesIO(b"x" * m.size) if m.isreg() else None)
    buf.seek(0)
    return buf


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = kind, link
    ti.size = 1 if kind == tarfile.REGTYPE else 0
    return ti


class ExtractTest(unittest.TestCase):
    def test_escapes_refused(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            dest, outside = os.path.join(tmp, "dest"), os.path.join(tmp, "outside")
            os.makedirs(outside)
            cases = [
                [entry("top/../../outside/dotdot")],
                [entry("top/out", tarfile.SYMTYPE, outside), entry("top/out/through")],
                [entry("top/hard", tarfile.LNKTYPE, "top/../../outside/x")],
            ]
            for members in cases:
                with self.assertRaises(ValueError):
                    extract(archive(*members), dest, 1)
            self.assertEqual(os.listdir(outside), [])

    def test_strip_and_links(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            extract(archive(entry("top/", tarfile.DIRTYPE), entry("top/f"),
                            entry("top/l", tarfile.SYMTYPE, "f"), entry("top/h", tarfile.LNKTYPE, "top/f")), tmp, 1)
            self.assertEqual(sorted(os.listdir(tmp)), ["f", "h", "l"])
            self.assertEqual(os.stat(os.path.join(tmp, "h")).st_ino, os.stat(os.path.join(tmp, "f")).st_ino)
            self.assertEqual(os.readlink(os.path.join(tmp, "l")), "f")


if __name__ == "__main__":
    unittest.main()
