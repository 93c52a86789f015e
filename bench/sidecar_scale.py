"""The sidecar at fleet size, against the sharded set-up's store: the live blast-radius
merge and the registered questions, timed through the store's query API.

    .venv/bin/python bench/sidecar_scale.py var/rule-cost/faults.jsonl.gz --nodes 1000

The store is demo/stack/shards.py's `ShardedVictoria` (one VictoriaMetrics with the
set-up's dedup, vmagent members in cluster mode, one vmalert for the fleet's cluster on
the rules scoped to it, writing its recording rules back), loaded with a recording of the
demo cluster's real exposition expanded to --nodes (bench/rule_cost_isolated.py's
`FleetRounds`: the simulated nodes in full, copies of node 0 for the rest). The vmagents
have nothing to scrape: the fleet comes from the recording, so no simulator competes
with the store for the cores. The rounds are shifted so that the last --ahead of them
fall in the next minutes: vmalert evaluates on data that looks live, and its recording
rules have points for the questions that read them.

After --settle seconds of evaluation the vmalert and the vmagents are stopped (on these 2
shared cores vmalert's evaluation of every group at 1,000 nodes takes the cores; docs/scale.md)
and every query below is asked at that one moment (`time=`, `nocache=1`), against the
store's URL (what the sidecar's --prometheus-url would be):
- the live merge: `LiveTopology.refresh()` over the inventory of --nodes nodes
  (demo_topology of the recording's scenario), the first refresh of a new LiveTopology
  (what the sidecar does at start) and the next one, median of --merges;
- every registered PromQL question with its default parameters asked --screen times,
  then the --top slowest and the --also ones asked --repeats times each: p50, p99 and max.
The load average is printed: the machine is shared.
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
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from rule_cost_isolated import FleetRounds, load_recording, victoria_import  # noqa: E402

from fabricscope.chaos.live import LiveTopology  # noqa: E402
from fabricscope.demo.scenario import default_scenario_path, load_scenario  # noqa: E402
from fabricscope.demo.stack.shards import ShardedVictoria  # noqa: E402
from fabricscope.demo.topology import demo_topology  # noqa: E402
from fabricscope.exporter.nvml import LinkReading  # noqa: E402
from fabricscope.exporter.nvml.remotes import remote_link_counts  # noqa: E402
from fabricscope.rules import rule_files  # noqa: E402

ROUND_SECONDS = 30            # bench/rule_cost_record.py's default interval
REMOTE_LINKS = "fabric_nvlink_remote_links"
_LINK_SERIES = re.compile(r'^(fabric_nvlink_state|fabric_nvlink_info)\{([^}]*)\} (\S+)$', re.M)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def with_remote_links(rounds: list[dict]) -> int:
    """Add fabric_nvlink_remote_links to every node of `rounds` whose exposition lacks it
    (a recording made before the exporter counted links per remote end), counted from that
    same exposition's per-link state and info by the exporter's own function; the nodes
    changed."""
    changed = 0
    for round_ in rounds:
        for node, text in round_["nodes"].items():
            if f"\n{REMOTE_LINKS}{{" in text:
                continue
            links: dict[tuple[str, str], dict] = {}
            for name, labels, value in _LINK_SERIES.findall(text):
                fields = dict(_LABEL.findall(labels))
                link = links.setdefault((fields["gpu"], fields["link"]), {"node": fields.get("node", "")})
                if name == "fabric_nvlink_state":
                    link["active"] = float(value) >= 1
                else:
                    link.update(bus=fields.get("remote_pci_bus_id", ""), kind=fields.get("remote_type", ""))
            by_gpu: dict[str, list] = {}
            for (gpu, number), link in links.items():
                if "active" in link:
                    by_gpu.setdefault(gpu, []).append((link["node"], LinkReading(
                        int(number), link["active"], remote_pci_bus_id=link.get("bus"), remote_type=link.get("kind"))))
            lines = [f'{REMOTE_LINKS}{{gpu="{gpu}",node="{readings[0][0]}",remote_pci_bus_id="{bus}",'
                     f'remote_type="{kind}",state="{state}"}} {float(count)}'
                     for gpu, readings in by_gpu.items()
                     for (bus, kind, state), count in remote_link_counts(r for _, r in readings).items()]
            if lines:
                round_["nodes"][node] = text.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
                changed += 1
    return changed


def query(base: str, promql: str, at: float | None = None) -> list[dict]:
    """An instant query, at `at` when given; nocache=1: VictoriaMetrics answers from the
    data every time, not from its rollup cache (Prometheus ignores the parameter)."""
    params = {"query": promql, "nocache": "1", **({"time": f"{at:.3f}"} if at is not None else {})}
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=120) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise ValueError(f"{promql[:60]}: {body.get('error')}")
    return body["data"]["result"]


def registered_questions() -> dict[str, str]:
    """Every registered PromQL question rendered with its default parameters (those that
    need a parameter without a default are left out)."""
    from fabricscope.queryapi.query.registry import default_registry

    registry = default_registry()
    out = {}
    for name, spec in sorted(registry.queries.items()):
        if spec.promql is None:
            continue
        try:
            out[name] = registry.render(name, registry.validate(name, {}))
        except (ValueError, LookupError):
            continue
    return out


def total_series(base: str) -> int:
    """The store's series (a count() over every series is refused past its
    -search.maxUniqueTimeseries)."""
    with urllib.request.urlopen(f"{base}/api/v1/status/tsdb", timeout=120) as answer:
        return int(json.load(answer)["data"].get("totalSeries", 0))


def timed(base: str, promql: str, at: float | None = None) -> tuple[float, int | str]:
    """Seconds and the answer's series, or the error (a refused question counts the time
    it took to be refused, and says so)."""
    began = time.perf_counter()
    try:
        series: int | str = len(query(base, promql, at))
    except urllib.error.HTTPError as exc:
        series = f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:200]}"
    except (OSError, ValueError) as exc:
        series = f"{type(exc).__name__}: {exc}"[:200]
    return time.perf_counter() - began, series


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure_merge(base: str, scenario, runs: int, at: float) -> dict:
    spent = {"queries": 0.0}

    def ask(promql: str):
        began = time.perf_counter()
        try:
            return query(base, promql, at)
        finally:
            spent["queries"] += time.perf_counter() - began

    firsts, nexts, queries = [], [], []
    for _ in range(runs):
        spent["queries"] = 0.0
        live = LiveTopology(lambda: demo_topology(scenario), ask)
        began = time.perf_counter()
        live.refresh()
        firsts.append(time.perf_counter() - began)
        queries.append(spent["queries"])
        began = time.perf_counter()
        live.refresh()
        nexts.append(time.perf_counter() - began)
        if live.live_error:
            raise SystemExit(f"live merge failed: {live.live_error}")
    return {"first": percentile(firsts, 0.5), "next": percentile(nexts, 0.5), "queries": percentile(queries, 0.5),
            "firsts": firsts, "report": live.report.to_dict() if live.report else None}


# What read every NVLink's series before fabric_nvlink_remote_links (commit 3ff50d2), timed
# at the same moment beside the queries that replaced them: the old nvlink_links_down and
# fleet_summary's NVLink term with their default parameters, and the live merge's two.
REPLACED = {
    "nvlink_links_down, per link": 'fabric_nvlink_state{ node!="", cluster=~".*", gpu!="" } == 0',
    "fleet_summary's nvlinks_down, per link": 'count(fabric_nvlink_state{ cluster=~".*" } == 0) or vector(0)',
    "merge: links per edge, from every link's info": "count by (node, gpu, remote_pci_bus_id) (fabric_nvlink_info)",
    "merge: inactive links": "fabric_nvlink_state < 1",
}


def measure_replaced(base: str, runs: int, at: float) -> list[dict]:
    rows = []
    for label, promql in REPLACED.items():
        times = [timed(base, promql, at) for _ in range(runs)]
        rows.append({"name": label, "series": times[-1][1], "p50": percentile([t for t, _ in times], 0.5),
                     "max": max(t for t, _ in times), "runs": runs})
    return rows


def measure_questions(base: str, screen: int, top: int, repeats: int, at: float,
                      also: tuple[str, ...] = ()) -> list[dict]:
    screened = {}
    for name, promql in registered_questions().items():
        times = [timed(base, promql, at) for _ in range(screen)]
        screened[name] = (max(t for t, _ in times), times[-1][1])
    slowest = sorted(screened, key=lambda n: -screened[n][0])[:top]
    questions = registered_questions()
    rows = []
    for name in [*slowest, *(n for n in also if n not in slowest)]:
        times = [timed(base, questions[name], at)[0] for _ in range(repeats)]
        rows.append({"name": name, "series": screened[name][1], "p50": percentile(times, 0.5),
                     "p99": percentile(times, 0.99), "max": max(times), "runs": repeats})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=28, help="use the recording's last ROUNDS rounds")
    parser.add_argument("--ahead", type=int, default=18,
                        help="rounds placed in the future (vmalert evaluates them as they come due)")
    parser.add_argument("--lead", type=float, default=240.0,
                        help="seconds ahead the first future round is placed (about the time loading takes)")
    parser.add_argument("--settle", type=float, default=150.0,
                        help="seconds of vmalert evaluation after loading, before measuring")
    parser.add_argument("--merges", type=int, default=3)
    parser.add_argument("--screen", type=int, default=3, help="runs of every question to find the slowest")
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=40, help="runs of each slowest question (p99)")
    parser.add_argument("--also", default="fleet_summary,nvlink_links_down",
                        help="questions also run --repeats times when not among the slowest (comma-separated; "
                             "by default the two that read every NVLink's state before fabric_nvlink_remote_links)")
    parser.add_argument("--replaced", type=int, default=10,
                        help="runs of each per-link query the NVLink questions and the merge replaced (0: none)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    rounds = load_recording(args.recording)[-args.rounds:]
    derived = with_remote_links(rounds)
    present = len(rounds) - args.ahead
    scenario = load_scenario(default_scenario_path()).with_nodes(args.nodes)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sidecar-scale-", dir=REPO / "var") as tmp:
        fleet = FleetRounds(rounds, args.nodes, present, time.time() + args.lead)
        scrape = {"global": {"scrape_interval": f"{ROUND_SECONDS}s"}, "scrape_configs": []}
        # Nothing listens on the discard port: vmalert's notifications go nowhere.
        backend = ShardedVictoria(Path(tmp), scrape, [fleet.cluster], rule_files(), "http://127.0.0.1:9",
                                  scrape_interval=f"{ROUND_SECONDS}s").start()
        try:
            began = time.monotonic()
            samples = victoria_import(fleet, backend.url)
            loaded = time.monotonic() - began
            time.sleep(max(0.0, fleet.present - time.time()) + args.settle)
            # The store alone from here: vmalert has written --settle seconds of recording
            # rules and ALERTS; on 2 shared cores its evaluation of every group at 1,000
            # nodes would take the cores the questions are timed on (docs/scale.md, "Rule
            # cost on its own"). Every query is asked at this moment (`time`), so the data
            # is as live for the last question as for the first.
            for part in [*backend.vmalerts.values(), *backend.vmagents]:
                part.stop()
            urllib.request.urlopen(f"{backend.url}/internal/force_flush", timeout=60).read()
            at = time.time() - 1
            series = total_series(backend.url)
            live_nodes = len(query(backend.url, "up", at))
            last_round = fleet.timestamps()[-1] - at
            merge = measure_merge(backend.url, scenario, args.merges, at)
            questions = measure_questions(backend.url, args.screen, args.top, args.repeats, at,
                                          tuple(n for n in args.also.split(",") if n))
            replaced = measure_replaced(backend.url, args.replaced, at) if args.replaced else []
        finally:
            backend.stop()
    load_after = os.getloadavg()

    print(f"{args.recording.name}: {len(rounds)} rounds {ROUND_SECONDS} s apart ({args.ahead} of them placed in "
          f"the future), {args.nodes} nodes; commit {commit}; {os.cpu_count()} CPUs shared; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"store: ShardedVictoria (VictoriaMetrics -dedup.minScrapeInterval={ROUND_SECONDS}s, 3 vmagent members, "
          f"vmalert of cluster {fleet.cluster!r} on the scoped rules); {samples:,} samples loaded in {loaded:.0f} s; "
          f"{series:,} series; vmalert evaluated {args.settle:.0f} s, then stopped; every query asked at "
          f"one moment, when {live_nodes} nodes were up and the recording's last round {last_round:+.0f} s away")
    if derived:
        print(f"{REMOTE_LINKS}: not in the recording; added to {derived} node rounds, counted from each round's "
              f"own fabric_nvlink_state and _info by the exporter's function (exporter/nvml/remotes.py)")
    report = merge["report"] or {}
    print(f"\nlive merge (LiveTopology.refresh over demo_topology of {args.nodes} nodes), median of {args.merges}:")
    print(f"  first refresh {merge['first']:.2f} s (runs: {', '.join(f'{t:.2f}' for t in merge['firsts'])}); "
          f"its queries {merge['queries']:.2f} s; next refresh {merge['next']:.2f} s")
    print(f"  merged: {report.get('ports')} ports, {report.get('nvlinks')} NVLink edges, {report.get('jobs')} jobs, "
          f"{report.get('unmatched_count')} unmatched")
    print(f"\nthe {args.top} slowest registered questions ({args.screen} screening runs each of "
          f"{len(registered_questions())}), then --also ({args.also or 'none'}) where not among them, "
          f"{args.repeats} runs each:")
    print(f"  {'question':34s} {'series':>7s} {'p50 s':>7s} {'p99 s':>7s} {'max s':>7s}")
    for row in questions:
        series = row["series"] if isinstance(row["series"], int) else "error"
        print(f"  {row['name']:34s} {series:>7} {row['p50']:7.2f} {row['p99']:7.2f} {row['max']:7.2f}")
    for row in questions:
        if not isinstance(row["series"], int):
            print(f"  {row['name']}: {row['series']}")
    if replaced:
        print(f"\nthe per-link queries these replaced, at the same moment, {args.replaced} runs each:")
        print(f"  {'query':48s} {'series':>7s} {'p50 s':>7s} {'max s':>7s}")
        for row in replaced:
            series = row["series"] if isinstance(row["series"], int) else "error"
            print(f"  {row['name']:48s} {series:>7} {row['p50']:7.2f} {row['max']:7.2f}")
    if args.json:
        args.json.write_text(json.dumps({"commit": commit, "nodes": args.nodes, "load": [load_before, load_after],
                                         "samples": samples, "load_seconds": loaded, "series": series,
                                         "merge": merge, "questions": questions, "replaced": replaced},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
