"""Where the exporter's RSS goes: the process's memory after each start-up stage.

Runs `fabricscope exporter`'s own start-up steps (exporter/main.py: run()) one by one in
this process, with a --config.file and a --web.config.file (basic auth) so the start-up
validation runs as it does on a configured node, and prints RSS, anonymous and
file-backed, after each stage and what it added; then the largest mappings
(/proc/self/smaps), the threads, and which heavy packages are resident while serving.

    sudo .venv/bin/python bench/exporter_memory.py [--collectors all|ebpf,nccl,...] [--python-heap] [--write]
Root for the eBPF collectors (ebpf, nccl, tcp); without root, pass host collectors only.
--python-heap traces every Python allocation from the first import (tracemalloc) and lists
the live Python heap by package once started; tracing adds its own memory, so the RSS
figures of such a run are higher than without it. --write also measures each import of
the exporter in a fresh interpreter and writes both tables into docs/cost.md.
bench/exporter_cost.py measures the same exporter as its own process on a busy node.
"""
from __future__ import annotations

import os
import sys


def memory() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile in MB (/proc/self/status)."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) / 1024
    return values


STAGES: list[tuple[str, dict[str, float], int]] = []
if "--python-heap" in sys.argv:
    import tracemalloc

    tracemalloc.start()


def stage(name: str) -> None:
    STAGES.append((name, memory(), len(sys.modules)))


stage("interpreter")

import argparse  # noqa: E402
import collections  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
stage("bench's own imports")

from fabricscope.exporter import main as exporter_main  # noqa: E402
from measure import replace_between_markers  # noqa: E402
from smaps import largest_mappings  # noqa: E402

stage("import fabricscope.exporter.main")

ALL = ["ebpf", "infiniband", "kmsg", "nccl", "netdev", "nvlink", "tcp"]
# Packages that cost megabytes; the serving exporter should hold only those it uses.
HEAVY = ["pydantic", "pydantic_core", "yaml", "prometheus_client", "h11", "bcrypt", "http.server", "wsgiref",
         "email", "urllib.request", "pynvml", "concurrent.futures", "ssl", "asyncio"]
CONFIG = """\
nvlink: {sample_interval_seconds: 10}
nccl: {window: 20}
infiniband: {thresholds: [{counter: symbol_error, type: velocity, threshold: 50, unit: minute}]}
"""
# bcrypt of "secret" at cost 4 (cheap to check).
WEB_CONFIG = "basic_auth_users:\n  prometheus: $2b$04$8OrintucnpU.dL/r2luHMu6dveVSc8Wmh7SJtyfN0J4HeiHllbbuS\n"


def thread_stacks_kb() -> tuple[int, int]:
    """(count, resident KB) of the thread stacks: anonymous mappings of exactly the stack
    size glibc gives a new thread (threading.stack_size(), else RLIMIT_STACK)."""
    sizes = {threading.stack_size() or resource.getrlimit(resource.RLIMIT_STACK)[0]}
    count = resident = 0
    stack = False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                stack = len(fields) <= 5 and fields[1] == "rw-p" and end - start in sizes
            elif fields[0] == "Rss:" and stack:
                count += 1
                resident += int(fields[1])
    return count, resident


# The exporter's imports in its own order, each measured after those before it (whoever
# comes first pays for the standard-library modules the later ones share), and what each is
# there for. Run in a fresh interpreter: this script has imported them all already.
PIECES = [
    ("`logging`, `argparse`", "import logging, argparse", ""),
    ("`prometheus_client`", "import prometheus_client.core",
     "the metric families (`nccl` uses them too); its package `__init__` imports `exposition`, which "
     "pulls in `http.server`, `wsgiref`, `urllib.request`, `email`"),
    ("`fabricscope/httpserver.py` (asyncio, ssl, h11)", "import fabricscope.httpserver", "the HTTP server"),
    ("`fabricscope.exporter.main` and every collector module",
     "import fabricscope.exporter.main\n"
     "from fabricscope.exporter.framework import load_collector_modules\nload_collector_modules()",
     "Python's allocator grows in 1 MiB arenas, so one module's share is coarse"),
    ("`PyYAML`", "import yaml", "only with the `ebpf` collector (its BPF declarations)"),
    ("`pynvml`", "import pynvml", "when the `nvlink` collector looks for NVML"),
    ("`bcrypt`", "import bcrypt", "only with `basic_auth_users`"),
]
# The child reads one JSON-encoded piece of code per line, runs it, and answers with its
# VmRSS and RssAnon (MB) after it.
PIECE_PROBE = """
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "RssAnon")):
            yield int(line.split()[1]) / 1024
print(*rss(), flush=True)
for line in sys.stdin:
    exec(json.loads(line))
    print(*rss(), flush=True)
"""


def pieces() -> list[tuple[str, float, float, str]]:
    """(piece, RSS added MB, anon added MB, note); the interpreter first, as its total."""
    import json
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", PIECE_PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    rss, anon = map(float, child.stdout.readline().split())
    rows = [("the Python interpreter", rss, anon, "")]
    for name, code, note in PIECES:
        child.stdin.write(json.dumps(code) + "\n")
        child.stdin.flush()
        now_rss, now_anon = map(float, child.stdout.readline().split())
        rows.append((name, now_rss - rss, now_anon - anon, note))
        rss, anon = now_rss, now_anon
    child.stdin.close()
    child.wait()
    return rows


def stage_table() -> str:
    lines = ["| stage (exporter/main.py order) | RSS | added (anon) |", "|---|---|---|"]
    previous = None
    for name, mem, _modules in STAGES:
        added = "" if previous is None else f"{mem['VmRSS'] - previous['VmRSS']:+.1f} MB " \
                                            f"({mem['RssAnon'] - previous['RssAnon']:+.1f})"
        lines.append(f"| {name} | {mem['VmRSS']:.1f} MB | {added} |")
        previous = mem
    return "\n".join(lines)


