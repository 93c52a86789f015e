"""An exporter that starts, or restarts, while a job runs: it names the job's communicators
from the communicators themselves (exporter/nccl/commlayout.py, commread.py), with the
values an exporter that saw the init reports.

Pure parts first (the layout search, the checks on what is read); then, as root, the real
exporter process and a fake-libnccl job started before it, and the same exporter killed
with SIGKILL mid-job and started again."""
from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from fabricscope.exporter.nccl import commlayout, commread
from fabricscope.exporter.nccl.commid import comm_label
from fabricscope.exporter.nccl.commlayout import CommLayout, LayoutUnknown, layout_from_code
from fabricscope.exporter.nccl.commread import CommUnreadable, decode_comm_fields
from tests.conftest import could_not_run, free_port, require_tool
from tests.nccl_fake import identity
from tests.nccl_fake.build import build_fake_nccl, build_step_driver

# ---- the layout, from the accessors' code ----------------------------------------------------


def accessor(offset: int) -> bytes:
    """mov eax, [rdi+offset]; mov [rsi], eax; xor eax, eax; ret (what gcc -O2 makes of one)."""
    return b"\x8b\x87" + struct.pack("<i", offset) + b"\x89\x06\x31\xc0\xc3"


def test_the_rank_offset_is_the_one_the_three_accessors_agree_on():
    # Other displacements around (NVTX ranges, checks) do not line up as rank, +4, +8.
    noise = accessor(0x1230) + accessor(0x40000)
    layout = layout_from_code(noise + accessor(0x23D8), accessor(0x23DC) + noise, accessor(0x23E0))
    assert layout == CommLayout(rank_at=0x23D8) and layout.hash_at == 0x23D0


def test_a_layout_that_is_not_nccls_is_refused_with_a_reason():
    with pytest.raises(LayoutUnknown) as missing:
        layout_from_code(accessor(0x2000), accessor(0x2010), accessor(0x2008))     # nRanks not at rank+4
    assert missing.value.reason == "layout_not_found"
    two = accessor(0x2000) + accessor(0x3000)
    with pytest.raises(LayoutUnknown) as ambiguous:
        layout_from_code(two, accessor(0x2004) + accessor(0x3004), accessor(0x2008) + accessor(0x3008))
    assert ambiguous.value.reason == "layout_ambiguous"


def test_a_library_without_the_accessors_has_no_layout(tmp_path):
    require_tool("gcc")
    library = tmp_path / "libnccl.so.2"
    source = tmp_path / "lib.c"
    source.write_text("int ncclCommUserRank(void *c, int *r) { *r = ((int *)c)[2300]; return 0; }\n")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", library, source], check=True)
    with pytest.raises(LayoutUnknown) as refused:
        commlayout.library_layout(str(library))
    assert refused.value.reason == "no_accessors"
    with pytest.raises(LayoutUnknown) as gone:
        commlayout.library_layout(str(tmp_path / "absent.so"))
    assert gone.value.reason == "library_unreadable"


def store_version(code: int) -> bytes:
    """test rdi, rdi; je +8; mov dword [rdi], code; xor eax, eax; ret (ncclGetVersion)."""
    return b"\x48\x85\xff\x74\x08\xc7\x07" + struct.pack("<i", code) + b"\x31\xc0\xc3"


def test_the_release_is_the_version_code_ncclgetversion_stores():
    assert commlayout.version_from_code(store_version(22809)) == "2.28.9"
    assert commlayout.version_from_code(store_version(21803)) == "2.18.3"
    assert commlayout.version_from_code(b"\x31\xc0\xc3") is None                    # no store
    assert commlayout.version_from_code(store_version(22809) + store_version(22703)) is None


def test_the_release_is_read_from_the_init_banner_when_the_code_does_not_say(tmp_path):
    library = tmp_path / "libnccl.so.2"
    library.write_bytes(b"\0ELF... NCCL version 2.27.5+cuda12.9\0 ...")
    assert commlayout.version_from_banner(str(library)) == "2.27.5"
    library.write_bytes(b"NCCL version 2.27.5+cuda12.9\0NCCL version 2.28.9+cuda12.9\0")   # two: no answer
    assert commlayout.version_from_banner(str(library)) is None
    assert commlayout.version_from_banner(str(tmp_path / "absent")) is None


