"""What the production rules cost at fleet size, with nothing but the engine running.

    .venv/bin/python bench/rule_cost_record.py --out var/rule-cost/faults.jsonl.gz   # once, real time
    .venv/bin/python bench/rule_cost_isolated.py var/rule-cost/faults.jsonl.gz --nodes 1000

A recording (bench/rule_cost_record.py: the demo cluster's real exposition every 30 s)
is expanded to a fleet of --nodes the way `fabricscope demo --fleet` serves one
(demo/fleet.py: the simulated nodes in full, copies of node 0 for the rest) with the
labels a scrape adds (cluster, job, instance; `up`), and shifted in time so that its
rounds run from the past into the next minutes: what the engine reads while it evaluates
looks like live data, but no scraper, simulator or remote writer runs beside it.

- Prometheus: the rounds go into its head through its remote-write receiver (vmagent
  relays them, then stops), then Prometheus evaluates rules/*.yaml at their production
  intervals. The data reaches into the future, so the recording-rule results (written at
  now, before the newest samples) need the out-of-order window (`out_of_order_time_window`).
  `promtool tsdb create-blocks-from openmetrics` was the first way: at 1,000 nodes (10 GB
  of OpenMetrics, 60 M samples) it held 13.5 GiB and had not finished after 12 minutes on
  this 2-core machine.
- VictoriaMetrics: the rounds are imported (/api/v1/import/prometheus) and vmalert
  evaluates the same rules (as the stack loads them) against it.

Per group: each evaluation's duration from the engine's own metrics over --measure
seconds (Prometheus prometheus_rule_group_last_duration_seconds, vmalert
vmalert_iteration_duration_seconds), as mean and worst, the worst against the interval;
and the samples each group touches (the sum of its rules' totalQueryableSamples, each
expression asked once of Prometheus with stats=all after the window, the rule manager
stopped; Prometheus 2.42 has no prometheus_engine_query_samples_total). Figures, not assertions; run on a quiet
host, since the engine shares the machine's cores with whatever else runs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope.demo.fleet import FleetCopies  # noqa: E402
from fabricscope.demo.stack import free_port, write_yaml  # noqa: E402
from fabricscope.demo.stack.processes import start_prometheus  # noqa: E402
from fabricscope.demo.stack.victoria import (start_victoria_metrics, start_vmagent, start_vmalert,  # noqa: E402
                                             vmalert_rules)
from fabricscope.rules import rule_files  # noqa: E402

HOST = "127.0.0.1"
JOB = "fabricscope"
# In fleet mode every copy is served from one port, so every copy's instance is the same.
INSTANCE = "fleet:9"
_LINE_START = re.compile(rb"^([a-zA-Z_:][a-zA-Z0-9_:]*)([{ ])", re.M)
# Wall-clock values (the NCCL collector's timestamps) move with the rounds they are in.
_TIMESTAMP_VALUE = re.compile(rb"^([a-zA-Z_:]*_timestamp_seconds(?:\{[^}]*\})?) (\S+)$", re.M)


def load_recording(path: Path) -> list[dict]:
    """Rounds of the recording; a recording still being written is read up to its last
    complete line."""
    raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(path.read_bytes())
    rounds = []
    for line in raw.split(b"\n"):
        try:
            rounds.append(json.loads(line))
        except ValueError:
            break
    if len(rounds) < 4:
        raise SystemExit(f"{path}: {len(rounds)} complete rounds; a recording needs at least 4")
    return rounds


def scraped(text: str, cluster: str, shift: float) -> bytes:
    """One node's exposition as stored after a scrape: no comments, the target's labels
    added, wall-clock values shifted with the round."""
    body = b"\n".join(line for line in text.encode().split(b"\n") if line and not line.startswith(b"#")) + b"\n"
    labels = b'cluster="%s",instance="%s",job="%s"' % (cluster.encode(), INSTANCE.encode(), JOB.encode())
    body = _LINE_START.sub(lambda m: m.group(1) + b"{" + labels + (b"," if m.group(2) == b"{" else b"} "), body)
    body = body.replace(b",}", b"}")
    return _TIMESTAMP_VALUE.sub(lambda m: m.group(1) + b" " + repr(float(m.group(2)) + shift).encode(), body)


class FleetRounds:
    """The recording's rounds for a fleet of `nodes`, each round's timestamp shifted so
    that round `present` falls at `now`."""

    def __init__(self, rounds: list[dict], nodes: int, present: int, now: float, cluster: str = "demo"):
        self.rounds, self.nodes, self.cluster = rounds, nodes, cluster
        self.present = now
        self.shift = now - rounds[present]["t"]
        simulated = list(rounds[0]["nodes"])
        if nodes < len(simulated):
            raise SystemExit(f"--nodes {nodes} is fewer than the recording's {len(simulated)} simulated nodes")
        self.template = simulated[0]
        prefix = self.template.rstrip("0123456789")
        self.copy_names = [f"{prefix}{i}" for i in range(len(simulated), nodes)]
        ranks = int(re.search(r'nranks="(\d+)"', rounds[0]["nodes"][self.template]).group(1)) // len(simulated) \
            if 'nranks="' in rounds[0]["nodes"][self.template] else 8
        self.ranks = (ranks, ranks * nodes, ranks * len(simulated))

    def timestamps(self) -> list[float]:
        return [r["t"] + self.shift for r in self.rounds]

    def body(self, index: int) -> bytes:
        """All series of round `index`, without timestamps."""
        nodes = {name: scraped(text, self.cluster, self.shift) for name, text in self.rounds[index]["nodes"].items()}
        copies = FleetCopies(lambda: nodes[self.template], self.template, *self.ranks)
        parts = list(nodes.values())
        parts += [copies.exposition(i, name) for i, name in enumerate(self.copy_names, start=len(nodes))]
        parts.append(b"".join(b'up{cluster="%s",instance="%s",job="%s",node="%s"} 1\n'
                              % (self.cluster.encode(), INSTANCE.encode(), JOB.encode(), name.encode())
                              for name in [*nodes, *self.copy_names]))
        return b"".join(parts)

    def stamped(self, index: int, millis: bool) -> bytes:
        """Round `index` with each sample's timestamp: seconds (OpenMetrics) or ms (VictoriaMetrics)."""
        at = self.rounds[index]["t"] + self.shift
        stamp = b" %d\n" % int(at * 1000) if millis else b" %.3f\n" % at
        return self.body(index).replace(b"\n", stamp)


