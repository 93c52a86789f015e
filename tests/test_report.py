"""`fabricscope report` on bad input: a clear message and exit status 2, nothing half
written. (The report drawn from a real Prometheus and opened in Chromium is in
test_dashboards_e2e.py.)"""
from __future__ import annotations

import pytest

from fabricscope import cli
from fabricscope.dashboards import model, report, units
from fabricscope.stack import free_port


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
