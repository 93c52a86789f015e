"""Every PromQL expression of every dashboard, run against a real Prometheus scraping the
demo cluster with the rules loaded, during a scenario that holds the faults the panels
are there to show.

Grafana itself is not installable here, so this is how the dashboards are proven: the
queries are read from the committed JSON (what Grafana provisions), the template variables
are resolved against Prometheus in order, each label_values selector with the variables
before it substituted (as Grafana chains them; "All" selected), `$__rate_interval` is what
Grafana would compute for the step, and each expression must parse and return data in the
scenario's window. A panel that can never show anything fails here.

One short scenario for the module: 30 s healthy, then on separate nodes a symbol-error
storm, a link flap, a port down, a microburst, an NVLink failure, an mlx5 firmware fault
and a straggler rank; then an NCCL hang. Rules are rendered with shortened windows and
`for:` durations (thresholds unchanged) so alerts, which the fleet view and the
annotations show, fire within the run.
"""
from __future__ import annotations

import html
import json
import os
import re
import struct
import subprocess
import time

import pytest
import requests
import yaml

from fabricscope import cli
from fabricscope.demo import stack
from fabricscope.dashboards import model
from fabricscope.demo.main import write_targets_file
from tests import procs

pytestmark = pytest.mark.slow

CLUSTER = "dash"
HEALTHY = 30
FAULT_END = HEALTHY + 45
HANG_AT = FAULT_END + 5
END = HANG_AT + 30
SCRAPE_SECONDS = 1
STEP_SECONDS = 2

SCENARIO = {
    "seed": 13, "tick_seconds": 0.5,
    "cluster": {"name": CLUSTER, "nodes": 4, "gpus_per_node": 2, "hcas_per_node": 2},
    "faults": [
        {"kind": "symbol_error_storm", "node": 1, "at": HEALTHY, "duration": 45,
         "target": {"device": "mlx5_1", "port": 1}, "params": {"rate_per_second": 25}},
        {"kind": "link_flap", "node": 0, "at": HEALTHY, "target": {"device": "mlx5_1", "port": 1},
         "params": {"count": 3, "period_seconds": 10, "down_seconds": 5}},
        {"kind": "link_down", "node": 2, "at": HEALTHY, "duration": 40, "target": {"device": "mlx5_0", "port": 1}},
        {"kind": "microburst", "node": 3, "at": HEALTHY, "duration": 40},
        {"kind": "nvlink_down", "node": 0, "at": HEALTHY, "duration": 45, "target": {"gpu": 1, "link": 3}},
        {"kind": "mlx5_fatal", "node": 3, "at": HEALTHY, "duration": 30, "target": {"device": "mlx5_0"}},
        {"kind": "straggler_rank", "at": HEALTHY, "duration": 45, "target": {"rank": 5},
         "params": {"lag_seconds": 0.1}},
        {"kind": "nccl_hang", "at": HANG_AT, "duration": 30, "target": {"rank": 2}},
    ],
}

# Same thresholds, windows short enough for a run of minutes (keys of rules/mixin/config.libsonnet).
RULE_OVERRIDES = {
    "intervals": {group: "1s" for group in ("tcp", "nccl", "infiniband", "nvlink", "kernel", "pipeline")},
    "windows": {"tcpBaseline": "30s", "ncclLag": "15s", "ncclNodeOffset": "30s", "ibFlap": "2m",
                "nvlinkRate": "15s", "nvlinkBaseline": "30s"},
    "for": {key: "5s" for key in stack.FAST_ALERT_OVERRIDES["for"]},
}
# The exporters' p99 window shortened like the rules' windows (rendered with the same config).
EXPORTER_CONFIG = {"ebpf": {"window_seconds": {"fabric_tcp_rtt_excess_seconds": 10}}}

DASHBOARDS = model.load_all()
QUERIES = [query for name, board in sorted(DASHBOARDS.items()) for query in model.prometheus_queries(name, board)]


