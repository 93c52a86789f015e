"""Alertmanager configuration: validity (amtool), routing by severity (amtool routes
test), templates (amtool template render) and inhibition on a real Alertmanager."""
from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from fabricscope.demo import stack
from tests import procs

REPO = Path(__file__).resolve().parent.parent
AM_DIR = REPO / "alertmanager"
CONFIG = AM_DIR / "alertmanager.yml"
EXAMPLES = sorted((AM_DIR / "examples").glob("*.yml"))
ROUTE_CASES = AM_DIR / "tests" / "routes.txt"
INHIBITION_CASES = AM_DIR / "tests" / "inhibition.yaml"
GROUPING_CASES = AM_DIR / "tests" / "grouping.yaml"


def amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([procs.require_binary("amtool"), *args], capture_output=True, text=True, timeout=60)


def load_route_cases() -> list[tuple[str, list[str]]]:
    cases = []
    for line in ROUTE_CASES.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            receivers, *labels = shlex.split(line)
            cases.append((receivers, labels))
    return cases


def load_inhibition_cases() -> list[dict]:
    return yaml.safe_load(INHIBITION_CASES.read_text())["cases"]


# ----------------------------------------------------------------- validity

@pytest.mark.parametrize("path", [CONFIG, *EXAMPLES], ids=lambda p: p.relative_to(AM_DIR).as_posix())
def test_config_passes_amtool_check_config(path):
    result = amtool("check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # The template glob must find our templates, not silently match nothing.
    assert re.search(r"- [1-9]\d* templates", result.stdout), result.stdout


def test_examples_exist_with_secrets_read_from_files():
    assert EXAMPLES, "alertmanager/examples/ has no example configs"
    kinds = set()
    for path in EXAMPLES:
        config = yaml.safe_load(path.read_text())
        for receiver in config["receivers"]:
            for pagerduty in receiver.get("pagerduty_configs") or []:
                kinds.add("pagerduty")
                assert "routing_key_file" in pagerduty and "routing_key" not in pagerduty, path
            for slack in receiver.get("slack_configs") or []:
                kinds.add("slack")
                assert "api_url_file" in slack and "api_url" not in slack, path
    assert kinds == {"pagerduty", "slack"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_route_and_inhibit_exactly_like_the_main_config(path):
    main, example = yaml.safe_load(CONFIG.read_text()), yaml.safe_load(path.read_text())
    assert example["route"] == main["route"]
    assert example["inhibit_rules"] == main["inhibit_rules"]
    assert sorted(r["name"] for r in example["receivers"]) == sorted(r["name"] for r in main["receivers"])
    # Same template files, referenced from the example's own directory.
    resolved = {(path.parent / glob).resolve() for glob in example["templates"]}
    assert resolved == {(CONFIG.parent / glob).resolve() for glob in main["templates"]}


# ----------------------------------------------------------------- routing

@pytest.mark.parametrize("receivers,labels", load_route_cases(), ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_route(receivers, labels):
    result = amtool("config", "routes", "test", f"--config.file={CONFIG}",
                    f"--verify.receivers={receivers}", *labels)
    assert result.returncode == 0, f"expected {receivers}, amtool said: {result.stdout.strip()} {result.stderr.strip()}"


def test_route_cases_cover_each_severity():
    severities = {label.split("=", 1)[1] for receivers, labels in load_route_cases()
                  for label in labels if label.startswith("severity=")}
    assert {"critical", "warning", "info"} <= severities


def test_every_rule_alert_routes_by_its_severity():
    """Each alert the rules define reaches exactly the receiver its severity promises."""
    alerts = rule_alerts()
    expected = {"critical": "fabricscope-sidecar,pager", "warning": "fabricscope-sidecar,ticket",
                "info": "fabricscope-sidecar,null"}
    for name, labels in alerts:
        severity = labels.get("severity")
        assert severity in expected, f"{name}: severity {severity!r} is not critical|warning|info"
        result = amtool("config", "routes", "test", f"--config.file={CONFIG}",
                        f"--verify.receivers={expected[severity]}", f"alertname={name}",
                        *(f"{key}={value}" for key, value in labels.items()))
        assert result.returncode == 0, f"{name}: {result.stdout.strip()}"


def rule_alerts() -> list[tuple[str, dict[str, str]]]:
    """(alertname, static labels) of every alerting rule Prometheus loads (rules/*.yaml,
    committed and kept in sync with the mixin by test_rules); the warning and critical
    tiers of one alert are two entries with the same name."""
    alerts = []
    for path in stack.rule_files():
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups") or []:
            for rule in group.get("rules") or []:
                if "alert" in rule:
                    alerts.append((rule["alert"], {k: str(v) for k, v in (rule.get("labels") or {}).items()}))
    assert alerts, "rules/*.yaml define no alerting rules: run `make -C rules render`"
    return alerts


def test_inhibition_rules_name_alerts_the_rules_define():
    """An inhibition on a misspelt alert name silently does nothing; catch that here."""
    names = {name for name, _ in rule_alerts()}
    for rule in yaml.safe_load(CONFIG.read_text())["inhibit_rules"]:
        for side in ("source_matchers", "target_matchers"):
            for matcher in rule[side]:
                match = re.fullmatch(r'alertname(=~|=)"(.*)"', matcher)
                if not match:
                    continue
                pattern = match.group(2) if match.group(1) == "=~" else re.escape(match.group(2))
                assert any(re.fullmatch(pattern, name) for name in names), \
                    f"{side} {matcher} matches none of the rule alerts {sorted(names)}"


# ----------------------------------------------------------------- templates

def test_templates_render_where_and_what(tmp_path):
    now = "2026-11-26T01:00:00Z"
    labels = {"alertname": "FabricInfinibandPortDown", "severity": "critical", "cluster": "demo",
              "node": "gpu-node-1", "device": "mlx5_2", "port": "1"}
    alert = {"status": "firing", "labels": labels, "startsAt": now, "endsAt": "0001-01-01T00:00:00Z",
             "annotations": {"summary": "InfiniBand port mlx5_2:1 is down.",
                             "runbook_url": "https://runbooks.example/FabricInfinibandPortDown"},
             "generatorURL": "http://prometheus/graph", "fingerprint": "1"}
    data = {"receiver": "pager", "status": "firing", "alerts": [alert], "groupLabels": {},
            "commonLabels": labels, "commonAnnotations": alert["annotations"], "externalURL": "http://am"}
    data_file = tmp_path / "data.json"
    data_file.write_text(json.dumps(data))
    glob = str(AM_DIR / "templates" / "*.tmpl")

    def render(name: str) -> str:
        result = amtool("template", "render", f"--template.glob={glob}",
                        f'--template.text={{{{ template "{name}" . }}}}', f"--template.data={data_file}")
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert render("fabricscope.title").strip() == "[FIRING:1] FabricInfinibandPortDown demo/gpu-node-1 mlx5_2:1"
    text = render("fabricscope.text")
    assert "InfiniBand port mlx5_2:1 is down." in text
    assert "Runbook: https://runbooks.example/FabricInfinibandPortDown" in text
    assert "cluster=demo device=mlx5_2 node=gpu-node-1 port=1" in text
    assert render("fabricscope.pagerduty.description").strip() == \
        "FabricInfinibandPortDown demo/gpu-node-1 mlx5_2:1: InfiniBand port mlx5_2:1 is down."
    assert render("fabricscope.slack.color").strip() == "danger"

    # One incident, two alerts (a down port and its counter breach): no common alertname.
    breach = dict(alert, labels={**labels, "alertname": "FabricInfinibandFatalCounterBreach", "counter": "link_downed"},
                  fingerprint="2")
    common = {k: v for k, v in labels.items() if k != "alertname"}
    data_file.write_text(json.dumps(dict(data, alerts=[alert, breach], commonLabels=common)))
    assert render("fabricscope.title").strip() == \
        "[FIRING:2] FabricInfinibandPortDown and related demo/gpu-node-1 mlx5_2:1"


# ----------------------------------------------------------------- inhibition

def post_alerts(server: procs.Server, label_sets: list[dict[str, str]]) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    server.post("/api/v2/alerts", [
        {"labels": labels, "annotations": {"summary": "test"},
         "startsAt": now.isoformat(), "endsAt": (now + dt.timedelta(minutes=10)).isoformat()}
        for labels in label_sets])


@pytest.mark.parametrize("case", load_inhibition_cases(), ids=lambda c: c["name"])
def test_inhibition_on_real_alertmanager(case, tmp_path):
    # Sidecar webhook pointed at a closed local port: notifications fail quietly, the
    # inhibition state under test is independent of delivery.
    config = stack.alertmanager_config(f"http://127.0.0.1:{stack.free_port()}/alerts/webhook")
    with procs.alertmanager(config, tmp_path) as am:
        post_alerts(am, [case["source"]] + [target["labels"] for target in case["targets"]])

        def alerts_by_labels():
            alerts = am.get("/api/v2/alerts")
            if len(alerts) < 1 + len(case["targets"]):
                return None
            by_labels = {json.dumps(a["labels"], sort_keys=True): a for a in alerts}
            expected_inhibited = [t for t in case["targets"] if t["inhibited"]]
            # The inhibitor learns about source alerts asynchronously; wait until it has.
            if any(not by_labels[json.dumps(t["labels"], sort_keys=True)]["status"]["inhibitedBy"]
                   for t in expected_inhibited):
                return None
            return by_labels

        by_labels = procs.wait_for(alerts_by_labels, 30, f"inhibition of {case['name']!r} to take effect")
        source = by_labels[json.dumps(case["source"], sort_keys=True)]
        assert source["status"]["state"] == "active" and not source["status"]["inhibitedBy"]
        for target in case["targets"]:
            status = by_labels[json.dumps(target["labels"], sort_keys=True)]["status"]
            if target["inhibited"]:
                assert status["inhibitedBy"] == [source["fingerprint"]], target["labels"]
                assert status["state"] == "suppressed"
            else:
                assert status["inhibitedBy"] == [], target["labels"]
                assert status["state"] == "active"


# ----------------------------------------------------------------- grouping

def alert_count(groups: list) -> int:
    return sum(len(alerts) for _, alerts in groups)


def test_each_incident_is_one_group_per_receiver(tmp_path):
    """alertmanager/tests/grouping.yaml: alerts of several families posted at once form
    exactly the listed groups (one per incident) at each receiver, on a real Alertmanager.
    The sidecar copy gets the same groups as the human-facing receivers together."""
    cases = yaml.safe_load(GROUPING_CASES.read_text())
    config = stack.alertmanager_config(f"http://127.0.0.1:{stack.free_port()}/alerts/webhook")
    expected = {receiver: sorted((json.dumps(g["labels"], sort_keys=True), sorted(g["alerts"])) for g in groups)
                for receiver, groups in cases["groups"].items()}
    expected["fabricscope-sidecar"] = sorted(
        (labels, sorted(sum((alerts for lab, alerts in pairs if lab == labels), [])))
        for pairs in [[p for r in ("pager", "ticket") for p in expected[r]]]
        for labels in {lab for lab, _ in pairs})
    with procs.alertmanager(config, tmp_path) as am:
        post_alerts(am, cases["alerts"])

        def groups():
            found: dict[str, list] = {}
            for group in am.get("/api/v2/alerts/groups"):
                found.setdefault(group["receiver"]["name"], []).append(
                    (json.dumps(group["labels"], sort_keys=True), sorted(a["labels"]["alertname"] for a in group["alerts"])))
            found = {receiver: sorted(g) for receiver, g in found.items()}
            # Alertmanager fills each receiver's route on its own; wait until every
            # receiver holds as many alerts as it is expected to, so a route still being
            # filled is not mistaken for a wrong grouping.
            complete = all(alert_count(found.get(receiver, [])) == alert_count(want)
                           for receiver, want in expected.items())
            return found if complete else None

        found = procs.wait_for(groups, 30, "every receiver to hold every alert routed to it")
    assert found == expected
