"""A hostile or broken node: what a corrupted sysfs/procfs tree or state file does to the
exporter. Each test reproduces one attack and checks the exporter still answers, reports
the problem as a read error, and keeps every healthy series."""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import requests

from fabricscope.exporter.context import Context
from fabricscope.exporter.exposition import render
from fabricscope.exporter.framework import STAGGER_SECONDS, Collector, ScrapeCollector
from fabricscope.exporter.main import start_exporter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from tests.test_infiniband_collector import Node, port1, value

FIXTURE_PROC = Path(__file__).parent / "fixtures" / "node" / "proc"


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


def counters(node: Node, device: str = "mlx5_1") -> Path:
    return node.port(device) / "counters"


def read_errors(registry, device: str) -> dict[str, float]:
    return {s.labels["reason"]: s.value for f in registry.collect() if f.name == "fabric_infiniband_device_read_errors"
            for s in f.samples if s.labels["device"] == device}


def series(registry) -> int:
    return sum(len(f.samples) for f in registry.collect())


# ---- 2: a FIFO where a file belongs ----------------------------------------------------

def test_fifo_counter_is_a_read_error_and_blocks_nothing(node, port):
    node.proc.joinpath("net").mkdir(parents=True, exist_ok=True)
    for name in ("snmp", "netstat"):
        shutil.copy(FIXTURE_PROC / "net" / name, node.proc / "net" / name)
    fifo = counters(node) / "port_rcv_packets"
    fifo.unlink()
    os.mkfifo(fifo)
    (node.proc / "net" / "snmp").unlink()
    os.mkfifo(node.proc / "net" / "snmp")
    ctx = Context(sysfs=node.sys, procfs=node.proc, state_dir=node.state_dir, node="n")
    exporter = start_exporter(ctx, ["infiniband", "tcp"], f"127.0.0.1:{port}", collector_timeout=3)
    try:
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)   # worker threads start here
        before = threading.active_count()
        for _ in range(5):
            started = time.monotonic()
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            assert time.monotonic() - started < 2.5
        assert threading.active_count() <= before + 1   # nothing piles up per scrape
    finally:
        exporter.stop()
    assert 'fabric_infiniband_device_read_errors{device="mlx5_1",node="n",reason="not_a_file"} 1.0' in text
    assert 'fabric_tcp_procfs_read_errors{file="snmp",node="n",reason="not_a_file"} 1.0' in text
    assert 'fabric_scrape_collector_success{collector="infiniband",node="n"} 1.0' in text
    assert 'fabric_infiniband_port_state{device="mlx5_0",node="n",port="1",state="ACTIVE"} 4.0' in text


class Stuck(Collector):
    """A source whose read never returns (a hung driver, a blocked kernel read)."""
    name = "stuck"

    def __init__(self, ctx, release: threading.Event) -> None:
        super().__init__(ctx)
        self.release = release
        self.calls = 0

    def collect(self):
        self.calls += 1
        self.release.wait()
        yield GaugeMetricFamily("fabric_stuck", "never seen while stuck", value=1)


class Healthy(Collector):
    name = "healthy"

    def collect(self):
        yield GaugeMetricFamily("fabric_healthy", "always there", value=1)


def test_a_stuck_collector_misses_its_deadline_alone_and_is_not_restarted_while_stuck():
    release = threading.Event()
    stuck = Stuck(Context(), release)
    scrape = ScrapeCollector([stuck, Healthy(Context())], timeout=0.3)
    try:
        threads = threading.active_count()
        for _ in range(4):
            started = time.monotonic()
            text = render(scrape.families()).decode()
            assert time.monotonic() - started < 1.5
            assert 'fabric_scrape_collector_success{collector="stuck"} 0.0' in text
            assert 'fabric_scrape_collector_success{collector="healthy"} 1.0' in text
            assert "fabric_healthy 1.0" in text and "fabric_stuck" not in text
        assert stuck.calls == 1                       # still stuck: never started twice
        assert threading.active_count() <= threads + 2
        release.set()
        time.sleep(0.1)
        text = render(scrape.families()).decode()
        assert 'fabric_scrape_collector_success{collector="stuck"} 1.0' in text and "fabric_stuck 1.0" in text
    finally:
        release.set()
        scrape.close()


class Overlap(Collector):
    """Records how many collectors of its kind were inside collect() at once."""
    inside = 0
    most = 0
    lock = threading.Lock()

    def __init__(self, ctx, name: str) -> None:
        super().__init__(ctx)
        self.name = name
        self.started_at: float | None = None

    def collect(self):
        with Overlap.lock:
            Overlap.inside += 1
            Overlap.most = max(Overlap.most, Overlap.inside)
        self.started_at = time.monotonic()
        time.sleep(0.002)   # a system call: the GIL is free for another collector to take
        with Overlap.lock:
            Overlap.inside -= 1
        yield GaugeMetricFamily(f"fabric_{self.name}", "there", value=1)


