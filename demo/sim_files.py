"""Writing a simulated node filesystem the way the kernel presents it to readers.

A scrape may read any file at any moment, so every value file is replaced atomically:
written in a staging directory on the same filesystem, then renamed over the old one.
Staging lives outside the directories collectors list, so a half-written temporary file
never shows up as a phantom counter. Unchanged values are not rewritten: at one tick a
second that keeps a whole cluster's worth of sysfs cheap.

On ext4 most of the cost is the kernel itself: renaming over an existing file makes
ext4 start writeback of the new one (auto_da_alloc). On tmpfs, where a real sysfs's
in-memory nature is matched, the same tick is several times cheaper (see bench/).
"""
from __future__ import annotations

import os
from pathlib import Path

from fabricscope.atomicfile import write_atomically


class TreeWriter:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._root = str(self.root)   # plain strings: pathlib costs more than the syscalls here
        self.staging = self.root / ".staging"
        self.staging.mkdir(parents=True, exist_ok=True)
        self._staging = str(self.staging)
        self._last: dict[str, bytes] = {}   # relative path -> content last written
        self._made: set[str] = set()        # directories known to exist
        self.writes = 0                     # files actually replaced, for the tick benchmark

    def mkdir(self, rel: str) -> None:
        if rel not in self._made:
            (self.root / rel).mkdir(parents=True, exist_ok=True)
            self._made.add(rel)

    def write(self, rel: str, content: str | bytes) -> bool:
        """Replace the file at `rel` if its content changed; True if it was written."""
        data = content.encode() if isinstance(content, str) else content
        if self._last.get(rel) == data:
            return False
        self.mkdir(os.path.dirname(rel))
        write_atomically(f"{self._root}/{rel}", data, mode=0o444, staging_dir=self._staging)
        self._last[rel] = data
        self.writes += 1
        return True

    def symlink(self, rel: str, target_rel: str) -> None:
        """A relative symlink at `rel` pointing at `target_rel` (both relative to the root),
        as sysfs does, so the tree still resolves when the root is moved or copied."""
        self.mkdir(os.path.dirname(rel))
        link = self.root / rel
        relative = os.path.relpath(self.root / target_rel, link.parent)
        try:
            if os.readlink(link) == relative:
                return
            link.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            link.unlink()
        os.symlink(relative, link)


def filesystem_type(path: Path | str) -> str | None:
    """The type of the filesystem holding `path` (longest mount-point match in /proc/self/mounts)."""
    target = os.path.realpath(path)
    best, best_type = "", None
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, best_type = mount, fields[2]
    except OSError:
        return None
    return best_type


def tmpfs_home(workdir: Path | str, needed_bytes: int = 256 << 20) -> Path | None:
    """Where on tmpfs to keep the node trees of `workdir`, or None to keep them in place.

    sysfs and procfs live in memory; so do the simulated ones when they can. A rename over
    an existing file costs ext4 a writeback (auto_da_alloc) - from 0.1 ms to several ms on
    a busy disk - and a tick replaces hundreds of files, so on disk the tick cost is the
    disk's. On tmpfs it is tens of microseconds a file.
    """
    workdir = Path(workdir).resolve()
    if filesystem_type(workdir.parent if not workdir.exists() else workdir) in ("tmpfs", "ramfs"):
        return None
    shm = Path("/dev/shm")
    if filesystem_type(shm) != "tmpfs" or not os.access(shm, os.W_OK):
        return None
    try:
        stats = os.statvfs(shm)
    except OSError:
        return None
    if stats.f_bavail * stats.f_frsize < needed_bytes:
        return None
    import hashlib

    digest = hashlib.sha1(str(workdir).encode()).hexdigest()[:12]
    return shm / f"fabricscope-demo-{os.getuid()}" / digest


def claim_tmpfs_home(home: Path) -> None:
    """Mark `home` as this process's and clear homes whose process is gone (a demo killed
    with SIGKILL cannot clean up, and tmpfs is memory)."""
    import shutil

    home.mkdir(parents=True, exist_ok=True)
    (home / ".owner-pid").write_text(f"{os.getpid()}\n")
    for sibling in home.parent.iterdir():
        if sibling == home:
            continue
        try:
            pid = int((sibling / ".owner-pid").read_text())
        except (OSError, ValueError):
            continue          # not ours to judge
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(sibling, ignore_errors=True)
        except PermissionError:
            pass              # alive, someone else's
