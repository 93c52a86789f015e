"""The committed dashboard JSON: generated from the Python source (in sync), and
structurally sound as Grafana will load it (ids, layout, datasources, variables, units,
links). The PromQL of every panel is run against a real Prometheus in
test_dashboards_e2e.py."""
from __future__ import annotations

import re

import pytest

from fabricscope.dashboards import build, model

DASHBOARDS = model.load_all()
UIDS = {board["uid"]: name for name, board in DASHBOARDS.items()}
# Grafana's own macros, usable in links and queries without a definition.
GRAFANA_MACROS = {"__rate_interval", "__interval", "__range", "__range_s", "__from", "__to", "__url_time_range",
                  "__data", "__field", "__value", "__all"}
GRID = 24


def all_panels(board: dict) -> list[dict]:
    return list(model.panels(board)) + [p for p in board["panels"] if p["type"] == "row"]


def test_committed_json_is_generated_from_the_source():
    assert build.stale_files() == [], "run `make dashboards` and commit dashboards/json/"


def test_the_check_command_fails_on_a_hand_edited_file(tmp_path):
    build.write_all(tmp_path)
    assert build.main(["--check", "--out", str(tmp_path)]) == 0
    edited = tmp_path / "fleet.json"
    edited.write_text(edited.read_text().replace("Fleet overview", "Fleet overveiw"))
    (tmp_path / "stray.json").write_text("{}")
    assert build.stale_files(tmp_path) == ["fleet.json", "stray.json"]
    assert build.main(["--check", "--out", str(tmp_path)]) == 1