def relay_import(fleet: FleetRounds, work: Path, prometheus_url: str) -> int:
    """The rounds into Prometheus' head through its remote-write receiver, vmagent turning
    the text into remote-write requests; vmagent stops once Prometheus has them all."""
    port = free_port(HOST)
    agent = start_vmagent(write_yaml(work / "vmagent.yml", {"scrape_configs": []}), work / "vmagent-data", HOST,
                          port, f"{prometheus_url}/api/v1/write", work / "vmagent.log",
                          # Ordered per series; the out-of-order window takes what still crosses.
                          extra_args=["-remoteWrite.queues=2", "-remoteWrite.maxBlockSize=8MB"])
    try:
        samples = victoria_import(fleet, f"http://{HOST}:{port}", flush=False)
        # Done when Prometheus has appended them all, or appends nothing more for 30 s
        # (what it refused is in its log and the report's count).
        last, still_since = -1.0, time.time()
        while time.time() - still_since < 30:
            page = metrics_page(f"{prometheus_url}/metrics")
            appended = sum(v for k, v in page.items() if k.startswith("prometheus_tsdb_head_samples_appended_total"))
            if appended >= samples:
                break
            if appended != last:
                last, still_since = appended, time.time()
            time.sleep(3)
    finally:
        agent.stop(timeout=60)
    return samples


def victoria_import(fleet: FleetRounds, url: str, flush: bool = True) -> int:
    samples = 0
    for index in range(len(fleet.rounds)):
        chunk = fleet.stamped(index, millis=True)
        samples += chunk.count(b"\n")
        request = urllib.request.Request(f"{url}/api/v1/import/prometheus", data=chunk, method="POST")
        with urllib.request.urlopen(request, timeout=600) as answer:
            answer.read()
    if flush:
        urllib.request.urlopen(f"{url}/internal/force_flush", timeout=60).read()
    return samples


