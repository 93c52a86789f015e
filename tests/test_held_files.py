"""Counter files held open between scrapes (exporter/parsers/held.py): a held descriptor is
never read once its file was replaced, removed or turned into something else, and nothing
held outlives its device."""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from fabricscope.exporter.parsers.files import ReadProblem
from fabricscope.exporter.parsers.held import BUDGET, HeldDirectory
from tests.test_infiniband_collector import Node, port1, value


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def texts(held: HeldDirectory) -> dict[str, str]:
    return {name: text if isinstance(text, str) else text.reason for name, text in held.read()}


def test_values_written_in_place_are_read_through_the_held_descriptor(tmp_path):
    (tmp_path / "a").write_text("1\n")
    held = HeldDirectory(str(tmp_path))
    assert texts(held) == {"a": "1"} and held.held == 1
    (tmp_path / "a").write_text("22\n")
    assert texts(held) == {"a": "22"}
    held.close()
    assert held.held == 0


def test_a_file_replaced_under_the_open_descriptor_is_read_from_the_new_file(tmp_path):
    (tmp_path / "a").write_text("1\n")
    held = HeldDirectory(str(tmp_path))
    texts(held)
    before = open_descriptors()
    # Replaced by rename: the held descriptor still reads "1" from the old inode.
    (tmp_path / "a.new").write_text("2\n")
    os.replace(tmp_path / "a.new", tmp_path / "a")
    assert texts(held) == {"a": "2"}
    assert open_descriptors() == before          # the stale descriptor was closed, not kept
    held.close()


def _age(directory: Path) -> None:
    """Dated an hour ago, as a sysfs directory keeps its creation time: otherwise it is
    listed again on every read (the racily-clean rule)."""
    os.utime(directory, (os.path.getmtime(directory) - 3600,) * 2)


def test_unchanged_says_only_a_read_of_the_same_files_with_the_same_bytes(tmp_path):
    """What the infiniband parser serves last scrape's objects on: never after a value
    moved, a file was replaced or added, or the first read."""
    (tmp_path / "a").write_text("1\n")
    (tmp_path / "b").write_text("5\n")
    _age(tmp_path)
    held = HeldDirectory(str(tmp_path))
    steps = []
    texts(held)
    steps.append(held.unchanged)                  # first read
    texts(held)
    steps.append(held.unchanged)                  # nothing moved
    (tmp_path / "a").write_text("2\n")
    texts(held)
    steps.append(held.unchanged)                  # a value moved, in place
    texts(held)
    steps.append(held.unchanged)
    (tmp_path / "b.new").write_text("5\n")
    os.replace(tmp_path / "b.new", tmp_path / "b")   # same bytes, a new file
    _age(tmp_path)
    assert texts(held) == {"a": "2", "b": "5"}
    steps.append(held.unchanged)
    (tmp_path / "c").write_text("0\n")
    _age(tmp_path)
    texts(held)
    steps.append(held.unchanged)                  # a file added
    held.close()
    assert steps == [False, True, False, True, False, False]