def test_every_dashboard_of_the_issue_exists():
    titles = {board["title"] for board in DASHBOARDS.values()}
    for wanted in ("Fleet overview", "Node network", "InfiniBand fabric", "NVLink & NCCL",
                   "Token-path tracing & SLOs", "Chaos & blast radius"):
        assert any(wanted in title for title in titles), (wanted, titles)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_uid_is_stable_and_derived_from_the_file_name(name):
    assert DASHBOARDS[name]["uid"] == "fabricscope-" + name.replace("_", "-")


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panel_ids_are_unique(name):
    ids = [panel["id"] for panel in all_panels(DASHBOARDS[name])]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_fit_the_grid_and_never_overlap(name):
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels(DASHBOARDS[name]):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["y"] >= 0 and pos["w"] > 0 and pos["h"] > 0, panel["title"]
        assert pos["x"] + pos["w"] <= GRID, f"{panel['title']!r} runs past column {GRID}"
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r} at {(x, y)}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_target_names_a_datasource_the_dashboard_defines(name):
    board = DASHBOARDS[name]
    for panel in model.panels(board):
        if panel["type"] == "text":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            kind = model.datasource_type(board, target.get("datasource"))
            assert kind in ("prometheus", "yesoreyeram-infinity-datasource"), (panel["title"], target)
            assert target["refId"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_referenced_variable_is_defined(name):
    board = DASHBOARDS[name]
    defined = {variable["name"] for variable in board["templating"]["list"]} | GRAFANA_MACROS
    text_fields = []
    for panel in model.panels(board):
        text_fields += [target.get("expr", "") for target in panel["targets"]]
        text_fields += [str(target.get("url", "")) + str(target.get("url_options", "")) for target in panel["targets"]]
        text_fields += [link["url"] for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", [])]
        text_fields.append(panel["title"])
    text_fields += [a["expr"] for a in board["annotations"]["list"]]
    text_fields += [v["query"] for v in board["templating"]["list"] if isinstance(v["query"], str)]
    used = set().union(*(model.referenced_variables(text) for text in text_fields))
    assert used - defined == set()


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_variables_chain_on_the_ones_before_them(name):
    """Each label_values variable is filtered only by variables defined before it, and the
    dashboard starts with a datasource variable (no hard-coded Prometheus)."""
    variables = DASHBOARDS[name]["templating"]["list"]
    assert variables[0]["type"] == "datasource"
    assert any(v["name"] == "datasource" for v in variables) or name == "chaos"
    seen = set()
    first_query = next((v["name"] for v in variables if v["type"] == "query"), None)
    for variable in variables:
        if variable["type"] == "query":
            match = model.LABEL_VALUES.match(variable["query"])
            assert match, variable["query"]
            used = model.referenced_variables(variable["query"])
            assert used <= seen, f"{variable['name']} uses {used - seen} defined after it"
            assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            if variable["name"] != first_query:
                assert used, f"{variable['name']} is not chained on the variables before it"
        seen.add(variable["name"])


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_has_a_unit(name):
    for panel in model.panels(DASHBOARDS[name]):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert unit, f"panel {panel['title']!r} has no unit"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_rates_use_the_rate_interval_and_no_host_is_hard_coded(name):
    for query in model.prometheus_queries(name, DASHBOARDS[name]):
        for window in re.findall(r"\brate\([^\[]*\[([^\]]+)\]", query.expr):
            assert window == "$__rate_interval", f"{query.where}: rate over [{window}]"
        assert not re.search(r'node=~?"gpu-|instance=~?"', query.expr), f"{query.where} hard-codes a host"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_alerts_are_annotated(name):
    if name == "chaos":
        pytest.skip("the chaos dashboard reads only the sidecar (no Prometheus to annotate from)")
    exprs = [a["expr"] for a in DASHBOARDS[name]["annotations"]["list"]]
    assert any('ALERTS{alertstate="firing", severity="critical"' in e for e in exprs)
    assert any('severity="warning"' in e for e in exprs)


def test_links_lead_from_fleet_to_node_to_device_and_name_real_variables():
    """Every data link points at a dashboard that exists and sets only variables it has;
    the fleet links to node and device views, the node view to device views."""
    targets: dict[str, set[str]] = {}
    for name, board in DASHBOARDS.items():
        for panel in model.panels(board):
            for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", []):
                uid = re.match(r"/d/([^?]+)\?", link["url"])[1]
                assert uid in UIDS, f"{name}: link to unknown dashboard {uid}"
                target_vars = {v["name"] for v in DASHBOARDS[UIDS[uid]]["templating"]["list"]}
                for var in re.findall(r"var-([a-z_]+)=", link["url"]):
                    assert var in target_vars, f"{name} {panel['title']!r}: {UIDS[uid]} has no variable {var}"
                targets.setdefault(name, set()).add(UIDS[uid])
    assert {"node_network", "infiniband", "nvlink_nccl"} <= targets["fleet"]
    assert {"infiniband", "nvlink_nccl"} <= targets["node_network"]


def test_docs_show_every_sidecar_panel_request():
    """docs/dashboards.md lists each Infinity query (method, URL, body) as the JSON has it."""
    docs = (model.JSON_DIR.parent.parent / "docs" / "dashboards.md").read_text()
    for name, board in DASHBOARDS.items():
        for panel, target in model.infinity_targets(name, board):
            options = target["url_options"]
            params = "&".join(f"{p['key']}={p['value']}" for p in options["params"])
            assert f"`{options['method']} {target['url']}{'?' + params if params else ''}`" in docs, panel["title"]
            if options.get("data"):
                assert f"`{options['data']}`" in docs, panel["title"]
            assert all(f"`{column['selector']}`" in docs for column in target["columns"]), panel["title"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_alert_annotations_keep_alerts_that_lack_the_scoped_labels(name):
    """A variable-scoped annotation matches the empty value too: FabricNcclHang has no
    `node` label, and the node-scoped NCCL view must still mark it."""
    for item in DASHBOARDS[name]["annotations"]["list"]:
        for label, value in re.findall(r'(\w+)=~"(\$\w+[^"]*)"', item["expr"]):
            assert value == f"${label}|", f"{name}: annotation matcher {label}=~{value!r} drops alerts without {label}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_table_value_column_has_its_own_unit(name):
    """A table joining several queries shows different quantities (a MAD score, seconds,
    a share of step time): each value column past the first carries its unit."""
    for panel in model.panels(DASHBOARDS[name]):
        if panel.get("type") != "table" or len(panel.get("targets", [])) < 2:
            continue
        options = panel["transformations"][-1]["options"]
        hidden = {k for k, on in options.get("excludeByName", {}).items() if on}
        overridden = {o["matcher"]["options"] for o in panel["fieldConfig"].get("overrides", [])
                      if any(p["id"] == "unit" for p in o["properties"])}
        for target in panel["targets"][1:]:
            column = options.get("renameByName", {}).get(f"Value #{target['refId']}", f"Value #{target['refId']}")
            if f"Value #{target['refId']}" not in hidden and "state" not in column:
                assert column in overridden, f"{name} {panel['title']!r}: column {column!r} has no unit"