def test_a_counter_is_taken_only_for_a_tabled_release_with_the_releases_layout():
    rank_at, counter = commlayout.COUNTERS["2.18.1"]
    assert commlayout.with_counter(CommLayout(rank_at), "2.18.1").counter == counter
    assert counter.via and counter.words == 1                         # sharedRes->collOpCount
    assert commlayout.with_counter(CommLayout(rank_at), None).counter_reason == "version_unknown"
    assert commlayout.with_counter(CommLayout(rank_at), "2.31.1").counter_reason == "release_not_tabled"
    rebuilt = commlayout.with_counter(CommLayout(rank_at + 8), "2.18.1")   # not the shipped build
    assert rebuilt.counter is None and rebuilt.counter_reason == "layout_not_release"


@pytest.mark.parametrize("raw, reason", [
    (struct.pack("<Qiii", 0, 0, 2, 0), "implausible_fields"),            # no hash: not initialised
    (struct.pack("<Qiii", 7, 2, 2, 0), "implausible_fields"),            # rank outside its size
    (struct.pack("<Qiii", 7, 0, 0, 0), "implausible_fields"),            # size 0
    (struct.pack("<Qiii", 7, -1, 4, 0), "implausible_fields"),
    (struct.pack("<Qiii", 7, 0, 4, -3), "implausible_fields"),           # not a device
    (b"\1" * 10, "short_read"),
])
def test_fields_that_cannot_be_a_communicators_are_refused(raw, reason):
    with pytest.raises(CommUnreadable) as refused:
        decode_comm_fields(raw)
    assert refused.value.reason == reason


def test_fields_of_a_communicator_are_taken():
    fields = decode_comm_fields(struct.pack("<Qiii", 0xABCDEF, 3, 8, 5))
    assert (fields.comm_hash, fields.rank, fields.nranks, fields.cuda_dev) == (0xABCDEF, 3, 8, 5)


def test_a_comm_unreadable_at_first_is_read_again_and_its_placeholder_goes():
    from fabricscope.exporter.nccl.commread import CommFields
    from fabricscope.exporter.nccl.tracker import NcclTracker
    from fabricscope.exporter.nccl.uprobe import EventHandler

    now = [0.0]
    answers = [CommUnreadable("implausible_fields", "not yet"), CommFields(0xAB, 1, 4, 1)]

    def identify(pid, pointer):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    tracker = NcclTracker()
    handler = EventHandler(tracker, identify=identify, clock=lambda: now[0])
    first = handler.comm(10, 0x5000)
    assert first.label.startswith("unknown-") and first.rank == -1 and first.reason == "implausible_fields"
    tracker.register_comm(first.label, -1, 0)
    assert handler.comm(10, 0x5000) is first and answers           # not tried again at once
    now[0] += EventHandler.RETRY_SECONDS + 1
    named = handler.comm(10, 0x5000)
    assert (named.label, named.rank, named.nranks, named.source, named.join) == \
        (comm_label(0xAB), 1, 4, "memory", "none")           # numbered once NCCL's counter is seen exact
    assert [c for c, _, _ in tracker.snapshot().comms] == [comm_label(0xAB)]
    assert handler.learned == [(10, 0x5000, 0xAB, None)]
    assert handler.sources() == {("memory", "", "none"): 1}


def test_memory_that_cannot_be_read_is_a_reason(tmp_path):
    layout = CommLayout(rank_at=0x2000)
    with pytest.raises(CommUnreadable) as absent:
        commread.read_comm(tmp_path, 12345, 0x1000, layout)          # no such process under this procfs
    assert absent.value.reason == "memory_unreadable"


# ---- root: the real exporter process and a job that started before it -------------------------

@pytest.fixture(scope="module")
def fake_nccl(tmp_path_factory):
    require_tool("gcc")
    library, _ = build_fake_nccl(tmp_path_factory.mktemp("nccl_fake"))
    return library, build_step_driver(library.parent)


def test_the_fake_librarys_layout_is_found_from_its_accessors(fake_nccl):
    library, _ = fake_nccl
    layout = commlayout.library_layout(str(library))
    # NCCL 2.28.9's, as the fake lays it out: the counter from the release's table.
    assert (layout.rank_at, layout.version) == (0x1044D0, "2.28.9")
    assert layout.counter == commlayout.COUNTERS["2.28.9"][1] and layout.counter.name == "seqNumber"


