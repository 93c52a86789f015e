"""The libbpf binding against the real kernel: load, attach, maps, ring buffers, stats.

Runs for real as root on a kernel with BTF (CI); skips with the reason elsewhere.
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct
import subprocess
from pathlib import Path

import pytest

from fabricscope.exporter.bpf_loader import elfsym, objects, reasons
from fabricscope.exporter.bpf_loader.reasons import BpfUnavailable, reason_for_errno
from tests.conftest import could_not_run, require_tool

BTF = Path("/sys/kernel/btf/vmlinux")
needs_bpf = pytest.mark.skipif(os.geteuid() != 0 or not BTF.exists(),
                               reason="needs root and kernel BTF (/sys/kernel/btf/vmlinux)")
LIBC = ctypes.CDLL("libc.so.6")


@pytest.fixture(scope="session")
def bpf_objects() -> Path:
    ok, output = objects.build()
    if not ok:
        could_not_run(f"BPF objects could not be built: {output}")
    return objects.default_object_dir()


SELFTEST_DIR = Path(__file__).resolve().parent / "bpf"


@pytest.fixture(scope="session")
def selftest_object(bpf_objects) -> Path:
    ok, output = objects.build(SELFTEST_DIR)
    if not ok:
        could_not_run(f"the loader's test program could not be built: {output}")
    return SELFTEST_DIR / "selftest.bpf.o"


@pytest.fixture(params=["uprobe_multi", "perf_event"])
def selftest(selftest_object, request, monkeypatch):
    """The test program loaded both ways uprobes attach: as uprobe_multi links where the
    kernel has them (it should: 6.6+) and as libbpf's perf-event uprobes (older kernels)."""
    from fabricscope.exporter.bpf_loader import libbpf
    if request.param == "perf_event":
        monkeypatch.setattr(libbpf, "_uprobe_multi", False)
    elif not libbpf.uprobe_multi_supported():
        could_not_run(f"this kernel ({os.uname().release}) has no uprobe_multi links")
    obj = libbpf.BpfObject.load(selftest_object)
    assert obj.uprobe_multi == (request.param == "uprobe_multi")
    yield obj
    obj.close()


# ---- reasons: pure, run everywhere -------------------------------------------------

@pytest.mark.parametrize("stage, err, euid, expected", [
    ("open", errno.ENOENT, 0, reasons.OBJECT_MISSING),
    ("open", errno.EINVAL, 0, reasons.BAD_OBJECT),
    ("open", errno.ENOEXEC, 0, reasons.BAD_OBJECT),
    ("load", errno.EPERM, 1000, reasons.NOT_ROOT),
    ("load", errno.EACCES, 1000, reasons.NOT_ROOT),
    ("load", errno.EACCES, 0, reasons.LOAD_FAILED),      # root: the verifier said no
    ("load", errno.EINVAL, 0, reasons.LOAD_FAILED),
    ("load", errno.ESRCH, 0, reasons.NO_BTF),            # CO-RE found no kernel type
    ("attach", errno.EINVAL, 0, reasons.ATTACH_FAILED),
    ("attach", errno.EPERM, 1000, reasons.NOT_ROOT),
    ("update", errno.E2BIG, 0, reasons.MAP_FULL),
    ("update", errno.ENOSPC, 0, reasons.MAP_FULL),
])
def test_reason_for_errno(stage, err, euid, expected):
    assert reason_for_errno(stage, err, euid) == expected


def test_reason_for_unknown_stage_is_an_error():
    with pytest.raises(ValueError):
        reason_for_errno("frobnicate", errno.EINVAL, 0)


def test_unknown_reason_is_refused():
    with pytest.raises(ValueError):
        BpfUnavailable("because", "a label value outside the bounded set")


def test_preflight_reasons(tmp_path):
    assert reasons.preflight(tmp_path, euid=1000)[0] == reasons.NOT_ROOT
    assert reasons.preflight(tmp_path, euid=0)[0] == reasons.NO_BTF
    (tmp_path / "kernel/btf").mkdir(parents=True)
    (tmp_path / "kernel/btf/vmlinux").write_bytes(b"\x9f\xeb")
    assert reasons.preflight(tmp_path, euid=0) is None


