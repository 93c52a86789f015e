"""Safe reads of single-value sysfs/procfs files.

A value file can be absent (the kernel or firmware does not expose it: an absent series),
unreadable, empty, or hold text that is not a number ("N/A (no PMA)" from mlx5 ports
without a performance-management agent). Readers return either a value or a short,
bounded reason string that collectors export as a label, so a bad file is visible and
specific and never an exception that would cost the rest of the scrape.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ReadProblem:
    path: Path
    reason: str      # absent | permission_denied | not_a_file | io_error | empty | no_pma | not_a_number

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def read_text(path: Path) -> str | ReadProblem:
    """The file's content with surrounding whitespace stripped, or why it could not be read."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        return ReadProblem(path, reason_for(exc))
    text = raw.decode("utf-8", "replace").strip()
    return text if text else ReadProblem(path, "empty")


def parse_int(text: str, path: Path) -> int | ReadProblem:
    if text.startswith("N/A"):
        return ReadProblem(path, "no_pma")
    try:
        return int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        return ReadProblem(path, "not_a_number")


def read_int(path: Path) -> int | ReadProblem:
    text = read_text(path)
    return text if isinstance(text, ReadProblem) else parse_int(text, path)


def read_small_text(path: str) -> str | ReadProblem:
    """read_text for hot paths (hundreds of counter files per scrape).

    One os.open/os.read/os.close: no buffered-IO object per file, which is most of the
    cost of open().read() on a small sysfs attribute. sysfs values fit in one page.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return ReadProblem(Path(path), reason_for(exc))
    try:
        raw = os.read(fd, 4096)
    except OSError as exc:
        return ReadProblem(Path(path), reason_for(exc))
    finally:
        os.close(fd)
    text = raw.decode("utf-8", "replace").strip()
    return text if text else ReadProblem(Path(path), "empty")


def reason_for(exc: OSError) -> str:
    """The bounded reason label for a failed read of a sysfs/procfs path."""
    if exc.errno == errno.ENOENT:
        return "absent"
    if exc.errno in (errno.EISDIR, errno.ENOTDIR):   # a file where a directory belongs, or the reverse
        return "not_a_file"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission_denied"
    # EINVAL/EOPNOTSUPP are what some drivers return for counters the hardware lacks.
    if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
        return "unsupported"
    return "io_error"


def read_small_texts(directory: str, names) -> list[tuple[str, str | ReadProblem]]:
    """read_small_text for many files of one directory: the directory is opened once and
    each file is opened relative to it, so the kernel does not walk the full (often
    symlinked) sysfs path again for every counter file."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return [(name, read_small_text(os.path.join(directory, name))) for name in names]
    results: list[tuple[str, str | ReadProblem]] = []
    try:
        for name in names:
            try:
                fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
            except OSError as exc:
                results.append((name, ReadProblem(Path(directory, name), reason_for(exc))))
                continue
            try:
                raw = os.read(fd, 4096)
            except OSError as exc:
                results.append((name, ReadProblem(Path(directory, name), reason_for(exc))))
                continue
            finally:
                os.close(fd)
            text = raw.decode("utf-8", "replace").strip()
            results.append((name, text if text else ReadProblem(Path(directory, name), "empty")))
    finally:
        os.close(dir_fd)
    return results
