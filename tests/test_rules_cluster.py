"""Rules for one cluster (`fabricscope rules --cluster`): every selector scoped, the promtool
cases still passing for their own cluster and finding nothing for another, and the
PrometheusRule objects valid against prometheus-operator's CRD schema."""
from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from fabricscope.cli import main as fabricscope_main
from fabricscope.demo import stack
from fabricscope.rules import rule_files
from fabricscope.rules.cluster import ScopeError, scope_expr

REPO = Path(__file__).resolve().parent.parent
CRD_SCHEMA = REPO / "tests" / "fixtures" / "prometheusrule-crd-openapiv3.yaml"
PROMTOOL_CASES = sorted((REPO / "rules" / "tests").glob("*.yaml"))


@pytest.mark.parametrize("expr, scoped", [
    ('sum by (cluster, node) (rate(x_total[1m]))', 'sum by (cluster, node) (rate(x_total{cluster="b"}[1m]))'),
    ('ALERTS{alertname="X"}', 'ALERTS{cluster="b",alertname="X"}'),
    ('max without (state) (p{state=~"A|B"}) and on (cluster, node) up offset 5m',
     'max without (state) (p{cluster="b",state=~"A|B"}) and on (cluster, node) up{cluster="b"} offset 5m'),
    ('time() - a:b:c > 1e9', 'time() - a:b:c{cluster="b"} > 1e9'),
    ('label_replace(x, "a", "$1", "b", "(.+)")', 'label_replace(x{cluster="b"}, "a", "$1", "b", "(.+)")'),
    ('min_over_time((a - timestamp(a))[5m:])', 'min_over_time((a{cluster="b"} - timestamp(a{cluster="b"}))[5m:])'),
    ('x * on (c) group_left (device, port) y', 'x{cluster="b"} * on (c) group_left (device, port) y{cluster="b"}'),
    ('sum(x) by (node) > bool 2', 'sum(x{cluster="b"}) by (node) > bool 2'),
    ('x{a="}{"}', 'x{cluster="b",a="}{"}'),
    # The evaluator's own metrics have no cluster: left as they are.
    ('increase(prometheus_rule_group_iterations_missed_total[10m]) > 0 and up',
     'increase(prometheus_rule_group_iterations_missed_total[10m]) > 0 and up{cluster="b"}'),
])
def test_every_selector_gains_the_cluster_matcher(expr, scoped):
    assert scope_expr(expr, "cluster", "b") == scoped


def test_unreadable_input_is_refused():
    with pytest.raises(ScopeError, match="unterminated string"):
        scope_expr('x{a="b}', "cluster", "b")
    with pytest.raises(ScopeError, match="not a label name"):
        scope_expr("x", "clus-ter", "b")


def promtool_cases(tmp_path: Path, cluster: str) -> subprocess.CompletedProcess:
    """rules/tests/*.yaml (their series are all cluster="test") run against the committed
    rules scoped to `cluster`."""
    scoped = tmp_path / cluster
    assert fabricscope_main(["rules", "--cluster", cluster, "--out", str(scoped)]) == 0
    cases = []
    for case in PROMTOOL_CASES:
        data = yaml.safe_load(case.read_text())
        data["rule_files"] = [str(scoped / f"{Path(name).stem}-{cluster}.yaml") for name in data["rule_files"]]
        cases.append(stack.write_yaml(scoped / f"case-{case.name}", data))
    subprocess.run([stack.find_binary("promtool"), "check", "rules", *map(str, scoped.glob("fabricscope-*.yaml"))],
                   check=True, capture_output=True)
    return subprocess.run([stack.find_binary("promtool"), "test", "rules", *map(str, cases)],
                          capture_output=True, text=True)


def test_scoped_rules_pass_their_clusters_cases_and_see_no_other_cluster(tmp_path):
    own = promtool_cases(tmp_path, "test")
    assert own.returncode == 0, own.stdout[-3000:] + own.stderr[-3000:]
    other = promtool_cases(tmp_path, "other")
    assert other.returncode != 0
    # Every case that expects an alert of cluster "test" fails when the rules look at another.
    expecting = sum(1 for case in PROMTOOL_CASES for test in yaml.safe_load(case.read_text())["tests"]
                    for alert in test.get("alert_rule_test") or []
                    if any(exp.get("exp_labels", {}).get("cluster") == "test" for exp in alert.get("exp_alerts") or []))
    assert other.stderr.count("    alertname: ") >= expecting, other.stderr[-3000:]


def strict(schema):
    """The CRD schema with unknown fields refused: the API server prunes them silently,
    so a field the renderer misspells would vanish from the applied object."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            # Go's RE2 takes a flag group after `^`; Python's re wants it first.
            if str(node.get("pattern", "")).startswith("^(?i)"):
                node["pattern"] = "(?i)^" + node["pattern"][5:]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(schema)
    return schema


def test_prometheusrule_objects_validate_against_the_crd_schema(tmp_path):
    schema = strict(yaml.safe_load(CRD_SCHEMA.read_text()))
    assert fabricscope_main(["rules", "--cluster", "pod-b", "--format", "prometheusrule", "--out", str(tmp_path)]) == 0
    objects = [yaml.safe_load(path.read_text()) for path in sorted(tmp_path.glob("*.yaml"))]
    assert len(objects) == len(rule_files())
    for obj in objects:
        jsonschema.validate(obj, schema)
        assert obj["metadata"]["labels"]["fabricscope.io/cluster"] == "pod-b"
        assert all('cluster="pod-b"' in rule["expr"] for group in obj["spec"]["groups"] for rule in group["rules"]
                   if "prometheus_" not in rule["expr"])
    # The schema does refuse what the operator would not keep.
    broken = copy.deepcopy(objects[0])
    broken["spec"]["groups"][0]["rules"][0]["exprr"] = "up"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)