def pieces_table(rows: list[tuple[str, float, float, str]]) -> str:
    lines = ["| piece | RSS (anon) | why it is there |", "|---|---|---|"]
    for index, (name, rss, anon, note) in enumerate(rows):
        sign = "" if index == 0 else "+"
        lines.append(f"| {name} | {sign}{rss:.1f} MB ({sign}{anon:.1f}) | {note} |")
    return "\n".join(lines)


def write_doc(tables: dict[str, str]) -> None:
    """Replace each `<!-- exporter-memory-NAME: begin/end -->` block of docs/cost.md."""
    doc_path = REPO / "docs" / "cost.md"
    for name, text in tables.items():
        replace_between_markers(doc_path, f"<!-- exporter-memory-{name}: begin -->",
                                f"<!-- exporter-memory-{name}: end -->", text)
    print(f"{doc_path}: tables {', '.join(tables)} rewritten")


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--collectors", default="all", help="comma-separated, or 'all' (default)")
    cli.add_argument("--top", type=int, default=12, help="mappings (and heap packages) to list")
    cli.add_argument("--python-heap", action="store_true", help="list the live Python heap by package")
    cli.add_argument("--write", action="store_true",
                     help="also measure the import pieces and write both tables into docs/cost.md")
    options = cli.parse_args()
    enabled = ALL if options.collectors == "all" else options.collectors.split(",")

    work = Path(tempfile.mkdtemp(prefix="fabric-memory-"))
    (work / "config.yml").write_text(CONFIG)
    (work / "web.yml").write_text(WEB_CONFIG)
    parser = argparse.ArgumentParser()
    exporter_main.add_arguments(parser)
    args = parser.parse_args(["--web.listen-address", "127.0.0.1:0", "--path.state", str(work / "state"),
                              "--config.file", str(work / "config.yml"),
                              "--web.config.file", str(work / "web.yml"), "--log.level", "warning",
                              *[f"--collector.{name}" for name in ALL if name in enabled],
                              *[f"--no-collector.{name}" for name in ALL if name not in enabled]])
    stage("collector modules and flags")
    exporter_main.cap_malloc_arenas()
    ctx = exporter_main.context_from_args(args)
    stage("--config.file validated")
    exporter = exporter_main.start_exporter(ctx, exporter_main.enabled_collectors(args), args.listen,
                                            args.web_config, args.collector_timeout)
    stage("web config validated, collectors started")
    try:
        exporter.render_metrics()
        stage("first scrape")
        exporter_main.settle_after_start()
        stage("after start-up: gc, free heap returned")
        for _ in range(3):
            exporter.render_metrics()
        stage("three more scrapes")

        print(f"exporter start-up, collectors: {', '.join(enabled)} (python {sys.version.split()[0]})")
        print(f"{'stage':<44} {'RSS MB':>7} {'anon':>6} {'file':>6} {'+RSS':>6} {'+anon':>6} {'modules':>8}")
        previous = None
        for name, mem, modules in STAGES:
            delta = "" if previous is None else f"{mem['VmRSS'] - previous['VmRSS']:+6.1f} " \
                                                f"{mem['RssAnon'] - previous['RssAnon']:+6.1f}"
            print(f"{name:<44} {mem['VmRSS']:7.1f} {mem['RssAnon']:6.1f} {mem['RssFile']:6.1f} {delta:>13} {modules:8d}")
            previous = mem
        count, resident = thread_stacks_kb()
        print(f"threads: {threading.active_count()} Python threads ({len(os.listdir('/proc/self/task'))} in all); "
              f"{count} thread stacks with {resident} KB resident")
        resident_packages = [name for name in HEAVY if name in sys.modules]
        print(f"resident while serving: {', '.join(resident_packages) or 'none of ' + ', '.join(HEAVY)}")
        print(f"not imported: {', '.join(name for name in HEAVY if name not in sys.modules)}")
        print("largest mappings by RSS:")
        for rss, anon, count, name in largest_mappings(options.top):
            print(f"  {rss:6.2f} MB (anon {anon:5.2f}) x{count:<3d} {name}")
        if options.python_heap:
            python_heap(options.top)
        if options.write:
            write_doc({"stages": stage_table(), "pieces": pieces_table(pieces())})
    finally:   # its threads would keep this process alive
        exporter.stop()
    return 0


def python_heap(top: int) -> None:
    """The live Python allocations, summed by the package (or stdlib module) that made them."""
    import tracemalloc

    by_package: collections.Counter = collections.Counter()
    roots = sorted({str(Path(p).resolve()) for p in sys.path if p and Path(p).is_dir()}, key=len, reverse=True)
    for stat in tracemalloc.take_snapshot().statistics("filename"):
        name = stat.traceback[0].filename
        for root in roots:
            if name.startswith(root + os.sep):
                name = name[len(root) + 1:]
                break
        parts = Path(name).parts
        if name.startswith("<frozen importlib"):
            # Allocated while importing: the modules' code objects and dicts.
            key = "module code and namespaces (made by importlib)"
        elif parts and parts[0] in ("fabricscope", "exporter") and len(parts) > 1:
            key = "/".join(parts[:2])
        else:
            key = parts[0] if parts else name
        by_package[key.removesuffix(".py")] += stat.size
    total = sum(by_package.values())
    print(f"live Python heap (tracemalloc): {total / 2**20:.1f} MB; largest by package:")
    for name, size in by_package.most_common(top):
        print(f"  {size / 2**20:6.2f} MB  {name}")


if __name__ == "__main__":
    sys.exit(main())