def metrics_page(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=60) as answer:
        text = answer.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def group_intervals(paths: list[Path], default: float) -> dict[str, float]:
    out = {}
    for path in paths:
        for group in yaml.safe_load(Path(path).read_text())["groups"]:
            out[group["name"]] = seconds(group.get("interval", default))
    return out


def seconds(text) -> float:
    for unit, factor in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
        if str(text).endswith(unit):
            return float(str(text)[: -len(unit)]) * factor
    return float(text)


def label(key: str, name: str) -> str | None:
    found = re.search(name + r'="([^"]*)"', key)
    return found.group(1) if found else None


def rule_stats(url: str, paths: list[Path], at: float | None = None) -> list[dict]:
    """Each rule's expression asked once with stats=all (at time `at`, else now): the
    samples it touches and the time it took (the evaluation of one cycle, outside the rule
    manager)."""
    out = []
    for path in paths:
        for group in yaml.safe_load(Path(path).read_text())["groups"]:
            for rule in group["rules"]:
                query = urllib.parse.urlencode({"query": rule["expr"], "stats": "all",
                                                **({} if at is None else {"time": f"{at:.3f}"})})
                with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=300) as answer:
                    stats = json.load(answer).get("data", {}).get("stats", {})
                out.append({"group": group["name"], "rule": rule.get("record") or rule.get("alert"),
                            "severity": rule.get("labels", {}).get("severity"),
                            "samples": stats.get("samples", {}).get("totalQueryableSamples", 0),
                            "seconds": stats.get("timings", {}).get("evalTotalTime", 0.0)})
    return out


def watch(poll, measure: float) -> tuple[dict[str, list[float]], list[float]]:
    """Each group's evaluation durations during `measure` s, and the host's 1-minute load
    average at each poll (what else ran on the cores). `poll` answers {group:
    (evaluations so far or the last one's time, seconds spent so far or the last
    evaluation's)}, cumulative=True when the seconds add up over evaluations."""
    seen: dict[str, list[float]] = {}
    loads: list[float] = []
    last: dict[str, tuple[float, float]] = {}
    end = time.time() + measure
    while time.time() < end:
        time.sleep(5)
        loads.append(os.getloadavg()[0])
        for group, (count, value, cumulative) in poll().items():
            # Counters start at 0 with the process: the first evaluation counts too
            # (and a first evaluation time is above 0).
            before = last.get(group, (0.0, 0.0))
            last[group] = (count, value)
            if count <= before[0]:
                continue
            seen.setdefault(group, []).append((value - before[1]) / (count - before[0]) if cumulative else value)
    return seen, loads


def wait_until(at: float) -> None:
    """Sleep until wall-clock `at`: a load that finished early waits for the moment the
    measurement is due, so every run reads the same amount of history."""
    time.sleep(max(0.0, at - time.time()))