class RunningJob:
    """NRANKS step-driver ranks on their own communicator, released at once: a job that
    runs before (and while) the exporter is started."""

    def __init__(self, driver: Path, tmp_path: Path, nranks: int, delays: dict[int, int], go: bool = True,
                 second_us: int | None = None) -> None:
        """second_us: each step's second, one-float all-reduce that long after the first."""
        barrier = tmp_path / "barrier"
        barrier.write_bytes(b"\0" * 64)
        salt = random.randrange(1, 256)
        self.comm = comm_label(identity.comm_hash(_salted_unique_id(salt)))
        self.procs = [subprocess.Popen([str(driver), str(nranks), str(rank), "1000000", str(delays.get(rank, 0)), "0",
                                        str(barrier)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       env={**os.environ, "FAKE_NCCL_ID_SALT": str(salt),
                                            "FAKE_NCCL_CUDA_DEV": str(rank),
                                            **({"FAKE_STEPS_SECOND_US": str(second_us)} if second_us is not None
                                               else {})})
                      for rank in range(nranks)]
        for proc in self.procs:
            assert proc.stdout.readline().strip() == "ready"
        if go:
            self.go()

    def go(self) -> None:
        """Initialise the communicator and run."""
        for proc in self.procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def running(self) -> bool:
        return all(proc.poll() is None for proc in self.procs)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _salted_unique_id(salt: int) -> bytes:
    unique_id = bytearray((i * 37 + 11) & 0xFF for i in range(128))    # ncclGetUniqueId in fake_nccl.c
    unique_id[100] ^= salt
    return bytes(unique_id)


class ExporterProcess:
    """`fabricscope exporter` with only the nccl collector, as a process of its own (SIGKILL
    must hit the real thing, BPF links and all)."""

    def __init__(self, tmp_path: Path, bpf_object: Path) -> None:
        self.port = free_port()
        config = tmp_path / "exporter.yaml"
        config.write_text(yaml.safe_dump({"nccl": {"bpf_object": str(bpf_object), "boundary_ops": 10}}))
        from fabricscope.exporter.framework import load_collector_modules

        disabled = [f"--no-collector.{name}" for name in load_collector_modules() if name != "nccl"]
        self.log = open(tmp_path / f"exporter-{self.port}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "fabricscope.cli", "exporter",
                                      f"--web.listen-address=127.0.0.1:{self.port}", f"--config.file={config}",
                                      f"--path.state={tmp_path}/state", "--node-name=n1", *disabled],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.started = time.monotonic()

    def samples(self) -> dict[str, float]:
        try:
            text = requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        except requests.ConnectionError:
            if self.proc.poll() is not None:
                raise AssertionError(f"the exporter exited: {Path(self.log.name).read_text()[-2000:]}")
            return {}
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def series(name, **labels):
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted({**labels, "node": "n1"}.items())) + "}"


def named_within(exporter: ExporterProcess, job: RunningJob, nranks: int, deadline: float = 30.0) -> float:
    """Seconds from the exporter's start until every rank of the job is named with its comm
    id, rank and size, and counted; fails past `deadline`."""
    wanted = [series("fabric_nccl_comm_info", comm=job.comm, rank=str(r), nranks=str(nranks)) for r in range(nranks)]
    calls = [series("fabric_nccl_calls_total", comm=job.comm, rank=str(r), op="AllReduce") for r in range(nranks)]
    while time.monotonic() - exporter.started < deadline:
        assert job.running()
        samples = exporter.samples()
        if all(samples.get(w) == 1 for w in wanted) and all(samples.get(c, 0) > 0 for c in calls):
            return time.monotonic() - exporter.started
        time.sleep(0.2)
    unknown = sorted(k for k in exporter.samples() if "unknown-" in k or "comm_identities" in k)
    raise AssertionError(f"ranks not named within {deadline}s; unknown/identity series: {unknown[:10]}")


@pytest.fixture
def root_bpf():
    if os.geteuid() != 0:
        pytest.skip("needs root: uprobes load BPF programs")
    from fabricscope.exporter.bpf_loader import objects, reasons

    problem = reasons.preflight()
    if problem:
        pytest.skip(f"eBPF unavailable here: {problem[1]}")
    path = objects.object_path("nccl")
    ok, output = objects.build()
    if not ok or not path.is_file():
        could_not_run(f"cannot build nccl.bpf.o: {output[-300:]}")
    return path