def test_collectors_take_turns_and_a_stuck_one_holds_the_next_back_by_the_stagger_only():
    release = threading.Event()
    fast = [Overlap(Context(), f"fast{i}") for i in range(4)]
    scrape = ScrapeCollector([*fast[:2], Stuck(Context(), release), *fast[2:]], timeout=2.0)
    try:
        for scrape_number in range(3):
            started = time.monotonic()
            text = render(scrape.families()).decode()
            assert all(f'fabric_scrape_collector_success{{collector="{c.name}"}} 1.0' in text for c in fast)
            if scrape_number == 0:
                # The one after the stuck collector started within the stagger (plus slack
                # for a loaded machine), not at the deadline. Later scrapes skip the stuck
                # collector (still running) without waiting at all.
                assert fast[2].started_at - started < STAGGER_SECONDS + 0.5 < 2.0
        assert Overlap.most == 1     # fast collectors never ran beside each other
    finally:
        release.set()
        scrape.close()


# ---- 3, 4, 6: numbers no counter can hold ----------------------------------------------

@pytest.mark.parametrize("content, reason", [
    ("9" * 400, "out_of_range"),            # float() of it overflows the exposition
    ("\u00b2", "not_a_number"),               # isdigit() says yes, int() says no
    ("\u0661\u0662", "not_a_number"),         # Arabic-Indic digits: int() would accept them
    ("-5", "out_of_range"),                   # counters are unsigned
    (str(1 << 64), "out_of_range"),           # beyond 64 bits
    ("1_000", "not_a_number"),
])
def test_malformed_numbers_are_read_errors_and_healthy_devices_keep_every_series(node, content, reason):
    col = node.collector()
    healthy = series(node.scrape(col))
    (counters(node) / "port_rcv_packets").write_text(content + "\n")
    r = node.scrape(col)
    assert read_errors(r, "mlx5_1") == {reason: 1}
    assert value(r, "fabric_infiniband_port_counter_total", **port1("mlx5_1"), counter="port_rcv_packets") is None
    assert value(r, "fabric_infiniband_port_counter_total", **port1("mlx5_1"), counter="symbol_error") is not None
    # Only the bad counter's series is gone (and one read-error series is added).
    assert series(r) == healthy - 1 + 1


def test_a_negative_counter_does_not_latch_a_false_fatal_breach(node):
    col = node.collector()
    node.scrape(col)
    link_downed = counters(node, "mlx5_0") / "link_downed"
    original = link_downed.read_text()
    link_downed.write_text("-5\n")
    node.scrape(col)
    link_downed.write_text(original)
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_0"), counter="link_downed",
                 severity="fatal") is None
    assert value(r, "fabric_infiniband_port_fatal", **port1("mlx5_0")) == 0


def test_a_value_no_float_holds_costs_its_family_not_the_scrape():
    huge = CounterMetricFamily("fabric_huge", "a collector bug", value=10 ** 400)
    fine = GaugeMetricFamily("fabric_fine", "unaffected", value=2)
    text = render([huge, fine]).decode()
    assert "fabric_huge" not in text and "fabric_fine 2.0" in text


def test_snmp_values_beyond_64_bits_or_in_other_scripts_are_section_problems(tmp_path):
    from fabricscope.exporter.parsers.snmp import parse_snmp
    parsed = parse_snmp("Tcp: MaxConn ActiveOpens\nTcp: -1 " + "9" * 400 + "\n"
                        "Udp: InDatagrams\nUdp: \u00b2\nIp: Forwarding\nIp: 1\n")
    assert [(p.section, p.reason) for p in parsed.problems] == [("Tcp", "out_of_range"), ("Udp", "not_a_number")]
    assert parsed.get("Ip", "Forwarding") == 1


# ---- 5: a state file with a number out of range ----------------------------------------

@pytest.mark.parametrize("stored", [
    '{"down_transitions": {"mlx5_0/1": 1e400}}',
    '{"counters": {"mlx5_0/1": {"link_downed": {"t": 1e400, "v": 1}}}}',
    '{"down_transitions": {"mlx5_0/1": NaN}}',
    '{"down_transitions": {"mlx5_0/1": ' + "9" * 400 + '}}',
])
def test_state_file_with_an_out_of_range_number_is_moved_aside_and_reported(node, stored):
    node.state_dir.mkdir()
    (node.state_dir / "infiniband.json").write_text(stored)
    col = node.collector()
    r = node.scrape(col)
    assert value(r, "fabric_state_file_problem", collector="infiniband", problem="corrupt") == 1
    assert value(r, "fabric_infiniband_port_state", **port1("mlx5_0"), state="ACTIVE") == 4
    assert list(node.state_dir.glob("infiniband.json.corrupt-*"))
    r = node.scrape(col)                               # and it keeps working
    assert value(r, "fabric_infiniband_port_state", **port1("mlx5_0"), state="ACTIVE") == 4