def test_a_fifo_put_in_a_held_files_place_is_not_read_and_blocks_nothing(tmp_path):
    (tmp_path / "a").write_text("1\n")
    held = HeldDirectory(str(tmp_path))
    texts(held)
    (tmp_path / "a").unlink()
    os.mkfifo(tmp_path / "a")
    result: dict = {}
    reader = threading.Thread(target=lambda: result.update(texts(held)), daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive() and result == {"a": "not_a_file"} and held.held == 0


def test_files_appearing_and_vanishing_and_the_directory_going_away(tmp_path):
    directory = tmp_path / "counters"
    directory.mkdir()
    (directory / "a").write_text("1\n")
    held = HeldDirectory(str(directory))
    assert texts(held) == {"a": "1"}
    (directory / "b").write_text("5\n")
    assert texts(held) == {"a": "1", "b": "5"} and held.held == 2
    (directory / "a").unlink()
    assert texts(held) == {"b": "5"} and held.held == 1
    shutil.rmtree(directory)
    assert held.read() == [] and held.held == 0


def test_named_files_report_absent_ones(tmp_path):
    (tmp_path / "state").write_text("4: ACTIVE\n")
    (tmp_path / "other").write_text("x\n")
    held = HeldDirectory(str(tmp_path), ("state", "rate"))
    assert texts(held) == {"state": "4: ACTIVE", "rate": "absent"} and held.held == 1
    held.close()


def test_an_unlistable_directory_is_one_problem_for_the_directory(tmp_path):
    (tmp_path / "file").write_text("1\n")
    result = HeldDirectory(str(tmp_path / "file")).read()   # a file where a directory belongs
    assert result == [("", ReadProblem(tmp_path / "file", "not_a_file"))]


def test_past_the_budget_files_are_still_read_without_being_held(tmp_path, monkeypatch):
    for name in "abc":
        (tmp_path / name).write_text(f"{ord(name)}\n")
    monkeypatch.setattr(BUDGET, "_limit", BUDGET.held + 1)
    held = HeldDirectory(str(tmp_path))
    assert texts(held) == {"a": "97", "b": "98", "c": "99"} and held.held == 1
    parsed = dict(HeldDirectory(str(tmp_path)).read(lambda text, directory, name: int(text)))
    assert parsed == {"a": 97, "b": 98, "c": 99}               # parsed whether held or not
    held.close()


def test_a_directory_dropped_without_close_releases_what_it_held(tmp_path):
    (tmp_path / "a").write_text("1\n")
    before, held_before = open_descriptors(), BUDGET.held
    held = HeldDirectory(str(tmp_path))
    texts(held)
    del held
    assert open_descriptors() == before and BUDGET.held == held_before


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


def test_a_device_removed_and_re_added_is_read_from_its_new_files(node):
    """The kernel removes a device's sysfs directory and creates a new one when the device
    is re-probed; descriptors held on the old files must not serve the old values."""
    col = node.collector()
    r = node.scrape(col)
    labels = dict(**port1("mlx5_1"), counter="symbol_error")
    old = value(r, "fabric_infiniband_port_counter_total", **labels)
    device_dir = node.port("mlx5_1").parent.parent.resolve()
    fresh = device_dir.with_name(device_dir.name + ".new")
    shutil.copytree(device_dir, fresh, symlinks=True)
    (fresh / "ports" / "1" / "counters" / "symbol_error").write_text(f"{old + 7:.0f}\n")
    descriptors = open_descriptors()
    shutil.rmtree(device_dir)
    r = node.scrape(col)          # removed: reported missing, its descriptors closed
    assert value(r, "fabric_infiniband_device_missing", device="mlx5_1") == 1
    assert open_descriptors() < descriptors
    fresh.rename(device_dir)
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_port_counter_total", **labels) == old + 7
    assert value(r, "fabric_infiniband_device_missing", device="mlx5_1") is None   # only while missing
    col.close()


def test_a_counter_file_replaced_by_rename_is_read_from_the_new_file(node):
    col = node.collector()
    node.scrape(col)
    counters = node.port("mlx5_1") / "counters"
    (counters / "symbol_error.tmp").write_text("12345\n")
    os.replace(counters / "symbol_error.tmp", counters / "symbol_error")
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_port_counter_total", **port1("mlx5_1"), counter="symbol_error") == 12345
    col.close()


def test_closing_the_collector_releases_every_held_descriptor(node):
    before = open_descriptors()
    col = node.collector()
    node.scrape(col)
    assert open_descriptors() > before + 20
    col.close()
    assert open_descriptors() == before


def test_an_interface_deleted_and_created_again_is_read_from_its_new_files(tmp_path):
    from fabricscope.exporter.collectors.netdev import NetdevCollector
    from fabricscope.exporter.context import Context

    net = tmp_path / "sys" / "class" / "net"
    shutil.copytree(Path(__file__).parent / "fixtures" / "node" / "sys" / "class" / "net" / "eth2", net / "eth2",
                    symlinks=True)
    collector = NetdevCollector(Context(sysfs=tmp_path / "sys", procfs=tmp_path / "proc", node=""))

    def rx_bytes() -> float | None:
        return next((s.value for f in collector.collect() for s in f.samples if s.name == "fabric_netdev_rx_bytes_total"),
                    None)

    before = open_descriptors()
    rx_bytes()
    assert open_descriptors() > before + 10
    fresh = tmp_path / "eth2.new"
    shutil.copytree(net / "eth2", fresh, symlinks=True)
    (fresh / "statistics" / "rx_bytes").write_text("424242\n")
    shutil.rmtree(net / "eth2")
    assert rx_bytes() is None and open_descriptors() == before     # gone: nothing held for it
    fresh.rename(net / "eth2")
    assert rx_bytes() == 424242
    collector.close()
    assert open_descriptors() == before


def test_the_exporter_raises_its_open_file_limit_to_the_hard_limit(tmp_path, port):
    """A service started with the usual soft limit of 1,024 could hold only part of a large
    node's counter files; the exporter lifts it at start, as Go programs do."""
    import resource
    import subprocess
    import sys
    import time

    exporter = subprocess.Popen(
        [sys.executable, "-m", "fabricscope.cli", "exporter", f"--web.listen-address=127.0.0.1:{port}",
         f"--path.sysfs={tmp_path}", f"--path.procfs={tmp_path}", f"--path.state={tmp_path / 'state'}",
         "--collector.infiniband", *[f"--no-collector.{name}" for name in ("ebpf", "kmsg", "nccl", "netdev", "nvlink",
                                                                            "tcp")]],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            limits = Path(f"/proc/{exporter.pid}/limits").read_text()
            soft = next(line.split()[3] for line in limits.splitlines() if line.startswith("Max open files"))
            if soft == "4096" or exporter.poll() is not None:
                break
            time.sleep(0.1)
        assert soft == "4096"
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)


def test_only_counter_files_exported_or_judged_are_read(node):
    """hw_counters/ outside the allow-list are neither opened nor read; one a threshold
    judges is, allow-listed or not."""
    hw = node.port("mlx5_1") / "hw_counters"
    names = sorted(p.name for p in hw.iterdir())
    col = node.collector()
    r = node.scrape(col)
    exported = {name for name in names
                if value(r, "fabric_infiniband_port_hw_counter_total", **port1("mlx5_1"), counter=name) is not None}
    held = next(p for d, s in col.static_cache.items() if d == "mlx5_1" for p in s.ports).hw_counters
    assert held.held == len(exported) < len(names)
    assert {"out_of_sequence", "rnr_nak_retry_err"} <= exported       # allow-listed / judged
    col.close()
