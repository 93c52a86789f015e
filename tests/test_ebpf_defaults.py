"""Which BPF objects the ebpf collector loads when the config does not say."""
from __future__ import annotations

import argparse

import pytest

from fabricscope.exporter.collectors.ebpf import EbpfCollector
from fabricscope.exporter.context import Context


def objects_loaded(tmp_path, config, with_gpu: bool) -> set[str]:
    rootfs = tmp_path / "root"
    (rootfs / "dev").mkdir(parents=True)
    if with_gpu:
        (rootfs / "dev" / "nvidia0").write_text("")
    # An empty object dir: nothing is loaded into the kernel, the selection is still made.
    args = argparse.Namespace(ebpf_object_dir=str(tmp_path / "no-objects"))
    collector = EbpfCollector(Context(node="", rootfs=rootfs, config={"ebpf": config}, args=args))
    try:
        return {decl.object for decl in collector._decls}
    finally:
        collector.close()


@pytest.mark.parametrize("config, with_gpu, expected", [
    ({}, False, {"tcp"}),                                         # the default: within ~1% (docs/ebpf.md)
    ({}, True, {"tcp"}),                                          # a GPU node too: sched/syscalls cost more
    ({"processes": ["python"]}, False, {"tcp", "syscalls"}),      # the allow-list asks for syscalls
    ({"objects": ["syscalls", "sched"]}, False, {"syscalls", "sched"}),   # an explicit list wins
])
def test_default_object_selection(tmp_path, config, with_gpu, expected):
    assert objects_loaded(tmp_path, config, with_gpu) == expected
