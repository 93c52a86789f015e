"""`fabricscope report` on bad input: a clear message and exit status 2, nothing half
written. (The report drawn from a real Prometheus and opened in Chromium is in
test_dashboards_e2e.py.)"""
from __future__ import annotations

import math

import pytest

from fabricscope import cli
from fabricscope.dashboards import model, render, report, units
from fabricscope.demo.stack import free_port


def run(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["report", *args])
    return code, capsys.readouterr().err


def test_unreachable_prometheus_is_named(capsys, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    code, err = run(capsys, "--prometheus-url", url, "--out", str(tmp_path / "r"))
    assert code == 2 and f"Prometheus at {url} is unreachable" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, message", [
    (["--from", "yesterday"], "bad time 'yesterday'"),
    (["--from", "now", "--to", "now-1h"], "must be after --from"),
    (["--dashboard", "nope"], "unknown dashboard(s) nope"),
    (["--var", "node"], "expected NAME=VALUE"),
    (["--scrape-interval", "0"], "expected a positive interval"),
    (["--scrape-interval", "fast"], "expected a positive interval"),
    (["--sidecar-url", "https://127.0.0.1:19500"], "--sidecar-url needs --sidecar-token-file"),
    (["--sidecar-url", "https://127.0.0.1:19500", "--sidecar-token-file", "/nonexistent/token"],
     "--sidecar-token-file /nonexistent/token: No such file or directory"),
])
def test_bad_arguments_get_a_specific_error(capsys, tmp_path, args, message):
    code, err = run(capsys, "--prometheus-url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path), *args)
    assert code == 2 and message in err


def test_times_parse_in_every_documented_form():
    now = 1_800_000_000.0
    assert report.parse_time("now", now) == now
    assert report.parse_time("now-30m", now) == now - 1800
    assert report.parse_time("now-2h", now) == now - 7200
    assert report.parse_time("1799990000", now) == 1799990000
    assert report.parse_time("2027-01-15T08:00:00Z") == report.parse_time("2027-01-15T09:00:00+01:00")
    assert report.parse_time("2027-01-15T08:00:00") == report.parse_time("2027-01-15T08:00:00Z")


def test_variables_are_formatted_as_grafana_formats_them_for_prometheus():
    variables = model.Variables(values={"node": ["gpu-node-1", "gpu.node(2)"], "cluster": ["a"], "usd": ["2.5"]},
                                regex_formatted={"node", "cluster"}, builtins={"__rate_interval": "1m"})
    assert variables.substitute('x{node=~"$node", cluster=~"${cluster}"}[$__rate_interval] * $usd') == \
        r'x{node=~"(gpu-node-1|gpu\.node\(2\))", cluster=~"a"}[1m] * 2.5'
    with pytest.raises(model.DashboardModelError, match=r"\$gpu is not defined"):
        variables.substitute('x{gpu=~"$gpu"}')


def test_scrape_interval_takes_prometheus_durations():
    assert [report.parse_interval(text) for text in ("15s", "1m", "500ms", "5", "2.5")] == [15, 60, 0.5, 5, 2.5]


def test_rate_interval_follows_grafana():
    assert model.rate_interval(step_seconds=2, scrape_seconds=1) == "4s"
    assert model.rate_interval(step_seconds=60, scrape_seconds=15) == "75s"


@pytest.mark.parametrize("value, unit, shown", [
    (0.000250, "s", "250 µs"), (2.5e9, "Bps", "2.5 GB/s"), (0.042, "percentunit", "4.2%"),
    (1234.5, "currencyUSD", "$1,234.50"), (3.2, "suffix:x", "3.2x"), (None, "s", "–"), (7, "none", "7"),
])
def test_units_read_as_grafana_shows_them(value, unit, shown):
    assert units.format_value(value, unit) == shown


def _series(labels: dict, values: list, t0: float = 1000.0, step: float = 10.0) -> dict:
    return {"metric": labels, "values": [[t0 + i * step, str(v)] for i, v in enumerate(values)]}


def test_series_selection_keeps_the_anomaly_not_the_first_labels():
    """40 healthy links at ~1 error/s and one failing at 50 (named last): the failing one
    is drawn, and a second target (a reference line) keeps its share."""
    target, line = {"refId": "A"}, {"refId": "B"}
    healthy = [(target, _series({"link": f"{i:02d}"}, [1, 1.1, 0.9])) for i in range(40)]
    failing = (target, _series({"link": "99"}, [1, 50, 48]))
    reference = (line, _series({}, [3, 3, 3]))
    chosen = render.select_series([*healthy, failing, reference], limit=12)
    assert len(chosen) == 12 and failing in chosen and reference in chosen


def test_critical_alerts_come_before_larger_warnings():
    target = {"refId": "A"}
    warnings = [(target, _series({"alertname": f"W{i}", "severity": "warning"}, [5, 5])) for i in range(5)]
    critical = (target, _series({"alertname": "Microburst", "severity": "critical"}, [1, 1]))
    assert critical in render.select_series([*warnings, critical], limit=3)


def test_legends_tell_series_apart_when_the_format_does_not():
    fmt = {"refId": "A", "legendFormat": "comm {{comm}} rank {{rank}} {{op}} in flight"}
    hang = {"refId": "B", "legendFormat": "comm {{comm}} rank {{rank}} {{op}} hang line"}
    comm = "56eaf98445ac3177" * 2
    pairs = [(fmt, _series({"comm": comm, "rank": "0", "op": "allreduce"}, [1])),
             (fmt, _series({"comm": comm, "rank": "1", "op": "allreduce"}, [1])),
             (hang, _series({"comm": comm, "rank": "0", "op": "allreduce"}, [1]))]
    names = render.legends(pairs)
    assert names == ["rank=0 in flight", "rank=1 in flight", "rank=0 hang line"]


def test_gaps_stay_gaps():
    series = {"metric": {}, "values": [[0, "1"], [10, "1"], [60, "2"], [70, "2"]]}
    _, values = render.points(series, step=10)
    assert len(values) == 5 and math.isnan(values[2])
    assert not any(math.isnan(v) for v in render.points(series)[1])


def test_table_rows_are_worst_first_each_column_in_its_unit_and_the_cut_is_said(tmp_path):
    panel = {"title": "Worst", "fieldConfig": {"defaults": {"unit": "suffix: MAD"}, "overrides": [
        {"matcher": {"id": "byName", "options": "late by"}, "properties": [{"id": "unit", "value": "s"}]}]},
        "transformations": [{"id": "merge"}, {"id": "organize", "options": {
            "excludeByName": {"Time": True}, "renameByName": {"Value #A": "score", "Value #B": "late by"}}}]}
    a, b = {"refId": "A"}, {"refId": "B"}
    ranks = range(20)
    results = [(a, [_series({"rank": str(r)}, [float(r)]) for r in ranks]),
               (b, [_series({"rank": str(r)}, [r / 1000]) for r in ranks])]
    drawn = render.table(panel, results, tmp_path / "t.png")
    assert drawn.total == 20 and len(drawn.shown) == render.MAX_TABLE_ROWS
    assert [row["rank"] for row in drawn.shown[:3]] == ["19", "18", "17"]
    assert drawn.note == f"{render.MAX_TABLE_ROWS} of 20 rows (the largest first)"
    assert (tmp_path / "t.png").stat().st_size > 0


def test_state_timeline_keeps_the_rows_that_left_the_usual_state(tmp_path):
    panel = {"title": "Ports", "fieldConfig": {"defaults": {"mappings": [{"type": "value", "options": {
        "1": {"text": "up", "color": "green"}, "0": {"text": "down", "color": "red"}}}]}}}
    target = {"refId": "A", "legendFormat": "{{port}}"}
    steady = [_series({"port": f"p{i:02d}"}, [1, 1, 1, 1]) for i in range(35)]
    flapping = _series({"port": "zz-flapping"}, [1, 0, 1, 0])
    drawn = render.state_timeline(panel, [(target, [*steady, flapping])], 1000, 1040, tmp_path / "s.png")
    assert "zz-flapping" in drawn.shown and drawn.total == 36
    assert drawn.note == f"{render.MAX_TIMELINE_ROWS} of 36 rows (those most often not up)"
