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
        (comm_label(0xAB), 1, 4, "memory", "attach")
    assert [c for c, _, _ in tracker.snapshot().comms] == [comm_label(0xAB)]
    assert handler.learned == [(10, 0x5000, 0xAB, 0)]
    assert handler.sources() == {("memory", "", "attach"): 1}


def test_memory_that_cannot_be_read_is_a_reason(tmp_path):
    layout = CommLayout(rank_at=0x2000)
    with pytest.raises(CommUnreadable) as absent:
        commread.read_comm(tmp_path, 12345, 0x1000, layout)          # no such process under this procfs
    assert absent.value.reason == "memory_unreadable"


# ---- the join after a restart: sequence bases from the previous exporter's marks ---------------

P = 46_000_000          # ns: a step of 6 ms with the last rank 40 ms late


@pytest.mark.parametrize("saved_late_seq, saved_late_entry", [
    (1000, 1_040_000_000),      # saved when both had entered op 1000 (the late rank 40 ms after)
    (999, 994_000_000),         # saved while rank 0 was in op 1000 and rank 2 not yet
])
def test_ranks_counted_from_an_attach_one_op_apart_are_joined_as_before(saved_late_seq, saved_late_entry):
    from fabricscope.exporter.nccl.alignment import RankMark, sequence_bases

    before = {0: RankMark(1000, 1_000_000_000), 2: RankMark(saved_late_seq, saved_late_entry)}
    # Attached while rank 0 waited in op 1100 and rank 2 had not entered it: rank 2's first
    # counted op is 1100, rank 0's 1101. Now, 30 counted ops later:
    now = {0: RankMark(30, 1_000_000_000 + 130 * P + 300_000), 2: RankMark(31, 1_040_000_000 + 130 * P - 200_000)}
    bases = sequence_bases(before, now, P)
    assert bases[0] == 0                               # the lowest rank keeps its count
    assert {r: now[r].seq + bases[r] for r in now} == {0: 30, 2: 30}