# A path through the microburst node: one device in three has an anomaly -> confidence 1/3.
SPAN_PATH = ["gpu-node-3", "leaf-su0-r0", "gpu-node-1"]
TOPOLOGY = {"name": CLUSTER, "generate": {"hosts": 4, "job_hosts": 4}}

INFINITY = [(name, panel, target) for name, board in sorted(DASHBOARDS.items())
            for panel, target in model.infinity_targets(name, board)]


class Run:
    def __init__(self, prometheus: procs.Server, start: float, end: float) -> None:
        self.prometheus = prometheus
        self.start, self.end = start, end
        self.variables: dict[str, model.Variables] = {}
        self.sidecar_url = ""
        self.ca = None
        self.token = ""

    def label_values(self, label: str, selector: str | None) -> list[str]:
        params = {"start": self.start, "end": self.end}
        if selector:
            params["match[]"] = selector
        return self.prometheus.get(f"/api/v1/label/{label}/values", **params)["data"]

    def query_range(self, expr: str) -> requests.Response:
        return requests.get(self.prometheus.url + "/api/v1/query_range", timeout=30, params={
            "query": expr, "start": self.start, "end": self.end, "step": STEP_SECONDS})

    def send(self, request: model.InfinityRequest) -> requests.Response:
        """As the Infinity datasource sends it, with the bearer token its provisioning sets."""
        return requests.request(request.method, request.url, params=request.params, data=request.body,
                                headers={"Authorization": f"Bearer {self.token}",
                                         **({"Content-Type": "application/json"} if request.body else {})},
                                verify=str(self.ca), timeout=30)


def post_spans(run: Run, sequence: int) -> None:
    """One violating span (2.5 s against the 2 s default SLO) and one within it, over a
    path that crosses the microburst node."""
    now_ms = int(time.time() * 1000)
    spans = [{"trace_id": f"trace-{sequence}-{kind}", "span_id": f"span-{sequence}-{kind}", "service": "llm-inference",
              "operation": "generate", "start_time_ms": now_ms - duration, "end_time_ms": now_ms,
              "duration_ms": duration, "network_path": SPAN_PATH, "attributes": {"model": "demo"}}
             for kind, duration in (("slow", 2500), ("fast", 400))]
    response = requests.post(run.sidecar_url + "/tracing/spans", json={"spans": spans}, verify=str(run.ca),
                             headers={"Authorization": f"Bearer {run.token}"}, timeout=30)
    assert response.status_code in (200, 201, 202), response.text


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from fabricscope.demo import cluster as cluster_mod, scenario as scenario_mod
    from fabricscope.devcerts import ensure_dev_certs
    from fabricscope.demo.stack.sidecar import mint_key, start_sidecar

    procs.require_binary("prometheus")
    work = tmp_path_factory.mktemp("dash-e2e")
    rules = stack.render_rules(RULE_OVERRIDES, work / "rules", EXPORTER_CONFIG)
    certs = ensure_dev_certs(work / "sidecar" / "tls")
    # The key the Grafana Infinity datasource is provisioned with: read, and write for
    # the chaos dashboard's simulation request.
    token = mint_key(work / "keys.yaml", "grafana", "read,write")
    topology = stack.write_yaml(work / "topology.yaml", TOPOLOGY)
    sidecar_port = stack.free_port()
    with cluster_mod.DemoCluster(scenario_mod.load_scenario(SCENARIO), work / "cluster",
                                 exporter_config=EXPORTER_CONFIG) as cluster:
        t0 = time.time() - cluster.now()
        targets = write_targets_file(work / "targets.json", cluster.targets, CLUSTER)
        config = stack.prometheus_config(CLUSTER, targets, "127.0.0.1:1", rules,
                                         scrape_interval=f"{SCRAPE_SECONDS}s", evaluation_interval="1s",
                                         sidecar_address=f"127.0.0.1:{sidecar_port}", sidecar_ca=certs.ca)
        with procs.prometheus(config, work / "prom") as prom:
            sidecar = start_sidecar(work / "sidecar", "127.0.0.1", sidecar_port, prom.url, work / "keys.yaml",
                                    extra_args=["--chaos-topology", str(topology)])
            try:
                result = Run(prom, t0 + 5, 0.0)
                result.sidecar_url, result.ca, result.token = sidecar.url, certs.ca, token
                sequence = 0
                while time.time() < t0 + END:
                    if time.time() > t0 + HEALTHY + 10:
                        post_spans(result, sequence)
                        sequence += 1
                    time.sleep(5)
                result.end = time.time()
                builtins = model.builtin_variables(result.start, result.end, STEP_SECONDS, SCRAPE_SECONDS)
                for name, board in DASHBOARDS.items():
                    result.variables[name] = model.resolve_variables(board, result.label_values, builtins)
                result.variables["chaos"].values["simulation_id"] = [submit_simulation(result)]
                yield result
            finally:
                sidecar.stop()