def prometheus_run(fleet: FleetRounds, work: Path, rules: list[Path], measure: float, begin: float) -> dict:
    port = free_port(HOST)
    base = f"http://{HOST}:{port}"
    # No rules while loading (they would evaluate half-loaded data); loaded, the config
    # with the rules is reloaded.
    config = {"global": {"evaluation_interval": "30s"}, "storage": {"tsdb": {"out_of_order_time_window": "2h"}}}
    path = write_yaml(work / "prometheus.yml", config)
    prom = start_prometheus(path, work / "prometheus-data", HOST, port, work / "prometheus.log",
                            ["--storage.tsdb.retention.time=30d", "--web.enable-remote-write-receiver",
                             "--web.enable-lifecycle"], timeout=600)
    try:
        began = time.monotonic()
        samples = relay_import(fleet, work, base)
        loaded = time.monotonic() - began
        wait_until(fleet.present + begin)
        write_yaml(path, {**config, "rule_files": [str(p) for p in rules]})
        urllib.request.urlopen(urllib.request.Request(f"{base}/-/reload", method="POST"), timeout=60).read()
        def poll():
            # Keyed on the last evaluation's timestamp, which Prometheus sets with its
            # duration once the evaluation is done: its iteration counter moves when an
            # evaluation is scheduled, so a poll during one read the previous duration
            # again (or 0 before the first) and lost the one in progress.
            page = metrics_page(f"{base}/metrics")
            done = {label(k, "rule_group"): v for k, v in page.items()
                    if k.startswith("prometheus_rule_group_last_evaluation_timestamp_seconds{") and v > 0}
            return {group.split(";")[-1]: (at, page[f'prometheus_rule_group_last_duration_seconds{{rule_group="{group}"}}'],
                                           False) for group, at in done.items()}
        measure_began = time.time()
        seen, loads = watch(poll, measure)
        page = metrics_page(f"{base}/metrics")
        missed = {label(k, "rule_group").split(";")[-1]: v for k, v in page.items()
                  if k.startswith("prometheus_rule_group_iterations_missed_total{")}
        # The rules unloaded before their expressions are asked one by one, so that each
        # has the cores to itself instead of sharing them with every group the rule
        # manager runs at once; asked as of the end of the measurement, before the
        # unloaded groups' recorded series were marked stale.
        measured_until = time.time()
        write_yaml(path, config)
        urllib.request.urlopen(urllib.request.Request(f"{base}/-/reload", method="POST"), timeout=60).read()
        stats = rule_stats(base, rules, at=measured_until)
        rss = rss_bytes(prom.process.pid)
    finally:
        prom.stop(timeout=60)
    return {"engine": "Prometheus", "load_seconds": loaded, "samples_loaded": samples, "durations": seen,
            "missed": missed, "rules": stats, "rss_bytes": rss, "load_average": loads,
            "began_after_present": measure_began - fleet.present}