def lag_window(exporter: ExporterProcess, comm: str, nranks: int, seconds: float) -> dict[int, tuple[float, float]]:
    """Each rank's (mean arrival lag, share of its ops with a lag of at most 1 ms) over the
    next `seconds`, from the exporter's histogram."""
    def lag():
        samples = exporter.samples()
        return {r: [samples.get(series(f"fabric_nccl_arrival_lag_seconds_{part}", comm=comm, rank=str(r), **labels), 0.0)
                    for part, labels in (("sum", {}), ("count", {}), ("bucket", {"le": "0.001"}))]
                for r in range(nranks)}
    start = lag()
    time.sleep(seconds)
    end = lag()
    out = {}
    for r in range(nranks):
        total, count, within = (b - a for a, b in zip(start[r], end[r]))
        assert count >= 20, (r, start, end)
        out[r] = (total / count, within / count)
    return out


def numbered_by_nccl(exporter: ExporterProcess, comm: str, nranks: int) -> bool:
    samples = exporter.samples()
    return all(samples.get(series("fabric_nccl_rank_numbering", comm=comm, rank=str(r), numbering="counter",
                                  reason="")) == 1 for r in range(nranks))


# A job shaped like the device runs (docs/nccl.md): 4 ranks, a large all-reduce then a small
# one 1 ms later each step (ops unevenly spaced: no period turns time into an op count), the
# last rank 5 ms late to every step.
NRANKS, LATE, DELAY = 4, 3, 0.005


def assert_only_the_late_rank_lags(lags: dict[int, tuple[float, float]]) -> None:
    """The late rank late to (almost) every op by about the delay; every other rank on time
    to most ops (4 ranks and an exporter share 2 busy CPUs here: a few ops of a healthy rank
    come late by a wake-up; ranks joined one op apart would be 1 or 6 ms off on half)."""
    mean, on_time = lags[LATE]
    assert 0.8 * DELAY < mean < DELAY + 0.003 and on_time < 0.05, lags     # + its sleep's overshoot
    assert all(lags[r][0] < DELAY / 2 and lags[r][1] > 0.8 for r in range(NRANKS) if r != LATE), lags


@pytest.mark.timing
def test_an_exporter_started_after_the_job_numbers_its_ops_as_nccl_does(root_bpf, fake_nccl, tmp_path):
    _, driver = fake_nccl
    job = RunningJob(driver, tmp_path, NRANKS, delays={LATE: int(DELAY * 1e6)}, second_us=1000)
    exporter = None
    try:
        time.sleep(1.5)                                # well under way, unseen, a rank late
        exporter = ExporterProcess(tmp_path, root_bpf)
        named_within(exporter, job, NRANKS)
        wait_until(lambda: numbered_by_nccl(exporter, job.comm, NRANKS), "ranks numbered by NCCL's counter")
        samples = exporter.samples()
        sequences = [samples[series("fabric_nccl_operation_sequence", comm=job.comm, rank=str(r))]
                     for r in range(NRANKS)]
        counted = [samples[series("fabric_nccl_calls_total", comm=job.comm, rank=str(r), op="AllReduce")]
                   for r in range(NRANKS)]
        # NCCL's numbers, from the comm's first op: far beyond what the probes saw.
        assert all(seq > calls + 100 for seq, calls in zip(sequences, counted)), (sequences, counted)
        assert_only_the_late_rank_lags(lag_window(exporter, job.comm, NRANKS, 2.0))
        assert job.running()
    finally:
        if exporter is not None:
            exporter.kill()
        job.kill()


@pytest.mark.timing
def test_an_exporter_killed_and_restarted_mid_job_shows_the_late_rank_and_only_it(root_bpf, fake_nccl, tmp_path):
    """SIGKILLed mid-job and started again with the same state dir: NCCL's own counter
    numbers the ops alike on every rank, whatever each rank did while no exporter ran."""
    library, driver = fake_nccl
    first = ExporterProcess(tmp_path, root_bpf)           # sees the init
    exporters = [first]
    job = None
    try:
        job = RunningJob(driver, tmp_path, NRANKS, delays={LATE: int(DELAY * 1e6)}, go=False, second_us=1000)
        attached = series("fabric_nccl_probe_attached", library=str(library))
        wait_until(lambda: first.samples().get(attached) == 1, "probes on the job's library before its init")
        job.go()
        named_within(first, job, NRANKS, deadline=60)
        wait_until(lambda: numbered_by_nccl(first, job.comm, NRANKS), "ranks numbered by NCCL's counter")
        assert_only_the_late_rank_lags(lag_window(first, job.comm, NRANKS, 1.0))
        first.kill()                                   # mid-job, no clean-up of any kind
        time.sleep(random.uniform(0.5, 2.0))
        assert job.running()
        second = ExporterProcess(tmp_path, root_bpf)
        exporters.append(second)
        named_within(second, job, NRANKS)              # the same comm id: job.comm
        wait_until(lambda: numbered_by_nccl(second, job.comm, NRANKS), "ranks numbered after the restart")
        assert_only_the_late_rank_lags(lag_window(second, job.comm, NRANKS, 2.0))
        assert job.running()
    finally:
        for exporter in exporters:
            exporter.kill()
        if job is not None:
            job.kill()