def submit_simulation(run: Run) -> str:
    """The chaos dashboard's own submit request, then its result polled until complete
    (what a click on the submitted row leads to)."""
    panel, target = next((p, t) for name, p, t in INFINITY if name == "chaos" and t["url_options"]["method"] == "POST")
    response = run.send(model.infinity_request(target, run.variables["chaos"], run.sidecar_url))
    assert response.status_code == 202, response.text
    simulation_id = response.json()["simulation_id"]
    procs.wait_for(lambda: requests.get(f"{run.sidecar_url}/graph/chaos-results/{simulation_id}", verify=str(run.ca),
                                        headers={"Authorization": f"Bearer {run.token}"}, timeout=10).status_code == 200,
                   30, "the chaos simulation to complete")
    return simulation_id


def test_every_variable_offers_values(run):
    """Each chained variable has choices on the demo cluster (an empty dropdown would
    blank every panel that uses it)."""
    empty = [f"{name}: ${var}" for name, resolved in run.variables.items()
             for var, values in resolved.values.items() if not values]
    assert empty == []
    assert run.variables["fleet"].values["cluster"] == [CLUSTER]


def recorded_series() -> set[str]:
    return {rule["record"] for path in stack.rule_files() for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "record" in rule}


RECORDED = recorded_series()


@pytest.mark.parametrize("query", QUERIES, ids=[f"{q.dashboard}: {q.where}" for q in QUERIES])
def test_query_parses_and_returns_data_during_the_scenario(run, query):
    missing = {name for name in re.findall(r"\b[a-z_]+:[a-z_]+:[a-z0-9_]+\b", query.expr) if name not in RECORDED}
    if missing:
        # Only while a rule the panel is built on has not landed in rules/ yet; the
        # moment it has, the panel must show data like every other.
        pytest.xfail(f"recording rule(s) {sorted(missing)} not in rules/*.yaml yet")
    expr = run.variables[query.dashboard].substitute(query.expr)
    response = run.query_range(expr)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", \
        f"{query.where}: Prometheus refused\n{expr}\n{body.get('error')}"
    series = body["data"]["result"]
    assert series, f"{query.where}: no data at any point of the scenario\n{expr}"
    assert any(values for item in series for values in item["values"])


def test_faults_show_up_in_the_fault_panels(run):
    """Panels that exist to show a fault are empty while the cluster is healthy and show
    the faulted target once the fault runs (not just 'some data')."""
    expectations = {
        ("infiniband", "Breached counters"): {"node": "gpu-node-1", "device": "mlx5_1"},
        ("nvlink_nccl", "NVLink links down"): {"node": "gpu-node-0", "gpu": "1", "link": "3"},
        ("nvlink_nccl", "Hanging operations"): {},
        ("fleet", "Worst InfiniBand links"): {"node": "gpu-node-1", "device": "mlx5_1"},
    }
    healthy_end = run.start + HEALTHY - 10
    for (name, title), labels in expectations.items():
        panel = next(p for p in model.panels(DASHBOARDS[name]) if p["title"] == title)
        expr = run.variables[name].substitute(panel["targets"][0]["expr"])
        healthy = run.prometheus.get("/api/v1/query_range", query=expr, start=run.start,
                                     end=healthy_end, step=STEP_SECONDS)["data"]["result"]
        assert healthy == [], f"{title} shows data while healthy: {[s['metric'] for s in healthy]}"
        faulted = run.prometheus.get("/api/v1/query_range", query=expr, start=healthy_end, end=run.end,
                                     step=STEP_SECONDS)["data"]["result"]
        assert any(all(s["metric"].get(k) == v for k, v in labels.items()) for s in faulted), \
            f"{title}: {labels} not among {json.dumps([s['metric'] for s in faulted])[:500]}"


