"""--config.file is validated against one schema before anything starts: an unknown
section or key, a wrong type or a bad value stops the exporter naming the file, the key
path and what was expected; a valid file starts it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fabricscope.exporter.config import section, validate_config
from fabricscope.exporter.schema import ConfigError


@pytest.mark.parametrize("text, message", [
    ("infiniband:\n  thresholds:\n    - {counter: symbol_error, type: velocity, treshold: 5}\n",
     "infiniband.thresholds[0].treshold: unknown key"),
    ("infinband: {}\n", "infinband: unknown key"),
    ("ebpf:\n  objects: tcp\n", "ebpf.objects: input should be a valid list, got 'tcp'"),
    ("ebpf:\n  objects: [tcp, tpc]\n", "ebpf.objects: no BPF object 'tpc'; expected some of sched, syscalls, tcp"),
    ("ebpf:\n  peers: {gpu-node-1: 10.0.0.2}\n", "ebpf.peers: 'gpu-node-1' is not an IP address"),
    ("nccl:\n  hang_multiplier: 0.5\n", "nccl.hang_multiplier: input should be greater than 1"),
    ("nccl:\n  window: 5\n  min_completed: 9\n", "nccl: min_completed (9) must not exceed window (5)"),
    ("nvlink:\n  sample_interval_seconds: '10s'\n", "nvlink.sample_interval_seconds: input should be a valid number"),
    ("netdev:\n  device_include: '(eth'\n", "netdev.device_include: not a regular expression"),
    ("- infiniband\n", "top level must be a mapping of sections, got list"),
    ("infiniband: [unclosed\n", "not valid YAML at line"),
])
def test_a_bad_config_file_stops_the_exporter_with_file_key_and_expectation(tmp_path, text, message):
    path = tmp_path / "config.yml"
    path.write_text(text)
    result = subprocess.run([sys.executable, "-m", "fabricscope.cli", "exporter", "--config.file", str(path),
                             "--path.state", str(tmp_path / "state"), "--web.listen-address", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert str(path) in result.stderr and message in result.stderr, result.stderr


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        validate_config({"nvlink": {"sample_interval_seconds": 0}, "nccl": {"ingest": "yes"}, "x": 1}, "c.yml")
    assert str(info.value).splitlines() == [
        "c.yml: nvlink.sample_interval_seconds: input should be greater than 0, got 0",
        "c.yml: nccl.ingest: input should be a valid boolean, got 'yes'",
        "c.yml: x: unknown key",
    ]


def test_a_valid_file_is_accepted_and_sections_keep_only_what_was_set():
    config = validate_config({
        "infiniband": {"thresholds": [{"counter": "symbol_error", "type": "velocity", "threshold": 50,
                                       "unit": "minute"},
                                      {"counter": "port_xmit_wait", "enabled": False}],
                       "roles": {"mlx5_4": "storage"}},
        "ebpf": {"objects": ["tcp", "sched"], "peers": {"10.0.0.2": "gpu-node-1"}},
        "nccl": {"hang_multiplier": 3, "ingest": True},
        "nvlink": {"sample_interval_seconds": 10},
        "netdev": {"device_exclude": "^(lo|veth)"},
    }, "c.yml")
    assert section(config, "nccl") == {"hang_multiplier": 3.0, "ingest": True}
    assert section(config, "nvlink") == {"sample_interval_seconds": 10.0}
    assert section({}, "ebpf") == {}


def test_huge_or_hostile_values_are_not_echoed_whole():
    with pytest.raises(ConfigError) as info:
        validate_config({"nccl": {"bpf_object": ["x" * 100_000]}}, "c.yml")
    assert len(str(info.value)) < 300


def test_every_setting_a_collector_reads_is_in_the_schema():
    """A key read from a section but missing from the schema would make a valid file fail."""
    from fabricscope.exporter.config import NcclSection
    from fabricscope.exporter.nccl.tracker import NcclTracker

    assert NcclTracker.CONFIG_KEYS <= set(NcclSection.model_fields)


@pytest.mark.parametrize("make", ["fifo", "device", "directory", "too_large"])
def test_a_config_path_that_is_not_a_readable_file_is_a_clear_error_not_a_hang(tmp_path, make):
    """A FIFO would block a plain open() until a writer comes, /dev/zero a read forever."""
    import os

    from fabricscope.exporter.schema import load_yaml

    path = {"device": "/dev/zero", "directory": str(tmp_path)}.get(make, tmp_path / "config.yaml")
    if make == "fifo":
        os.mkfifo(path)
    elif make == "too_large":
        path.write_bytes(b"# " + b"x" * (9 << 20) + b"\n")
    with pytest.raises(ConfigError, match="cannot read: (not a regular file|larger than)"):
        load_yaml(path)