def victoria_run(fleet: FleetRounds, work: Path, rules: list[Path], measure: float, begin: float) -> dict:
    port, alert_port = free_port(HOST), free_port(HOST)
    vm = start_victoria_metrics(work / "vm-data", HOST, port, work / "victoria-metrics.log", retention="30d")
    base = f"http://{HOST}:{port}"
    alert = None
    try:
        began = time.monotonic()
        samples = victoria_import(fleet, base)
        loaded = time.monotonic() - began
        wait_until(fleet.present + begin)
        copies, _ = vmalert_rules(rules, work / "vmalert-rules")
        # Nothing listens on the discard port: vmalert's notifications go nowhere.
        alert = start_vmalert(copies, base, f"http://{HOST}:9", HOST, alert_port, work / "vmalert.log",
                              evaluation_interval="30s", labels={"cluster": fleet.cluster})

        def poll():
            page = metrics_page(f"http://{HOST}:{alert_port}/metrics")
            sums = {label(k, "group"): v for k, v in page.items()
                    if k.startswith("vmalert_iteration_duration_seconds_sum{")}
            return {label(k, "group"): (v, sums[label(k, "group")], True) for k, v in page.items()
                    if k.startswith("vmalert_iteration_duration_seconds_count{")}
        measure_began = time.time()
        seen, loads = watch(poll, measure)
        rss = rss_bytes(vm.process.pid) + rss_bytes(alert.process.pid)
    finally:
        if alert is not None:
            alert.stop()
        vm.stop(timeout=60)
    return {"engine": "vmalert + VictoriaMetrics", "load_seconds": loaded, "samples_loaded": samples,
            "durations": seen, "missed": {}, "rules": [], "rss_bytes": rss, "load_average": loads,
            "began_after_present": measure_began - fleet.present}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def report(rows: list[dict], intervals: dict[str, float], args, fleet: FleetRounds) -> None:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    source = f"rules {' '.join(str(p) for p in args.rules)}" if args.rules else f"rules/*.yaml at commit {commit}"
    print(f"\n{args.recording.name}: {len(fleet.rounds)} rounds 30 s apart ({args.history} before the "
          f"measurement began), {args.nodes} nodes x 8 GPUs; {source}; {args.measure:.0f} s "
          f"measured per engine; {os.cpu_count()} CPUs, load average at the end {os.getloadavg()[0]:.1f}\n")
    for row in rows:
        print(f"{row['engine']}: {row['samples_loaded']:,} samples loaded in {row['load_seconds']:.0f} s, "
              f"measuring began {row['began_after_present']:+.0f} s from the present round, "
              f"RSS at the end {row['rss_bytes'] / 2**30:.2f} GiB" + (
                  f", load average while measuring {sum(row['load_average']) / len(row['load_average']):.1f} "
                  f"(max {max(row['load_average']):.1f})" if row.get("load_average") else ""))
    names = sorted(intervals)
    print("\n| rule group | interval | " + " | ".join(f"{r['engine']} mean / worst (worst / interval)" for r in rows)
          + " | samples touched a cycle |")
    print("|---|---:|" + "---:|" * len(rows) + "---:|")
    for name in names:
        cells = []
        for row in rows:
            seen = row["durations"].get(name)
            if not seen:
                cells.append("-")
                continue
            worst = max(seen)
            cells.append(f"{1000 * sum(seen) / len(seen):,.0f} / {1000 * worst:,.0f} ms "
                         f"({100 * worst / intervals[name]:.1f}%)" + (
                             f", {row['missed'][name]:.0f} missed" if row["missed"].get(name) else ""))
        stats = next((r["rules"] for r in rows if r["rules"]), None)
        touched = sum(r["samples"] for r in stats if r["group"] == name) if stats else None
        print(f"| {name} | {intervals[name]:g} s | " + " | ".join(cells) + f" | "
              f"{'-' if touched is None else f'{touched:,}'} |")
    stats = next((r["rules"] for r in rows if r["rules"]), [])
    print("\ncostliest expressions (one evaluation through Prometheus' query API, stats=all):")
    for rule in sorted(stats, key=lambda r: -r["seconds"])[:args.top]:
        print(f"  {rule['seconds'] * 1000:>9,.0f} ms {rule['samples']:>12,} samples  {rule['group']:<26} {rule['rule']}"
              + (f" [{rule['severity']}]" if rule["severity"] else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=28, help="use the recording's last ROUNDS rounds")
    parser.add_argument("--history", type=int, default=14,
                        help="rounds before the measurement begins (the rest reach into the future)")
    parser.add_argument("--measure", type=float, default=180.0, help="seconds of evaluation measured per engine")
    parser.add_argument("--lead", type=float, default=420.0,
                        help="seconds ahead the present round is placed (about the time loading takes)")
    parser.add_argument("--begin", type=float, default=0.0,
                        help="seconds from the present round at which the measurement begins, where loading "
                             "is done by then (it begins once loaded otherwise); runs to compare need the same")
    parser.add_argument("--engines", default="prometheus,victoriametrics")
    parser.add_argument("--rules", type=Path, nargs="*", default=None, help="rule files (default: rules/*.yaml)")
    parser.add_argument("--top", type=int, default=12, help="costliest expressions listed")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    # Absolute: Prometheus reads rule_files relative to its config file's directory, and
    # a glob that matches nothing is no error (it would evaluate no rules at all).
    rules = [Path(p).resolve() for p in args.rules] if args.rules else rule_files()
    rounds = load_recording(args.recording)[-args.rounds:]
    if args.history >= len(rounds):
        raise SystemExit(f"--history {args.history}: the recording has only {len(rounds)} rounds")
    intervals = group_intervals(rules, 30.0)
    rows = []
    for engine in args.engines.split(","):
        with tempfile.TemporaryDirectory(prefix="rule-cost-", dir=REPO / "var") as tmp:
            # Loading takes minutes: the present is placed that far ahead, so measuring
            # starts about when round --history is due.
            fleet = FleetRounds(rounds, args.nodes, args.history, time.time() + args.lead)
            run = prometheus_run if engine == "prometheus" else victoria_run
            rows.append(run(fleet, Path(tmp), rules, args.measure, args.begin))
            print(json.dumps(rows[-1]), flush=True)
    report(rows, intervals, args, fleet)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