def test_elf_symbol_offset_matches_the_dynamic_symbol():
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.exists():
        libc = Path("/lib/aarch64-linux-gnu/libc.so.6")
    require_tool("readelf", "binutils")
    if not libc.exists():
        pytest.fail("no system libc at /lib/<arch>-linux-gnu/libc.so.6")
    out = subprocess.run(["readelf", "-W", "--dyn-syms", str(libc)], capture_output=True, text=True).stdout
    value = next(int(line.split()[1], 16) for line in out.splitlines()
                 if line.split()[-1:] == ["labs"] or line.split()[-1:] == ["labs@@GLIBC_2.2.5"])
    # libc's text segment has vaddr == file offset, so the two agree.
    assert elfsym.symbol_file_offset(libc, "labs") == value
    with pytest.raises(elfsym.ElfError):
        elfsym.symbol_file_offset(libc, "no_such_function_anywhere")


def test_elf_rejects_non_elf(tmp_path):
    bogus = tmp_path / "x.so"
    bogus.write_bytes(b"not an elf at all")
    with pytest.raises(elfsym.ElfError, match="not an ELF"):
        elfsym.symbol_file_offset(bogus, "f")


# ---- the real loader -------------------------------------------------------------

def test_missing_object_is_object_missing(tmp_path):
    from fabricscope.exporter.bpf_loader.libbpf import BpfObject
    with pytest.raises(BpfUnavailable) as info:
        BpfObject.load(tmp_path / "absent.bpf.o")
    assert info.value.reason == reasons.OBJECT_MISSING


def test_garbage_object_is_bad_object(tmp_path):
    from fabricscope.exporter.bpf_loader.libbpf import BpfObject
    bad = tmp_path / "bad.bpf.o"
    bad.write_bytes(b"\x7fELF" + b"\0" * 60 + b"garbage")
    with pytest.raises(BpfUnavailable) as info:
        BpfObject.load(bad)
    assert info.value.reason == reasons.BAD_OBJECT


@needs_bpf
def test_verifier_rejection_is_load_failed_with_the_log(tmp_path, bpf_objects):
    from fabricscope.exporter.bpf_loader.libbpf import BpfObject
    require_tool("clang")
    src = tmp_path / "reject.bpf.c"
    # Reads a map value without the NULL check the verifier insists on.
    src.write_text("""
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 4); __type(key, __u32); __type(value, __u64); } m SEC(".maps");
SEC("raw_tp/sys_enter")
int unchecked(void *ctx) { __u32 k = 0; __u64 *v = bpf_map_lookup_elem(&m, &k); return (int)*v; }
""")
    obj = tmp_path / "reject.bpf.o"
    subprocess.run(["clang", "-O2", "-g", "-target", "bpf", f"-I{bpf_objects}", "-I/usr/include/bpf",
                    "-c", str(src), "-o", str(obj)], check=True)
    with pytest.raises(BpfUnavailable) as info:
        BpfObject.load(obj)
    assert info.value.reason == reasons.LOAD_FAILED
    assert "invalid mem access" in str(info.value)   # the verifier's own words reach the caller


@needs_bpf
def test_uprobe_counts_calls_and_ring_buffer_delivers_them(selftest):
    pid = os.getpid()
    selftest.attach_uprobe("probe_entry", "libc.so.6", "labs", pid=pid)
    selftest.attach_uprobe("probe_return", "libc.so.6", "labs", pid=pid, retprobe=True)
    records = []
    ring = selftest.ring_buffer("events", records.append)
    for i in range(7):
        LIBC.labs(-(1000 + i))
    assert ring.poll(1000) > 0
    ring.poll(0)
    events = [struct.unpack("<IIQ", r) for r in records]
    assert [(t, ret, arg) for t, ret, arg in events if ret == 1] == [(pid, 1, 1000 + i) for i in range(7)]
    key = struct.pack("<I", pid)
    assert struct.unpack("<Q", selftest.map("calls").lookup(key)) == (14,)
    per_cpu = selftest.map("calls_percpu").lookup(key, per_cpu=True)
    assert len(per_cpu) == selftest.map("calls_percpu").ncpus
    assert sum(struct.unpack("<Q", v)[0] for v in per_cpu) == 14
    assert struct.unpack("<Q", selftest.map("calls_percpu").lookup(key)) == (14,)