NUMERIC = {"number", "timestamp_epoch", "timestamp_epoch_s"}


@pytest.mark.parametrize("name, panel, target", INFINITY,
                         ids=[f"{n}: panel {p['id']} {p['title']!r} {t['refId']}" for n, p, t in INFINITY])
def test_sidecar_panel_request_returns_the_fields_it_maps(run, name, panel, target):
    """The panel's request, as Infinity sends it, to the running sidecar: it succeeds and
    every row has every field the panel maps, of the mapped type."""
    request = model.infinity_request(target, run.variables[name], run.sidecar_url)
    response = run.send(request)
    assert response.status_code in (200, 202), f"{request.method} {request.url}: {response.status_code} {response.text[:500]}"
    rows = model.infinity_rows(response.json(), request.root_selector)
    assert rows, f"{request.method} {request.url} {request.params}: no rows for {panel['title']!r}"
    for row in rows:
        for column in request.columns:
            assert column["selector"] in row, f"{panel['title']!r}: no {column['selector']!r} in {sorted(row)}"
            value = row[column["selector"]]
            if column["type"] in NUMERIC:
                assert isinstance(value, (int, float)) and not isinstance(value, bool), (column, value)


def test_correlations_panel_shows_the_microburst_on_the_span_path(run):
    panel, target = next((p, t) for name, p, t in INFINITY if t["url"] == "/tracing/correlations")
    rows = model.infinity_rows(run.send(model.infinity_request(target, run.variables["tracing"], run.sidecar_url)).json(),
                               target["root_selector"])
    assert any(row["confidence"] >= 1 / 3 - 1e-9 and any(a["device"] == "gpu-node-3" for a in row["anomalies"])
               for row in rows), rows[:3]


# ------------------------------------------------------------------ the rendered report

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
# Appended to a copy of the page, beside it (so relative image paths resolve the same):
# after load, it writes what the browser made of every <img> into the DOM for --dump-dom.
IMAGE_PROBE = """<script>
window.addEventListener("load", () => {
  const images = Array.from(document.images);
  const broken = images.filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.getAttribute("src"));
  const out = document.createElement("div");
  out.id = "image-probe";
  out.dataset.total = images.length;
  out.dataset.broken = JSON.stringify(broken);
  document.body.appendChild(out);
});
</script>"""


