"""Which processes the syscall program counts by name, and what happens when they do not fit."""
from __future__ import annotations

import struct

from fabricscope.exporter.ebpf.processes import ProcessTracker


class SmallMap:
    """A BPF hash map's user-space surface with a fixed capacity (update fails when full)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries: dict[bytes, bytes] = {}

    def update(self, key: bytes, value: bytes) -> None:
        if key not in self.entries and len(self.entries) >= self.max_entries:
            raise OSError(7, "Argument list too long")   # E2BIG: what the kernel returns when full
        self.entries[key] = value

    def delete(self, key: bytes) -> None:
        self.entries.pop(key, None)


def fake_procfs(root, pids, comm="trainer"):
    for pid in pids:
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "fd").mkdir()
    return root


def test_processes_beyond_map_capacity_are_reported_untracked(tmp_path):
    procfs = fake_procfs(tmp_path / "proc", [101, 102, 103])
    tracker = ProcessTracker(procfs, "/dev/nvidia", frozenset({"trainer"}), [195], interval_seconds=0)
    tracked = SmallMap(max_entries=2)
    tracker.sync(tracked, SmallMap(max_entries=8))
    assert sorted(struct.unpack("<I", k)[0] for k in tracked.entries) == [101, 102]
    assert tracker.untracked == 1
    # One process exits: the one left out gets its place on the next sync.
    (procfs / "101" / "comm").unlink()
    (procfs / "101" / "fd").rmdir()
    (procfs / "101").rmdir()
    tracker.sync(tracked, SmallMap(max_entries=8))
    assert sorted(struct.unpack("<I", k)[0] for k in tracked.entries) == [102, 103]
    assert tracker.untracked == 0