@needs_bpf
def test_kernel_histogram_slots_match_the_user_space_layout(selftest):
    """The kernel's loglin_slot() (fabric.h) and BucketLayout.slot_for agree on every
    bucket edge: values returned by labs() are counted by the selftest's histogram, which
    has the RTT excess layout."""
    from fabricscope.exporter.bpf_loader.histogram import KernelHistogram, parse_hist
    from fabricscope.exporter.bpf_loader.declarations import load_declarations

    layout = next(m.layout for d in load_declarations() for m in d.metrics if m.name == "fabric_tcp_rtt_excess_seconds")
    values = [0, 1, 7, 8, 9, 16, 17, 18, 19, 100, 1000, 1024, 1025, 123_456, 2 ** 20, 2 ** 20 + 1, 2 ** 40]
    values += [b + d for b in layout.upper_bounds[::7] for d in (0, 1)]
    selftest.attach_uprobe("probe_return", "libc.so.6", "labs", pid=os.getpid(), retprobe=True)
    for v in values:
        LIBC.labs(ctypes.c_long(v))
    got = parse_hist(selftest.map("returned_values").lookup(struct.pack("<I", 0)), layout)
    expected = [0] * layout.slots
    for v in values:
        expected[layout.slot_for(v)] += 1
    assert got == KernelHistogram(tuple(expected), sum(values))


@needs_bpf
def test_uprobe_at_elf_offset(selftest):
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.exists():
        libc = Path("/lib/aarch64-linux-gnu/libc.so.6")
    offset = elfsym.symbol_file_offset(libc, "labs")
    selftest.attach_uprobe_at("probe_entry", str(libc), offset, pid=os.getpid(), label="labs")
    for _ in range(3):
        LIBC.labs(-5)
    assert struct.unpack("<Q", selftest.map("calls").lookup(struct.pack("<I", os.getpid()))) == (3,)


@needs_bpf
def test_uprobe_on_missing_symbol_is_attach_failed(selftest):
    with pytest.raises(BpfUnavailable) as info:
        selftest.attach_uprobe("probe_entry", "libc.so.6", "no_such_function_anywhere")
    assert info.value.reason == reasons.ATTACH_FAILED


@needs_bpf
def test_map_update_delete_and_iteration(selftest):
    calls = selftest.map("calls")
    assert (calls.key_size, calls.value_size, calls.per_cpu) == (4, 8, False)
    for k in range(10):
        calls.update(struct.pack("<I", 1_000_000 + k), struct.pack("<Q", k))
    items = {struct.unpack("<I", k)[0]: struct.unpack("<Q", v)[0] for k, v in calls.items()}
    assert {k: v for k, v in items.items() if k >= 1_000_000} == {1_000_000 + k: k for k in range(10)}
    assert calls.delete(struct.pack("<I", 1_000_000)) is True
    assert calls.delete(struct.pack("<I", 1_000_000)) is False
    assert calls.lookup(struct.pack("<I", 1_000_000)) is None
    with pytest.raises(ValueError):
        calls.lookup(b"\0")


