"""The PromQL rules: rendered files in sync with the mixin, valid, and unit-tested.

Runs the real tools: the Debian `jsonnet` binary renders, `promtool check rules` and
`promtool test rules` (rules/tests/*.yaml) check. Each failure prints the tool's output.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fabricscope.demo import stack
from fabricscope.rules import render as render_module

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "rules"
RUNBOOKS = REPO / "docs" / "runbooks"
RENDERED = ("fabricscope-recording.yaml", "fabricscope-alerts.yaml")
SEVERITIES = {"critical", "warning", "info"}



def tool(name: str) -> str:
    """Path of a Debian-packaged tool; these tests fail (not skip) without it."""
    try:
        return stack.find_binary(name)
    except stack.StackError as exc:
        pytest.fail(str(exc))


def run(command: list[str], cwd: Path = RULES) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True)


def alert_rules(path: Path = RULES / "fabricscope-alerts.yaml") -> list[dict]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def unit_test_cases() -> list[dict]:
    cases = []
    for path in sorted((RULES / "tests").glob("*.yaml")):
        for test in yaml.safe_load(path.read_text())["tests"]:
            cases.extend(test.get("alert_rule_test") or [])
    return cases


def test_rendered_files_are_in_sync_with_the_mixin(tmp_path):
    rendered = render_module.render({}, tmp_path)
    for path in rendered:
        committed = RULES / path.name
        assert committed.exists(), f"{committed} missing: run `make -C rules render`"
        assert committed.read_text() == path.read_text(), (
            f"{committed.name} differs from what rules/mixin renders to: run `make -C rules render`")


def test_rendering_is_deterministic(tmp_path):
    first = render_module.render({}, tmp_path / "a")
    second = render_module.render({}, tmp_path / "b")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_promtool_check_rules_accepts_the_rendered_files():
    result = run([tool("promtool"), "check", "rules", *RENDERED])
    assert result.returncode == 0, f"promtool check rules failed:\n{result.stdout}\n{result.stderr}"


def test_promtool_unit_tests_pass():
    test_files = sorted(str(p.relative_to(RULES)) for p in (RULES / "tests").glob("*.yaml"))
    assert test_files, "no promtool test files in rules/tests"
    result = run([tool("promtool"), "test", "rules", *test_files])
    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}\n{result.stderr}"


def test_microburst_cases_are_generated_from_the_exporters_bucket_layout():
    """rules/tests/tcp_microburst.yaml is what the generator writes from the exporter's
    current bucket layout and the mixin's current thresholds (it cannot drift)."""
    import sys

    result = run([sys.executable, str(RULES / "tests" / "generate_microburst.py"), "--check"], cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_every_alert_follows_the_mixin_conventions():
    names = set()
    for rule in alert_rules():
        name = rule["alert"]
        names.add(name)
        assert re.fullmatch(r"Fabric[A-Z][A-Za-z0-9]+", name), name
        assert rule["labels"].get("severity") in SEVERITIES, name
        annotations = rule["annotations"]
        assert set(annotations) >= {"summary", "description", "runbook_url"}, name
        assert annotations["summary"].endswith(".") and annotations["summary"].count(". ") == 0, name
        assert "{{" in annotations["description"], f"{name}: description is not templated"
        assert annotations["runbook_url"].endswith(f"/docs/runbooks/{name}.md"), name
        runbook = RUNBOOKS / f"{name}.md"
        assert runbook.exists(), f"{name}: no runbook at {runbook.relative_to(REPO)}"
        assert runbook.read_text().startswith(f"# {name}"), f"{runbook.name} must start with '# {name}'"
    assert len(names) >= 20


def test_every_alert_and_severity_has_firing_and_quiet_cases():
    cases = unit_test_cases()
    fired = {(case["alertname"], alert["exp_labels"]["severity"])
             for case in cases for alert in case.get("exp_alerts") or []}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    for rule in alert_rules():
        key = (rule["alert"], rule["labels"]["severity"])
        assert key in fired, f"no promtool case where {key[0]} fires at severity {key[1]}"
        assert rule["alert"] in quiet, f"no promtool case where {rule['alert']} is expected not to fire"
    for case in cases:
        for alert in case.get("exp_alerts") or []:
            assert alert.get("exp_annotations"), f"{case['alertname']} at {case['eval_time']}: annotations not checked"


def test_overrides_render_a_fast_variant_that_promtool_accepts(tmp_path):
    overrides = {"for": {"ncclHang": "10s", "straggler": "30s"},
                 "intervals": {"nccl": "5s"},
                 "windows": {"tcpBaseline": "1m"},
                 "thresholds": {"nvlinkErrorRates": {"replay": 5}},
                 "runbookUrlBase": "http://runbooks.local/"}
    paths = render_module.render(overrides, tmp_path)
    result = run([tool("promtool"), "check", "rules", *map(str, paths)])
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {(r["alert"], r["labels"]["severity"]): r for r in alert_rules(tmp_path / "fabricscope-alerts.yaml")}
    assert alerts[("FabricNcclHang", "critical")]["for"] == "10s"
    assert alerts[("FabricNcclStragglerRank", "warning")]["for"] == "30s"
    assert alerts[("FabricNcclHang", "critical")]["annotations"]["runbook_url"] == "http://runbooks.local/FabricNcclHang.md"
    assert 'type="replay"}[5m]) > 5' in alerts[("FabricNvlinkErrors", "warning")]["expr"]
    # Untouched settings keep their production values.
    assert alerts[("FabricExporterDown", "critical")]["for"] == "5m"
    recording = yaml.safe_load((tmp_path / "fabricscope-recording.yaml").read_text())["groups"]
    intervals = {group["name"]: group["interval"] for group in recording}
    assert intervals["fabric-nccl.rules"] == "5s" and intervals["fabric-tcp.rules"] == "10s"
    baseline = next(r for g in recording for r in g["rules"] if r["record"] == "node:fabric_tcp_rtt_excess_seconds_p99:avg5m")
    assert "[1m]" in baseline["expr"]


@pytest.mark.parametrize("overrides, message", [
    ({"for": {"ncclHnag": "10s"}}, "unknown config key: for.ncclHnag"),
    ({"thresholds": {"bogus": 1}}, "unknown config key: thresholds.bogus"),
    ({"for": {"ncclHang": 10}}, "config key for.ncclHang must be a string, got number"),
    ({"thresholds": {"nvlinkErrorRates": 3}}, "thresholds.nvlinkErrorRates must be an object"),
])
def test_bad_overrides_are_refused_with_the_offending_key(tmp_path, overrides, message):
    with pytest.raises(render_module.RenderError, match=re.escape(message)):
        render_module.render(overrides, tmp_path)
    assert not list(tmp_path.glob("*.yaml")), "nothing is written when overrides are refused"


def test_render_command(tmp_path):
    """`python -m fabricscope.rules.render`: what `make -C rules render` and check-sync run."""
    import sys

    overrides = tmp_path / "fast.json"
    overrides.write_text(json.dumps({"for": {"exporterDown": "15s"}}))
    command = [sys.executable, "-m", "fabricscope.rules.render"]
    result = run([*command, "--overrides", str(overrides), str(tmp_path / "out")], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    alerts = {r["alert"]: r for r in alert_rules(tmp_path / "out" / "fabricscope-alerts.yaml")}
    assert alerts["FabricExporterDown"]["for"] == "15s"
    missing = run([*command, "--overrides", str(tmp_path / "nope.json"), str(tmp_path / "x")], cwd=tmp_path)
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "nope.json" in missing.stderr
    overrides.write_text(json.dumps({"for": {"nope": "1s"}}))
    bad = run([*command, "--overrides", str(overrides), str(tmp_path / "y")], cwd=tmp_path)
    assert bad.returncode == 1 and "unknown config key: for.nope" in bad.stderr


def test_unit_tests_catch_a_moved_threshold(tmp_path):
    """The boundary cases are real: moving a threshold by one step makes them fail."""
    render_module.render({"thresholds": {"ibSymbolErrorsPerHour": 119, "microburstMultiplier": 2.9,
                                         "ncclHangMinElapsedSeconds": 9}}, tmp_path)
    shutil.copytree(RULES / "tests", tmp_path / "tests")
    result = run([tool("promtool"), "test", "rules", *sorted(str(p) for p in (tmp_path / "tests").glob("*.yaml"))],
                 cwd=tmp_path)
    assert result.returncode != 0
    for alertname in ("FabricInfinibandPreFailureBER", "FabricTcpMicroburst", "FabricNcclHang"):
        assert f"alertname: {alertname}," in result.stdout + result.stderr, f"{alertname} boundary case did not notice"


def test_the_documented_demo_overrides_render(tmp_path):
    """docs/rules.md's fast-demo override block is valid: keys exist, promtool accepts it."""
    text = (REPO / "docs" / "rules.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    assert blocks, "docs/rules.md lost its overrides example"
    paths = render_module.render(json.loads(blocks[0]), tmp_path)
    result = run([tool("promtool"), "check", "rules", *map(str, paths)])
    assert result.returncode == 0, result.stdout + result.stderr
    groups = yaml.safe_load((tmp_path / "fabricscope-alerts.yaml").read_text())["groups"]
    assert all("interval" not in group for group in groups), "'' intervals must fall back to the global one"


# Families an exporter exports only where the host has them, which the demo cannot fake:
# ethtool -S driver counters (opt-in, read by an ioctl on a real NIC). Each is checked
# against the collector that declares it instead.
OPT_IN_FAMILIES = {"fabric_netdev_ethtool_counter": "exporter/collectors/netdev.py"}


def exported_families() -> set[str]:
    """Metric families the demo cluster's exporters (every collector on) actually serve:
    the TYPE lines of a real scrape of each simulated node."""
    import tempfile
    import time
    import urllib.request

    from fabricscope.demo import cluster as cluster_mod, scenario as scenario_mod

    families: set[str] = set()
    with tempfile.TemporaryDirectory() as work, cluster_mod.DemoCluster(
            scenario_mod.load_scenario(scenario_mod.default_scenario_path()), Path(work) / "cluster") as cluster:
        time.sleep(2)     # a tick or two: every source has produced its first values
        for _, address in cluster.targets:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as response:
                families |= {re.sub(r"_total$", "", name)   # a counter's TYPE may name it with _total
                             for name in re.findall(r"^# TYPE (\S+)", response.read().decode(), re.M)}
    return families


def test_rules_only_use_metrics_the_exporter_serves():
    """Every raw fabric_* series a rule reads is served by the exporter (a real scrape of the
    demo cluster, every collector on) and listed in docs/metrics.md (the metric-name
    contract), so a rename cannot silently blind an alert."""
    served = exported_families()
    documented = (REPO / "docs" / "metrics.md").read_text()
    expressions = [rule["expr"] for path in RENDERED
                   for group in yaml.safe_load((RULES / path).read_text())["groups"] for rule in group["rules"]]
    # Raw names only: parts of recorded names (level:metric:ops) are preceded by a colon.
    used = {name for expr in expressions for name in re.findall(r"(?<![:\w])fabric_[a-z0-9_]+", expr)}
    assert len(used) > 20
    missing_in_exporter, missing_in_docs = [], []
    for name in sorted(used):
        family = re.sub(r"_(bucket|sum|count|total)$", "", name)
        if family in OPT_IN_FAMILIES:
            assert f'"{family}"' in (REPO / OPT_IN_FAMILIES[family]).read_text(), family
        elif family not in served:
            missing_in_exporter.append(name)
        if family not in documented and family.replace("_receive_", "_transmit_") not in documented:
            missing_in_docs.append(name)
    assert not missing_in_exporter, f"rules read series no exporter serves: {missing_in_exporter}"
    assert not missing_in_docs, f"rules read series docs/metrics.md does not list: {missing_in_docs}"