GROUPED_RANK = """
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
uid, comm = UniqueId(), ctypes.c_void_p()
lib.ncclGetUniqueId(ctypes.byref(uid))
lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)
buf = (ctypes.c_float * 16)()
ar = lambda: lib.ncclAllReduce(buf, buf, 16, 7, 0, comm, None)
calls, end = 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    lib.ncclGroupStart(); ar(); ar(); ar(); lib.ncclGroupEnd()       # three launched at the group's end
    lib.ncclSend(buf, 4, 7, 0, comm, None)                          # P2P: not numbered
    ar()
    calls += 4
    time.sleep(0.002)
print(calls, flush=True)
sys.stdin.readline()
"""


@pytest.mark.timing
def test_grouped_collectives_are_numbered_exactly_as_nccl_counts_them(root_bpf, fake_nccl, tmp_path):
    """Groups of three collectives launched at the group's end, a Send and a single call per
    round, the exporter started mid-job: once numbered, a rank's latest op carries NCCL's
    count of the collectives it called, exactly."""
    library, _ = fake_nccl
    script = tmp_path / "grouped.py"
    script.write_text(GROUPED_RANK)
    rank = subprocess.Popen([sys.executable, str(script), str(library), "6"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "FAKE_NCCL_ID_SALT": "77"})
    exporter = None
    try:
        time.sleep(1.0)
        exporter = ExporterProcess(tmp_path, root_bpf)
        comm = comm_label(identity.comm_hash(_salted_unique_id(77)))
        wait_until(lambda: numbered_by_nccl(exporter, comm, 1), "the rank numbered by NCCL's counter")
        calls = int(rank.stdout.readline())              # the rank stopped: its count of collectives
        seen = series("fabric_nccl_operation_sequence", comm=comm, rank="0")
        wait_until(lambda: exporter.samples().get(seen) == calls, f"sequence {calls}", deadline=5)
    finally:
        if exporter is not None:
            exporter.kill()
        rank.kill()
        rank.wait()


@pytest.mark.timing
def test_a_release_without_a_known_counter_is_not_judged_and_says_why(root_bpf, tmp_path):
    """A library whose release has no row in the counter table, started before the exporter:
    its ranks are named, but no number is guessed: no sequence, no lag, the reason exported."""
    require_tool("gcc")
    library, _ = build_fake_nccl(tmp_path, version_code=23101)          # NCCL 2.31.1: not tabled
    driver = build_step_driver(tmp_path)
    job = RunningJob(driver, tmp_path, NRANKS, delays={LATE: int(DELAY * 1e6)}, second_us=1000)
    exporter = None
    try:
        time.sleep(1.0)
        exporter = ExporterProcess(tmp_path, root_bpf)
        named_within(exporter, job, NRANKS)
        time.sleep(2.5)                                 # several reads of the kernel's state
        samples = exporter.samples()
        for r in range(NRANKS):
            assert samples.get(series("fabric_nccl_rank_numbering", comm=job.comm, rank=str(r), numbering="none",
                                      reason="release_not_tabled")) == 1, r
        judged = [k for k in samples if job.comm in k and ("arrival_lag" in k or "operation_sequence" in k
                                                          or "sequence_boundary" in k or "culprit" in k)]
        assert judged == []
        assert samples[series("fabric_nccl_calls_total", comm=job.comm, rank=str(LATE), op="AllReduce")] > 0
    finally:
        if exporter is not None:
            exporter.kill()
        job.kill()


def wait_until(predicate, what, deadline=30.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {what}")