@needs_bpf
@pytest.mark.parametrize("name", ["calls", "calls_percpu"])
def test_batched_items_match_iteration_across_several_batches(selftest, monkeypatch, name):
    """items() sweeps with BPF_MAP_LOOKUP_BATCH; with 4 entries a batch, a full map takes 16
    calls, and it must answer what key-by-key iteration answers (per-CPU values summed or split)."""
    from fabricscope.exporter.bpf_loader import libbpf
    monkeypatch.setattr(libbpf, "BATCH_ENTRIES", 4)
    bpf_map = selftest.map(name)
    for k in range(bpf_map.max_entries):
        bpf_map.update(struct.pack("<I", 5_000_000 + k), struct.pack("<Q", k + 1))
    batched = bpf_map._lookup_batched()
    assert batched is not None and len(batched) == bpf_map.max_entries      # this kernel has batch lookup
    swept = {k: v for k, v in bpf_map.items()}
    split = {k: v for k, v in bpf_map.items(per_cpu=True)}
    bpf_map._no_batch = True                 # key by key, as on a kernel without batch lookup
    assert swept == dict(bpf_map.items())
    assert split == dict(bpf_map.items(per_cpu=True))
    cpus = bpf_map.ncpus
    assert {struct.unpack("<I", k)[0]: struct.unpack("<Q", v)[0] for k, v in swept.items()} == \
        {5_000_000 + k: (k + 1) * cpus for k in range(bpf_map.max_entries)}


@needs_bpf
def test_batched_items_of_an_empty_map(selftest):
    empty = selftest.map("calls_percpu")
    assert empty._lookup_batched() == [] and empty.items() == []


@needs_bpf
def test_full_map_is_map_full(selftest):
    calls = selftest.map("calls")
    for k in range(calls.max_entries):
        calls.update(struct.pack("<I", 2_000_000 + k), struct.pack("<Q", 1))
    with pytest.raises(BpfUnavailable) as info:
        calls.update(struct.pack("<I", 3_000_000), struct.pack("<Q", 1))
    assert info.value.reason == reasons.MAP_FULL


@needs_bpf
def test_program_stats_count_runs_while_enabled(bpf_objects):
    from fabricscope.exporter.bpf_loader.libbpf import BpfObject, enable_bpf_stats
    stats = enable_bpf_stats()
    try:
        with BpfObject.load(bpf_objects / "sched.bpf.o") as obj:
            obj.attach("sched_switch")
            for _ in range(50):
                os.sched_yield()
                subprocess.run(["true"])
            run_count, run_ns = obj.program_stats()["sched_switch"]
            assert run_count > 0 and run_ns > 0
    finally:
        stats.close()


@needs_bpf
def test_closed_object_refuses_reads(bpf_objects):
    from fabricscope.exporter.bpf_loader.libbpf import BpfObject
    obj = BpfObject.load(bpf_objects / "sched.bpf.o")
    counter = obj.map("fabric_sched_context_switches_total")
    obj.close()
    obj.close()   # idempotent
    with pytest.raises(ValueError, match="closed"):
        counter.items()


# ---- malformed ELF files: a per-file, counted refusal ------------------------------------

def _libc_bytes() -> bytes:
    for candidate in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                      "/lib/aarch64-linux-gnu/libc.so.6", "/usr/lib/aarch64-linux-gnu/libc.so.6"):
        if Path(candidate).is_file():
            return Path(candidate).read_bytes()
    pytest.fail("no system libc to corrupt")


@pytest.mark.parametrize("corrupt", [
    lambda b: b[:0x30],                                        # truncated inside the header
    lambda b: b[:len(b) // 3],                                 # section headers cut off
    lambda b: b[:0x28] + (2 ** 63).to_bytes(8, "little") + b[0x30:],   # e_shoff far outside
    lambda b: b[:0x3A] + (1).to_bytes(2, "little") + b[0x3C:],         # section header size 1
    lambda b: b"\x7fELF\x02\x01" + b"\0" * 10,                 # a header and nothing else
    lambda b: b"\x7fELF\x01\x01" + b"\0" * 100,                # ELF32
])
def test_malformed_elf_is_an_elf_error_and_counted(tmp_path, corrupt):
    from fabricscope.exporter.nccl import discovery

    bad = tmp_path / "libnccl.so.2"
    bad.write_bytes(corrupt(_libc_bytes()))
    before = sum(elfsym.MALFORMED_FILES.values())
    with pytest.raises(elfsym.ElfError):
        discovery.exported_functions(str(bad))
    with pytest.raises(elfsym.ElfError):
        elfsym.symbol_file_offset(bad, "labs")
    assert sum(elfsym.MALFORMED_FILES.values()) == before + 2
