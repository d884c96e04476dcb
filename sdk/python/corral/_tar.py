"""Tar streams of local trees for uploads, and safe extraction of the tar
streams a sandbox sends back (whatever its tree holds, nothing lands
outside the destination). Standard library only."""

import asyncio
import os
import tarfile
import tempfile
from typing import IO, Any, AsyncIterator, Dict, List, Optional

from .types import b64encode

CHUNK = 1 << 20


def _add(tw: tarfile.TarFile, path: str, arcname: str) -> None:
    ti = tw.gettarinfo(path, arcname)  # lstat: symlinks recorded, hard links found
    ti.uname = ti.gname = ""
    if not ti.issym():
        try:
            for name in os.listxattr(path, follow_symlinks=False):
                ti.pax_headers["SCHILY.xattr." + name] = os.getxattr(path, name, follow_symlinks=False).decode(
                    "utf-8", "surrogateescape")
        except OSError:
            pass  # no xattrs here
    if ti.isreg():
        with open(path, "rb") as src:
            tw.addfile(ti, src)
    else:
        tw.addfile(ti)


def tar_tree(path: str) -> IO[bytes]:
    """A temporary file holding a tar of the directory path (entries
    relative to it, "./" first): files, directories, symlinks, hard links,
    modes, numeric owners, mtimes and xattrs. A tar file is returned open
    as it is."""
    if not os.path.isdir(path):
        if not os.path.isfile(path):
            raise ValueError(f"{path} is neither a directory nor a tar file")
        return open(path, "rb")
    f = tempfile.TemporaryFile()
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tw:
        _add(tw, path, ".")
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(dirs + files):
                full = os.path.join(root, name)
                _add(tw, full, os.path.relpath(full, path))
    f.seek(0)
    return f


def _parts(name: str, strip: int) -> List[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")][strip:]
    if ".." in parts:
        raise ValueError(f"tar entry {name!r} climbs out with ..")
    return parts


def _check_beneath(dest: str, parts: List[str], name: str) -> None:
    """Refuse a name whose parent directories under dest include a symlink
    (one the stream made earlier could point anywhere)."""
    cur = dest
    for p in parts[:-1]:
        cur = os.path.join(cur, p)
        if os.path.islink(cur):
            raise ValueError(f"tar entry {name!r} goes through the symlink {cur}")


# tarfile's own extraction filters, where this Python has them, are not
# needed: every name is checked here first.
_TRUSTED = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}


def extract(f: IO[bytes], dest: str, strip: int) -> None:
    """Extract the tar in f into dest (made when missing), dropping the
    first strip components of every name. Names with "..", names through a
    symlink and hard links from outside are refused, devices and FIFOs
    skipped; owners are kept when running as root."""
    os.makedirs(dest, exist_ok=True)
    dest = os.path.realpath(dest)
    dirs: List[tarfile.TarInfo] = []
    with tarfile.open(fileobj=f, mode="r") as tr:
        for m in tr:
            parts = _parts(m.name, strip)
            if not parts or m.isdev() or m.isfifo():
                continue  # the top entry itself (strip), or no data
            _check_beneath(dest, parts, m.name)
            m.name = "/".join(parts)
            if m.islnk():
                link = _parts(m.linkname, strip)
                _check_beneath(dest, link + [""], m.linkname)
                m.linkname = "/".join(link)
            if m.isdir():
                dirs.append(m)
            tr.extract(m, dest, set_attrs=not m.isdir(), numeric_owner=True, **_TRUSTED)
        # Directories' modes and mtimes last, deepest first (their entries changed them).
        for d in sorted(dirs, key=lambda x: x.name, reverse=True):
            path = os.path.join(dest, d.name)
            if os.geteuid() == 0:
                os.lchown(path, d.uid, d.gid)
            os.chmod(path, d.mode)
            os.utime(path, (d.mtime, d.mtime))


async def file_messages(f: IO[bytes], first: Dict[str, Any], field: str) -> AsyncIterator[Dict[str, Any]]:
    """The messages of an upload: first, then f's bytes in CHUNK pieces
    (base64 in field, the first piece in first itself); f is closed at the end."""
    loop = asyncio.get_running_loop()
    try:
        msg: Optional[Dict[str, Any]] = dict(first)
        while True:
            data = await loop.run_in_executor(None, f.read, CHUNK)
            if data or msg is not None:
                out = msg if msg is not None else {}
                if data:
                    out[field] = b64encode(data)
                yield out
                msg = None
            if not data:
                return
    finally:
        f.close()
