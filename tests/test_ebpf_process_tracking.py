"""Which processes the syscall program counts by name, and what happens when they do not fit.

The kernel adds a process at its first GPU-driver ioctl (syscalls.bpf.c); user space adds
the allow-list, removes processes that exited, and moves GPU processes the kernel had no
room for in when room frees up. (The kernel half runs for real in test_ebpf_kernel.py.)
"""
from __future__ import annotations

import shutil
import struct

from fabricscope.exporter.bpf_loader.processes import ProcessTracker


class SmallMap:
    """A BPF hash map's user-space surface with a fixed capacity (update fails when full)."""

    def __init__(self, max_entries: int, tgids=()) -> None:
        self.max_entries = max_entries
        self.entries: dict[bytes, bytes] = {struct.pack("<I", t): struct.pack("<I", 2) for t in tgids}

    def keys(self):
        return iter(list(self.entries))

    def update(self, key: bytes, value: bytes) -> None:
        if key not in self.entries and len(self.entries) >= self.max_entries:
            raise OSError(7, "Argument list too long")   # E2BIG: what the kernel returns when full
        self.entries[key] = value

    def delete(self, key: bytes) -> None:
        self.entries.pop(key, None)

    def tgids(self) -> list[int]:
        return sorted(struct.unpack("<I", k)[0] for k in self.entries)


def fake_procfs(root, pids, comm="trainer"):
    for pid in pids:
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
    return root


def test_processes_beyond_map_capacity_are_reported_untracked(tmp_path):
    procfs = fake_procfs(tmp_path / "proc", [101, 102, 103])
    tracker = ProcessTracker(procfs, frozenset({"trainer"}), [195], interval_seconds=0)
    tracked = SmallMap(max_entries=2)
    tracker.sync(tracked, SmallMap(max_entries=8))
    assert tracked.tgids() == [101, 102]
    assert tracker.untracked == 1
    # One process exits: the one left out gets its place on the next sync.
    shutil.rmtree(procfs / "101")
    tracker.sync(tracked, SmallMap(max_entries=8))
    assert tracked.tgids() == [102, 103]
    assert tracker.untracked == 0


def test_kernel_added_gpu_processes_are_kept_while_alive_and_overflow_moves_in(tmp_path):
    procfs = fake_procfs(tmp_path / "proc", [201, 202, 203], comm="python")
    tracker = ProcessTracker(procfs, frozenset(), None, interval_seconds=0)
    # The kernel added 201 and 999 (999 has exited since); 202 and 203 found the map full.
    tracked = SmallMap(max_entries=2, tgids=[201, 999])
    overflow = SmallMap(max_entries=16, tgids=[202, 203])
    tracker.sync(tracked, SmallMap(max_entries=8), overflow)
    assert tracked.tgids() == [201, 202]           # 999 gone, 202 moved in
    assert overflow.tgids() == [203]
    assert tracker.untracked == 1
    shutil.rmtree(procfs / "203")                   # the one left waiting exits
    tracker.sync(tracked, SmallMap(max_entries=8), overflow)
    assert overflow.tgids() == [] and tracker.untracked == 0


def test_a_gpu_process_the_kernel_added_stays_tracked_without_an_allow_list(tmp_path):
    procfs = fake_procfs(tmp_path / "proc", [301])
    tracker = ProcessTracker(procfs, frozenset(), None, interval_seconds=0)
    tracked = SmallMap(max_entries=4, tgids=[301])
    tracker.sync(tracked, SmallMap(max_entries=8))
    assert tracked.tgids() == [301]