def test_state_file_as_a_fifo_does_not_block_start_up(node):
    node.state_dir.mkdir()
    os.mkfifo(node.state_dir / "infiniband.json")
    r = node.scrape(node.collector())
    assert value(r, "fabric_state_file_problem", collector="infiniband", problem="unreadable") == 1


def test_orphaned_temporary_state_files_are_removed_at_start(node):
    node.state_dir.mkdir()
    orphan = node.state_dir / ".infiniband.json.k3j2l1.tmp"
    orphan.write_text('{"half": ')
    node.scrape(node.collector())
    assert not orphan.exists()


# ---- 7: missing devices and transient errors -------------------------------------------

def test_device_directory_gone_behind_its_class_link_is_a_missing_device(node):
    col = node.collector()
    node.scrape(col)
    target = (node.sys / "class" / "infiniband" / "mlx5_2").resolve()
    shutil.rmtree(target)
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_device_missing", device="mlx5_2") == 1
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_2"), severity="fatal") == 1
    assert value(r, "fabric_infiniband_port_state", **port1("mlx5_0"), state="ACTIVE") == 4


def test_a_failed_first_listing_of_ports_is_reported_and_recovers(node):
    """Tests run as root, where chmod cannot deny a read: a file where the ports/
    directory belongs makes the listing fail the same way, once."""
    ports = (node.sys / "class" / "infiniband" / "mlx5_1").resolve() / "ports"
    shutil.move(ports, ports.with_name("ports.away"))
    ports.write_text("")
    col = node.collector()
    r = node.scrape(col)
    assert read_errors(r, "mlx5_1") == {"not_a_file": 1}
    assert value(r, "fabric_infiniband_port_state", **port1("mlx5_1"), state="ACTIVE") is None
    ports.unlink()
    shutil.move(ports.with_name("ports.away"), ports)
    r = node.scrape(col)
    assert read_errors(r, "mlx5_1") == {}
    assert value(r, "fabric_infiniband_port_state", **port1("mlx5_1"), state="ACTIVE") == 4


def test_symlink_loop_counter_is_a_read_error_and_healthy_devices_keep_every_series(node):
    col = node.collector()
    healthy = series(node.scrape(col))
    loop = counters(node) / "port_rcv_packets"
    loop.unlink()
    os.symlink(loop.name, loop)            # points at itself: ELOOP
    r = node.scrape(col)
    assert read_errors(r, "mlx5_1") == {"io_error": 1}
    assert series(r) == healthy - 1 + 1


def test_procfs_file_beyond_the_size_limit_is_a_read_error(tmp_path):
    from fabricscope.exporter.parsers.files import MAX_FILE_BYTES, read_text
    big = tmp_path / "route"
    big.write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    assert read_text(big).reason == "too_large"
    assert read_text(Path("/proc/sys/kernel/random/boot_id")).count("-") == 4   # /proc/sys refuses big reads


def test_permission_denied_as_an_unprivileged_user_is_a_read_error(node):
    """What held: run as nobody, an unreadable counter is a read error and the rest stays."""
    import json
    import pwd

    from fabricscope.exporter.parsers.infiniband import read_infiniband

    if os.geteuid() != 0:
        pytest.skip("needs root to drop to nobody")
    import tempfile

    nobody = pwd.getpwnam("nobody")
    # pytest's tmp_path is private to root: the tree goes where nobody can reach it.
    shared = Path(tempfile.mkdtemp(prefix="fabricscope-nobody-"))
    shared.chmod(0o755)
    sysfs = shared / "sys"
    shutil.copytree(node.sys, sysfs, symlinks=True)
    for path in [sysfs, *sysfs.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    (sysfs / "class" / "infiniband" / "mlx5_1").resolve().joinpath("ports", "1", "counters", "symbol_error").chmod(0)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:    # the child drops to nobody, reads the tree, reports, and exits
        try:
            os.close(read_end)
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            devices = {d.name: d for d in read_infiniband(sysfs)}
            os.write(write_end, json.dumps([sorted(p.reason for p in devices["mlx5_1"].problems),
                                            len(devices["mlx5_0"].ports[0].counters.items())]).encode())
        except BaseException as exc:  # noqa: BLE001 - the child reports whatever it hit to the parent
            os.write(write_end, json.dumps([repr(exc), 0]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        reasons, healthy_counters = json.loads(pipe.read())
    os.waitpid(child, 0)
    shutil.rmtree(shared)
    assert reasons == ["permission_denied"] and healthy_counters > 10
