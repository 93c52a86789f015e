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


class TreeWriter:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._root = str(self.root)   # plain strings: pathlib costs more than the syscalls here
        self.staging = self.root / ".staging"
        self.staging.mkdir(parents=True, exist_ok=True)
        self._pending = str(self.staging / "pending")
        self._last: dict[str, bytes] = {}   # relative path -> content last written
        self._made: set[str] = set()        # directories known to exist
        self.writes = 0                     # files actually replaced, for the tick benchmark

    def path(self, rel: str) -> Path:
        return self.root / rel

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
        fd = os.open(self._pending, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(self._pending, f"{self._root}/{rel}")
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
