"""NCCL process discovery from exec/dlopen hints instead of reading every process's maps.

ProcessWatch is pure scheduling (a fake clock here); the root tests run the real uprobes
and procwatch.bpf.o with the safety-net rescan pushed out of reach, so anything traced was
found from a hint: a rank started after the exporter (exec), and a process that loads a
library file never seen before with dlopen long after it started.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import requests

from fabricscope.exporter.context import Context
from fabricscope.exporter.nccl.discovery import PROC_DLOPEN, PROC_EVENT, PROC_EXEC, ProcessWatch, may_map_nccl
from tests.nccl_fake.build import build_fake_nccl
from tests.conftest import could_not_run, require_tool


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_exec_is_looked_at_after_ld_so_and_once_more():
    clock = Clock()
    watch = ProcessWatch(exec_delays=(0.3, 3.0), clock=clock)
    watch.handle_raw(PROC_EVENT.pack(42, PROC_EXEC))
    assert watch.due() == []
    clock.now += 0.3
    assert watch.due() == [42]
    assert watch.due() == []
    clock.now += 2.7
    assert watch.due() == [42]
    assert watch.pending() == 0


def test_a_burst_of_dlopens_is_one_look_and_later_ones_wait_for_the_gap():
    clock = Clock()
    watch = ProcessWatch(dlopen_delay=0.2, min_gap=1.0, clock=clock)
    for _ in range(300):                                  # `import torch`: hundreds of extension modules
        watch.hint(7, PROC_DLOPEN)
    clock.now += 0.2
    assert watch.due() == [7]
    clock.now += 0.1
    watch.hint(7, PROC_DLOPEN)                            # another dlopen just after the look
    clock.now += 0.2
    assert watch.due() == []                              # not before min_gap
    clock.now += 0.7
    assert watch.due() == [7]


def test_bad_records_are_counted_and_an_overflow_asks_for_a_full_rescan():
    clock = Clock()
    watch = ProcessWatch(max_pending=3, clock=clock)
    watch.handle_raw(b"\x01\x00")
    watch.hint(1, 99)
    assert watch.invalid == 2
    for pid in range(1, 5):
        watch.hint(pid, PROC_EXEC)
    assert watch.overflowed and watch.pending() == 3
    watch.reset()
    assert not watch.overflowed and watch.pending() == 0


def test_maps_worth_parsing():
    assert may_map_nccl("7f00-7f01 r-xp 0 08:01 5 /opt/x/lib/libnccl.so.2.21.5\n")
    assert may_map_nccl("7f00-7f01 r-xp 0 08:01 5 /usr/lib/python3/torch/lib/libtorch_cuda.so\n")
    assert not may_map_nccl("7f00-7f01 r-xp 0 08:01 5 /usr/lib/x86_64-linux-gnu/libc.so.6\n")


# ---- root: the real hints ----------------------------------------------------------------------

LATE_LOADER = r"""
import ctypes, sys
class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
print("ready", flush=True)
path = sys.stdin.readline().strip()                       # the library is loaded only now
lib = ctypes.CDLL(path)
uid, comm = UniqueId(), ctypes.c_void_p()
lib.ncclGetUniqueId(ctypes.byref(uid))
assert lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
buf = (ctypes.c_float * 16)()
for _ in range(5):
    lib.ncclAllReduce(buf, buf, ctypes.c_size_t(16), 7, 0, comm, None)
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def fake_nccl(tmp_path_factory):
    require_tool("gcc")
    return build_fake_nccl(tmp_path_factory.mktemp("nccl_fake"))


@pytest.fixture
def hinted_exporter(port, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: uprobes and tracepoints load BPF programs")
    from fabricscope.exporter.bpf_loader import objects, reasons
    from fabricscope.exporter.main import start_exporter

    problem = reasons.preflight()
    if problem:
        pytest.skip(f"eBPF unavailable here: {problem[1]}")
    if not objects.object_path("procwatch").is_file():
        ok, output = objects.build()
        if not ok:
            could_not_run(f"cannot build the BPF objects: {output[-300:]}")
    ctx = Context(state_dir=tmp_path, node="n1", config={"nccl": {"rescan_seconds": 3600}})
    running = start_exporter(ctx, ["nccl"], f"127.0.0.1:{port}")
    [collector] = running.collectors
    source = collector.uprobes
    if source is None or source.reason != "ok":
        running.stop()
        could_not_run(f"NCCL uprobes could not load: {getattr(source, 'reason', 'none')}")
    assert source.watch_reason == "ok", source.watch_reason
    yield f"http://127.0.0.1:{port}", source
    running.stop()


def metric(base: str, name: str, **labels) -> float | None:
    """Sum of the samples of `name` carrying these labels (None when there are none)."""
    values = []
    for line in requests.get(base + "/metrics", timeout=10).text.splitlines():
        key, _, value = line.rpartition(" ")
        if line.startswith("#") or key.partition("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            values.append(float(value))
    return sum(values) if values else None


def wait_for(predicate, what: str, deadline: float = 20.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def test_ranks_started_after_the_exporter_and_late_dlopen_are_found_without_rescans(hinted_exporter, fake_nccl,
                                                                                   tmp_path):
    base, source = hinted_exporter
    library, driver = fake_nccl
    assert source.full_rescans == 1                       # the one at start; the next is an hour away
    # exec: the driver links libnccl.so.2 (DT_NEEDED), mapped by ld.so right after exec.
    rank = subprocess.Popen([str(driver), "1", "0", "3", "10", "0", "1"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    late = None
    try:
        assert rank.stdout.readline().strip() == "ready"
        # (Other NCCL processes may run on this machine: look for ours by pid.)
        wait_for(lambda: rank.pid in source.traced_pids(), "the exec'd rank traced")
        rank.stdin.write("go\n")
        rank.stdin.flush()
        assert rank.stdout.readline().strip() == "done"
        wait_for(lambda: (metric(base, "fabric_nccl_calls_total", op="AllReduce", rank="0") or 0) >= 4,
                 "the rank's AllReduce calls")
        # dlopen: a copy of the library is a new file (new inode) no probe covers yet; the
        # process has long been running when it loads it.
        copy = tmp_path / "lib" / "libnccl.so.2"
        copy.parent.mkdir()
        shutil.copy(library, copy)
        late = subprocess.Popen([sys.executable, "-c", LATE_LOADER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        assert late.stdout.readline().strip() == "ready"
        time.sleep(4)                                     # past both exec looks: only dlopen can find it now
        assert metric(base, "fabric_nccl_probe_attached", library=str(copy)) is None
        late.stdin.write(f"{copy}\n")
        late.stdin.flush()
        assert late.stdout.readline().strip() == "done"
        wait_for(lambda: metric(base, "fabric_nccl_probe_attached", library=str(copy)) == 1,
                 "the dlopen'd library probed")
        wait_for(lambda: late.pid in source.traced_pids(), "the late loader traced")
        assert source.full_rescans == 1
    finally:
        for proc in (rank, late):
            if proc is not None:
                proc.kill()
                proc.wait()
    wait_for(lambda: not {rank.pid, late.pid} & source.traced_pids(), "exits noticed without a rescan")
    assert metric(base, "fabric_nccl_processes_exited_total") >= 2
    assert source.full_rescans == 1
