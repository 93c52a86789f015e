"""Run every benchmark in bench/ in turn and print their figures (`make bench`).

Each benchmark is its own script with its own flags; this runner uses their defaults
(shortened where a default would take many minutes) and keeps going when one cannot
run here (e.g. the eBPF ones without root), saying why.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RUNS = [
    ("scrape latency vs node_exporter (host collectors)", ["scrape_latency.py"], False),
    ("scrape latency, all collectors, simulated 8-GPU node", ["scrape_latency.py", "--gpu"], False),
    ("eBPF overhead of the default programs (realistic mix, TCP and syscall worst cases)", ["ebpf_overhead.py"], True),
    ("NCCL uprobe cost per call", ["nccl_uprobe_cost.py"], True),
    ("exporter CPU share and RSS on a busy node, per collector set", ["exporter_cost.py"], True),
    ("exporter RSS per start-up stage, largest mappings, threads", ["exporter_memory.py"], True),
    ("per-CPU BPF map values summed, by CPU count", ["percpu_sum.py"], False),
    ("demo tick cost", ["demo_tick.py"], False),
    ("rule evaluation on a 1,024-GPU cluster", ["rule_eval_cost.py", "--duration", "120"], False),
    ("NL query accuracy and latency without an LLM", ["query_accuracy.py"], False),
    ("chaos blast radius at 1k, 16k and 100k GPUs", ["chaos_blast_radius.py"], False),
    ("sidecar: span ingest, correlation latency, mixed load", ["sidecar_load.py"], False),
]


def main() -> int:
    failed = []
    for title, argv, needs_root in RUNS:
        print(f"\n=== {title} ===", flush=True)
        if needs_root and os.geteuid() != 0:
            print("skipped: needs root (eBPF)")
            continue
        result = subprocess.run([sys.executable, str(BENCH / argv[0]), *argv[1:]])
        if result.returncode != 0:
            failed.append(title)
    if failed:
        print(f"\nbenchmarks that failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