def chromium(args: list[str], profile, timeout: float = 120) -> subprocess.CompletedProcess:
    binary = procs.require_binary("chromium")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def report(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    # No display: the report must render on a headless machine.
    env_display = os.environ.pop("DISPLAY", None)
    try:
        token_file = out.parent / "sidecar-token"
        token_file.write_text(run.token)
        code = cli.main(["report", "--prometheus-url", run.prometheus.url, "--from", str(run.start),
                         "--to", str(run.end), "--scrape-interval", str(SCRAPE_SECONDS), "--out", str(out),
                         "--sidecar-url", run.sidecar_url, "--sidecar-ca", str(run.ca),
                         "--sidecar-token-file", str(token_file)])
    finally:
        if env_display is not None:
            os.environ["DISPLAY"] = env_display
    return code, out


def test_report_draws_every_prometheus_panel_and_the_sidecar_tables(report):
    code, out = report
    assert code == 0, "some panel query failed (see stderr)"
    page = (out / "index.html").read_text()
    images = re.findall(r'<img src="([^"]+)"', page)
    drawable = [(name, p) for name, board in DASHBOARDS.items() for p in model.panels(board)
                if any(model.datasource_type(board, model.target_datasource(p, t)) == "prometheus"
                       for t in p.get("targets", []))]
    # Sidecar panels are drawn from their GET requests; the chaos submit panel POSTs a
    # simulation and its result panels need the id a click picks, so those are listed.
    sidecar_tables = [(name, p) for name, p, t in INFINITY
                      if t["url_options"]["method"] == "GET" and "simulation_id" not in model.referenced_variables(t["url"])]
    assert {name for name, _ in sidecar_tables} == {"tracing", "chaos"}
    assert len(images) == len(drawable) + len(sidecar_tables)
    for image in images:
        assert (out / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image
    for name, panel in sidecar_tables:
        assert f'src="{name}/panel-{panel["id"]}.png"' in page, panel["title"]


def test_report_opens_in_headless_chromium_with_every_image_loaded(report, tmp_path):
    code, out = report
    page = (out / "index.html").read_text()
    probe = out / "image-probe.html"
    probe.write_text(page.replace("</body>", IMAGE_PROBE + "</body>"))
    dumped = chromium(["--virtual-time-budget=15000", "--dump-dom", probe.as_uri()], tmp_path / "profile-dom")
    found = re.search(r'<div id="image-probe" data-total="(\d+)" data-broken="([^"]*)"', dumped.stdout)
    assert found, f"the page did not finish loading in chromium:\n{dumped.stderr[-2000:]}"
    total, broken = int(found[1]), json.loads(html.unescape(found[2]))
    assert total == len(re.findall(r"<img ", page)) and total > 0
    assert broken == [], f"images chromium could not load: {broken}"

    shot = out / "screenshot.png"
    taken = chromium(["--window-size=1400,2400", "--hide-scrollbars", f"--screenshot={shot}", (out / "index.html").as_uri()],
                     tmp_path / "profile-shot")
    assert shot.exists(), taken.stderr[-2000:]
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1400, 2400)
    print(f"\nreport: {out / 'index.html'}, screenshot: {shot}")


def test_report_with_pinned_variables_draws_only_the_chosen_node(run, tmp_path):
    """--var pins a variable as a dashboard selection does; the chained ones follow it."""
    out = tmp_path / "pinned"
    code = cli.main(["report", "--prometheus-url", run.prometheus.url, "--from", str(run.start), "--to", str(run.end),
                     "--scrape-interval", str(SCRAPE_SECONDS), "--out", str(out), "--dashboard", "infiniband",
                     "--var", "node=gpu-node-1"])
    assert code == 0
    page = html.unescape((out / "index.html").read_text())
    assert 'node=~"gpu-node-1"' in page and "gpu-node-0" not in page
    # device is chained on node: only gpu-node-1's HCAs are offered (all of them, "All").
    assert 'device=~"(mlx5_0|mlx5_1|mlx5_2)"' in page


def _report_data(report) -> dict:
    code, out = report
    return json.loads((out / "report.json").read_text())


def _instant(run: Run, expr: str) -> list[dict]:
    response = requests.get(run.prometheus.url + "/api/v1/query", params={"query": expr, "time": run.end}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["data"]["result"]


def test_report_tables_are_the_instant_query_at_the_end_time(run, report):
    """Every Prometheus table of the report holds exactly what its queries answer at the
    report's end time (the panel's own topk), not the last value each series had in the
    range: no port that was at 0 by then, no hang after recovery."""
    data = _report_data(report)
    checked = 0
    for name, board in DASHBOARDS.items():
        panels = {p["id"]: p for p in model.panels(board)}
        for drawn in data["dashboards"][name]["panels"]:
            panel = panels[drawn["id"]]
            if drawn["type"] != "table" or not drawn["queries"] or "shown" not in drawn:
                continue
            if drawn["queries"][0].startswith(("GET ", "POST ")):
                continue      # a sidecar table (its rows are the sidecar's answer, not PromQL)
            options = panel["transformations"][-1]["options"]
            hidden = {k for k, on in options.get("excludeByName", {}).items() if on}
            renames = options.get("renameByName", {})
            expected = {}
            for expr in drawn["queries"]:
                for item in _instant(run, expr):
                    labels = {renames.get(k, k): v for k, v in item["metric"].items() if k not in hidden | {"__name__"}}
                    expected[tuple(sorted(labels.items()))] = labels
            assert drawn["total"] == len(expected), f"{name} {panel['title']!r}"
            for row in drawn["shown"]:
                labels = {k: v for k, v in row.items() if isinstance(v, str)}
                assert tuple(sorted(labels.items())) in expected, f"{name} {panel['title']!r}: row {row} not at the end"
            checked += 1
    assert checked >= 8


# Each scripted fault and where its anomalous series must be drawn (dashboard, panel title,
# text in a drawn legend or row): the selection keeps them however many series there are.
ANOMALIES = [
    ("infiniband", "Port state", "gpu-node-2"),               # link_down mlx5_0 on node 2
    ("nvlink_nccl", "Inactive NVLink links per GPU", "gpu-node-0"),
    ("nvlink_nccl", "Arrival lag per rank (1m mean)", "5"),   # the straggler rank
    ("fleet", "Firing alerts", "FabricTcpMicroburst"),
    ("node_network", "Microburst: p99 RTT", "gpu-node-3"),
]


@pytest.mark.parametrize("name, title, text", ANOMALIES)
def test_report_draws_each_faults_anomalous_series(report, name, title, text):
    data = _report_data(report)
    panels = [p for p in data["dashboards"][name]["panels"] if p["title"].startswith(title)]
    assert panels, f"{name} has no panel {title!r}: {[p['title'] for p in data['dashboards'][name]['panels']]}"
    shown = json.dumps(panels[0]["shown"])
    assert text in shown, f"{name} {title!r} draws {panels[0]['shown']} of {panels[0]['total']}"


def test_report_marks_the_nccl_hang_on_the_node_scoped_nccl_view(report):
    annotations = _report_data(report)["dashboards"]["nvlink_nccl"]["annotations"]
    assert "FabricNcclHang" in {a["text"] for a in annotations}


def test_report_sidecar_tables_show_no_row_after_the_end_time(run, tmp_path):
    """A report that ends mid-scenario lists only the spans that ended inside its range,
    though the sidecar holds later ones (spans were posted until the end of the run): the
    panels pass the range (from_ms / to_ms) and the sidecar filters by it."""
    end = run.start + HEALTHY + 20
    token_file = tmp_path / "sidecar-token"
    token_file.write_text(run.token)
    code = cli.main(["report", "--prometheus-url", run.prometheus.url, "--from", str(run.start), "--to", str(end),
                     "--scrape-interval", str(SCRAPE_SECONDS), "--out", str(tmp_path / "report"),
                     "--dashboard", "tracing", "--sidecar-url", run.sidecar_url, "--sidecar-ca", str(run.ca),
                     "--sidecar-token-file", str(token_file)])
    assert code == 0
    panels = {p["title"]: p for p in _report_data((code, tmp_path / "report"))["dashboards"]["tracing"]["panels"]}
    ended = {"SLO violations": "end_ms", "Correlated SLO violations": "span_end_ms"}
    later = [s for s in run.send(model.infinity_request(
        next(t for n, p, t in INFINITY if t["url"] == "/tracing/slo-violations"), run.variables["tracing"],
        run.sidecar_url)).json()["violations"] if s["end_ms"] > end * 1000]
    assert later, "the sidecar holds no span after the report's end: nothing to leave out"
    for title, field in ended.items():
        rows = panels[title]["shown"]
        assert rows, f"{title}: no rows in the report's range"
        assert all(run.start * 1000 <= row[field] <= end * 1000 for row in rows), \
            f"{title}: rows outside {run.start}-{end}: {[row[field] for row in rows]}"
