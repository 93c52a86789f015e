"""Replacing a file so that no reader ever sees half of it.

Every file fabricscope writes for another reader (the exporter's state, Prometheus'
file_sd targets and configs, the demo's simulated sysfs values) goes through
`write_atomically`: the bytes go to a temporary file on the same filesystem, which is then
renamed over the target. rename(2) is atomic, so a reader sees the old content or the new,
and a process killed mid-write leaves the old file intact plus, at worst, one temporary
file that `remove_orphans` clears at the next start.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Temporary files are hidden and name their target, so a directory listing never takes
# them for data and an orphan can be traced to the file it was meant to replace.
TEMP_SUFFIX = ".tmp"


def _temp_prefix(target_name: str) -> str:
    return f".{target_name}."


def write_atomically(path: str | Path, data: str | bytes, *, mode: int = 0o644, durable: bool = False,
                     staging_dir: str | Path | None = None) -> Path:
    """Replace `path` with `data`; return `path`.

    `mode`: the new file's permissions (mkstemp's 0600 would hide a targets file from a
    Prometheus running as its own user). `durable`: fsync before the rename, for state
    that must survive a power cut, not only a crash. `staging_dir`: where the temporary
    file lives when `path`'s own directory is listed by readers that must not see it;
    it must be on the same filesystem."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    directory = staging_dir if staging_dir is not None else path.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path.name), suffix=TEMP_SUFFIX, dir=directory)
    except FileNotFoundError:
        # Directories are made only when missing: the demo writes hundreds of files a tick.
        Path(directory).mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path.name), suffix=TEMP_SUFFIX, dir=directory)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, path)
        except FileNotFoundError:   # the target's directory is missing (a staging dir was given)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def remove_orphans(path: str | Path) -> list[Path]:
    """Delete temporary files a killed writer left beside `path`; return what was removed."""
    path = Path(path)
    removed = []
    try:
        candidates = list(path.parent.glob(f"{_temp_prefix(path.name)}*{TEMP_SUFFIX}"))
    except OSError:
        return removed
    for candidate in candidates:
        try:
            candidate.unlink()
            removed.append(candidate)
        except OSError:
            pass
    return removed