def test_a_downtime_that_is_no_whole_number_of_periods_shifts_every_rank_alike():
    from fabricscope.exporter.nccl.alignment import RankMark, sequence_bases

    before = {0: RankMark(10, 0), 1: RankMark(10, 1_000)}
    now = {0: RankMark(5, 20 * P + P // 2 - 10), 1: RankMark(5, 20 * P + P // 2 + 1_000)}   # jitter of half a period
    joined = {r: now[r].seq + b for r, b in sequence_bases(before, now, P).items()}
    assert joined[0] == joined[1]
    with pytest.raises(ValueError):
        sequence_bases(before, {0: now[0]}, P)


@pytest.mark.parametrize("stored, loaded", [
    ({"boot_id": "b1", "ranks": [["00000000000000ab", 0, 10, 7, 1000]]}, {("00000000000000ab", 0, 10): (7, 1000)}),
    ({"boot_id": "b0", "ranks": [["00000000000000ab", 0, 10, 7, 1000]]}, {}),      # another boot's clock
    ({"boot_id": "b1", "ranks": [["00000000000000ab", 0, 10, -7, 1000]]}, {}),     # no sequence number
    ({"boot_id": "b1", "ranks": 5}, {}),
    ({"boot_id": "b1", "ranks": [["x", 0]]}, {}),
])
def test_saved_marks_are_taken_only_from_this_boot_and_only_when_they_are_marks(tmp_path, stored, loaded):
    import json

    from fabricscope.exporter.nccl.uprobe import UprobeSource

    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("b1\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "state/nccl_sequences.json").write_text(json.dumps(stored))
    source = UprobeSource(tmp_path / "proc", tmp_path / "sys", tmp_path / "nccl.bpf.o", state_dir=tmp_path / "state")
    marks = source._load_marks()
    assert {key: (m.seq, m.entry_ns) for key, m in marks.items()} == loaded
    problem, write_errors, boot_changes = source.marks_state()
    assert boot_changes == (1 if stored["boot_id"] != "b1" else 0) and write_errors == 0
    assert problem == (None if loaded or stored["boot_id"] != "b1" else "corrupt")


# ---- root: the real exporter process and a job that started before it -------------------------

@pytest.fixture(scope="module")
def fake_nccl(tmp_path_factory):
    require_tool("gcc")
    library, _ = build_fake_nccl(tmp_path_factory.mktemp("nccl_fake"))
    return library, build_step_driver(library.parent)


def test_the_fake_librarys_layout_is_found_from_its_accessors(fake_nccl):
    library, _ = fake_nccl
    layout = commlayout.library_layout(str(library))
    assert layout.rank_at % 4 == 0 and layout.rank_at > 8000     # after its 9000-byte "channels"


class RunningJob:
    """NRANKS step-driver ranks on their own communicator, released at once: a job that
    runs before (and while) the exporter is started."""

    def __init__(self, driver: Path, tmp_path: Path, nranks: int, delays: dict[int, int], go: bool = True) -> None:
        barrier = tmp_path / "barrier"
        barrier.write_bytes(b"\0" * 64)
        salt = random.randrange(1, 256)
        self.comm = comm_label(identity.comm_hash(_salted_unique_id(salt)))
        self.procs = [subprocess.Popen([str(driver), str(nranks), str(rank), "1000000", str(delays.get(rank, 0)), "0",
                                        str(barrier)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       env={**os.environ, "FAKE_NCCL_ID_SALT": str(salt),
                                            "FAKE_NCCL_CUDA_DEV": str(rank)})
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


@pytest.mark.timing
def test_a_job_started_before_the_exporter_and_an_exporter_killed_mid_job_name_every_rank(
        root_bpf, fake_nccl, tmp_path):
    _, driver = fake_nccl
    nranks = 3
    job = RunningJob(driver, tmp_path, nranks, delays={})
    exporters = []
    try:
        time.sleep(2)                                  # the job is well under way, unseen
        first = ExporterProcess(tmp_path, root_bpf)
        exporters.append(first)
        named_within(first, job, nranks)
        samples = first.samples()
        assert samples[series("fabric_nccl_comm_identities", source="memory", reason="", join="attach")] >= nranks
        assert not any(k.startswith("fabric_nccl_comm_info") and 'rank="-1"' in k and job.comm in k for k in samples)
        first.kill()                                   # mid-job, no clean-up of any kind
        assert job.running()
        second = ExporterProcess(tmp_path, root_bpf)
        exporters.append(second)
        named_within(second, job, nranks)
        # The first one's marks (saved every 5 s, 3 s of life here at least once at start):
        # joined on them, or from the attach when none had been written yet.
        joins = {k for k, v in second.samples().items() if k.startswith("fabric_nccl_comm_identities") and v}
        assert any('join="saved"' in k or 'join="attach"' in k for k in joins), joins
        assert job.running()                           # the job never noticed
    finally:
        for exporter in exporters:
            exporter.kill()
        job.kill()


@pytest.mark.timing
def test_an_exporter_restarted_while_a_rank_is_late_to_every_step_shows_that_rank_late(root_bpf, fake_nccl, tmp_path):
    """Killed while rank 2 sleeps 40 ms before every all-reduce, its peers waiting: counted
    from the attach, the ranks would be joined one op apart (the lag shown on the others).
    The restarted exporter joins them on the marks the first one saved."""
    library, driver = fake_nccl
    nranks, delay = 3, 0.040
    first = ExporterProcess(tmp_path, root_bpf)           # sees the init
    exporters = [first]
    job = None
    try:
        job = RunningJob(driver, tmp_path, nranks, delays={2: int(delay * 1e6)}, go=False)
        attached = series("fabric_nccl_probe_attached", library=str(library))
        wait_until(lambda: first.samples().get(attached) == 1, "probes on the job's library before its init")
        job.go()
        named_within(first, job, nranks, deadline=60)
        assert first.samples()[series("fabric_nccl_comm_identities", source="init", reason="", join="init")] >= nranks
        time.sleep(UPROBE_SAVE_SECONDS + 1)               # the marks saved at least once
        first.kill()
        second = ExporterProcess(tmp_path, root_bpf)
        exporters.append(second)
        named_within(second, job, nranks)
        wait_until(lambda: second.samples().get(series("fabric_nccl_comm_identities", source="memory", reason="",
                                                       join="saved"), 0) >= nranks, "ranks joined on saved marks")
        def lag():
            return {r: (second.samples().get(series("fabric_nccl_arrival_lag_seconds_sum", comm=job.comm, rank=str(r))),
                                   second.samples().get(series("fabric_nccl_arrival_lag_seconds_count", comm=job.comm, rank=str(r))))
                               for r in range(nranks)}
        wait_until(lambda: all((c or 0) >= 20 for _, c in lag().values()), "joined arrivals after the restart")
        start = lag()
        time.sleep(3)
        end = lag()
        mean = {r: (end[r][0] - start[r][0]) / (end[r][1] - start[r][1]) for r in range(nranks)}
        assert mean[2] == pytest.approx(delay, rel=0.15), mean
        assert all(mean[r] < 0.1 * delay for r in (0, 1)), mean
        assert job.running()
    finally:
        for exporter in exporters:
            exporter.kill()
        if job is not None:
            job.kill()


UPROBE_SAVE_SECONDS = 5.0       # UprobeSource.SAVE_SECONDS


def wait_until(predicate, what, deadline=30.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {what}")
