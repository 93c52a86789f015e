"""deploy/: the files an operator copies must agree with the code they start. Every
exporter and sidecar command line parses with the real argument parsers, the Grafana
provisioning names the datasources the dashboards default to, the compose file mounts
files that exist, its Prometheus config passes promtool, and the generated Alertmanager
config passes amtool. (No container engine or Kubernetes here: what can be checked
without them is.)"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from fabricscope import deploy_secrets
from fabricscope.dashboards import model
from fabricscope.exporter import main as exporter_main
from fabricscope.exporter.framework import COLLECTORS
from fabricscope.queryapi import server as sidecar_main
from tests import procs
from tests.conftest import missing_tool

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
COMPOSE_PORT_DEFAULTS = {"FABRICSCOPE_PROMETHEUS_PORT": "19090", "FABRICSCOPE_ALERTMANAGER_PORT": "19093",
                         "FABRICSCOPE_EXPORTER_PORT": "19400", "FABRICSCOPE_SIDECAR_PORT": "19500"}


def compose_file(name: str, env: dict[str, str] | None = None) -> dict:
    """A compose file as the engine reads it: parsed as YAML first (a { in an unquoted flow
    item is a syntax error there), then ${NAME:-default} in every string from `env` or the
    default."""
    def interpolate(node):
        if isinstance(node, dict):
            return {key: interpolate(value) for key, value in node.items()}
        if isinstance(node, list):
            return [interpolate(item) for item in node]
        if isinstance(node, str):
            return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: (env or {}).get(m[1], m[2]), node)
        return node
    return interpolate(yaml.safe_load((DEPLOY / "compose" / name).read_text()))


COMPOSE = compose_file("compose.yaml")
GRAFANA_OVERLAY = compose_file("grafana.yaml")
EXPORTER_PORT = 19400


def parse(add_arguments, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:   # argparse reports unknown flags by exiting
        raise AssertionError(f"rejected: {argv}") from exc


def test_grafana_datasources_are_the_ones_the_dashboards_default_to():
    provisioned = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/fabricscope.yaml").read_text())
    by_type = {d["type"]: d for d in provisioned["datasources"]}
    for name, board in model.load_all().items():
        for variable in board["templating"]["list"]:
            if variable["type"] == "datasource":
                assert variable["query"] in by_type, f"{name}: no {variable['query']} datasource provisioned"
                assert by_type[variable["query"]]["name"] == variable["current"]["value"], (name, variable["name"])
    infinity = by_type["yesoreyeram-infinity-datasource"]
    assert infinity["jsonData"]["auth_method"] == "bearerToken"
    assert infinity["jsonData"]["allowedHosts"] == [infinity["url"]]


def test_dashboards_are_provisioned_from_where_compose_mounts_them():
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/fabricscope.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    mounts = dict(v.rsplit(":", 2)[:2] if v.count(":") == 2 else v.split(":")
                  for v in GRAFANA_OVERLAY["services"]["grafana"]["volumes"])
    assert (DEPLOY / "compose" / {target: host for host, target in mounts.items()}[path]).resolve() == \
        REPO / "dashboards" / "json"
    assert GRAFANA_OVERLAY["services"]["grafana"]["environment"]["GF_INSTALL_PLUGINS"] == \
        "yesoreyeram-infinity-datasource"


def test_compose_runs_the_whole_stack_from_files_that_exist():
    assert set(COMPOSE["services"]) == {"exporter", "prometheus", "alertmanager", "sidecar-init", "sidecar"}
    assert set(GRAFANA_OVERLAY["services"]) == {"grafana"}
    for name, service in [*COMPOSE["services"].items(), *GRAFANA_OVERLAY["services"].items()]:
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith("."):
                assert (DEPLOY / "compose" / host).exists(), f"{name} mounts missing {host}"
        build = service.get("build")
        if build:
            assert (DEPLOY / "compose" / build["context"] / build["dockerfile"]).is_file(), name
    exporter = COMPOSE["services"]["exporter"]["command"]
    assert exporter[0] == "exporter"
    args = parse(exporter_main.add_arguments, exporter[1:])
    assert args.listen.endswith(f":{EXPORTER_PORT}")
    sidecar = COMPOSE["services"]["sidecar"]["command"]
    assert sidecar[0] == "sidecar"
    parse(sidecar_main.add_arguments, sidecar[1:])


def test_compose_prometheus_config_passes_promtool(tmp_path):
    promtool = procs.require_binary("promtool")
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    (tmp_path / "ca.pem").write_text("")
    for job in config["scrape_configs"]:
        if "tls_config" in job:
            job["tls_config"]["ca_file"] = str(tmp_path / "ca.pem")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copytree(REPO / "rules", tmp_path / "rules", ignore=shutil.ignore_patterns("mixin", "tests"))
    check = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert {j["job_name"] for j in config["scrape_configs"]} >= {"fabricscope", "fabricscope-sidecar"}


def test_systemd_unit_starts_the_exporter_with_flags_it_accepts():
    unit = (DEPLOY / "systemd" / "fabricscope-exporter.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = exec_start.removeprefix("ExecStart=").split()
    assert argv[0].endswith("/fabricscope") and argv[1] == "exporter"
    args = parse(exporter_main.add_arguments, argv[2:])
    assert args.listen.endswith(f":{EXPORTER_PORT}")
    assert "StateDirectory=fabricscope-exporter" in unit and args.state_dir == "/var/lib/fabricscope-exporter"


def test_kubernetes_daemonset_service_and_servicemonitor_agree():
    docs = {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "exporter.yaml").read_text())}
    assert set(docs) == {"Namespace", "DaemonSet", "Service", "ServiceMonitor"}
    pod = docs["DaemonSet"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["args"][0] == "exporter"
    args = parse(exporter_main.add_arguments, container["args"][1:])
    assert args.listen.endswith(f":{EXPORTER_PORT}")
    assert container["ports"][0]["containerPort"] == EXPORTER_PORT
    labels = pod["metadata"]["labels"]
    assert docs["DaemonSet"]["spec"]["selector"]["matchLabels"] == labels
    service = docs["Service"]
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    monitor = docs["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    endpoint = monitor["endpoints"][0]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["honorLabels"] is True
    relabeled = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert relabeled["job"]["replacement"] == "fabricscope"      # the rules' exporter selector
    assert {"node", "cluster"} <= set(relabeled)


def test_compose_secrets_are_written_once_and_alertmanager_config_passes_amtool(tmp_path):

    from fabricscope.queryapi.keys import hash_key, parse_key_file

    paths = deploy_secrets.write_secrets(tmp_path, "https://sidecar:19500")
    token = paths["token"].read_text()
    keys = parse_key_file(paths["keys"])
    entry = next(k for k in keys.values() if k.id == "grafana")
    assert entry.sha256 == hash_key(token) and set(entry.scopes) == {"read", "write"}
    assert deploy_secrets.write_secrets(tmp_path, "https://sidecar:19500")["token"].read_text() == token
    amtool = procs.require_binary("amtool")
    check = subprocess.run([amtool, "check-config", str(paths["alertmanager"])], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load(paths["alertmanager"].read_text())
    webhooks = [w for r in config["receivers"] for w in r.get("webhook_configs") or []]
    assert webhooks and all(w["url"] == "https://sidecar:19500/alerts/webhook" for w in webhooks)


def test_compose_exporter_has_the_daemonsets_privileges_and_mounts():
    """The image test runs the exporter with the DaemonSet's privileges and mounts; compose
    grants the same (its state volume aside)."""
    docs = {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "exporter.yaml").read_text())}
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    daemonset = {(host_paths[m["name"]], m["mountPath"], bool(m.get("readOnly")),
                  m.get("mountPropagation") == "HostToContainer") for m in container["volumeMounts"]}
    exporter = COMPOSE["services"]["exporter"]
    compose = set()
    for volume in exporter["volumes"]:
        host, target, *options = volume.split(":")
        options = options[0].split(",") if options else []
        compose.add((host if host.startswith("/") else "/var/lib/fabricscope-exporter", target, "ro" in options,
                     "rslave" in options))
    assert compose == daemonset
    assert container["securityContext"]["privileged"] is True and exporter["privileged"] is True
    assert pod["hostPID"] is True and exporter["pid"] == "host"
    assert pod["hostNetwork"] is True and exporter["network_mode"] == "host"
    # The same paths on the command line.
    compose_args = parse(exporter_main.add_arguments, exporter["command"][1:])
    daemonset_args = parse(exporter_main.add_arguments, container["args"][1:])
    for path in ("sysfs", "procfs", "rootfs", "kmsg", "state_dir"):
        assert getattr(compose_args, path) == getattr(daemonset_args, path), path


def test_compose_ports_are_variables_that_every_service_agrees_on():
    """Each port is one variable with the documented default; set to other values, every
    service that listens on or reaches that port follows it."""
    text = (DEPLOY / "compose" / "compose.yaml").read_text()
    assert dict(re.findall(r"\$\{(FABRICSCOPE_\w+_PORT):-(\d+)\}", text)) == COMPOSE_PORT_DEFAULTS
    assert not re.search(r"(?<![{-])\b19(090|093|400|500)\b", re.sub(r"(?m)^\s*#.*$", "", text))
    ports = {name: str(20000 + i) for i, name in enumerate(COMPOSE_PORT_DEFAULTS)}
    services = compose_file("compose.yaml", ports)["services"]
    command = {name: " ".join(s.get("command") or s.get("entrypoint")) for name, s in services.items()}
    assert f"--web.listen-address=:{ports['FABRICSCOPE_PROMETHEUS_PORT']}" in command["prometheus"]
    assert f"--web.listen-address=:{ports['FABRICSCOPE_ALERTMANAGER_PORT']}" in command["alertmanager"]
    assert f"--web.listen-address=:{ports['FABRICSCOPE_EXPORTER_PORT']}" in command["exporter"]
    assert f"--port={ports['FABRICSCOPE_SIDECAR_PORT']}" in command["sidecar"]
    assert f"--prometheus-url=http://127.0.0.1:{ports['FABRICSCOPE_PROMETHEUS_PORT']}" in command["sidecar"]
    assert f"--alertmanager-url=http://127.0.0.1:{ports['FABRICSCOPE_ALERTMANAGER_PORT']}" in command["sidecar"]
    # Prometheus's targets come from the files sidecar-init writes from the same variables.
    init = command["sidecar-init"]
    assert f"--exporter-address=127.0.0.1:{ports['FABRICSCOPE_EXPORTER_PORT']}" in init
    assert f"--alertmanager-address=127.0.0.1:{ports['FABRICSCOPE_ALERTMANAGER_PORT']}" in init
    assert f"--sidecar-url=https://127.0.0.1:{ports['FABRICSCOPE_SIDECAR_PORT']}" in init
    grafana = compose_file("grafana.yaml", ports)["services"]["grafana"]["environment"]
    assert grafana["FABRICSCOPE_PROMETHEUS_URL"].endswith(f":{ports['FABRICSCOPE_PROMETHEUS_PORT']}")
    assert grafana["FABRICSCOPE_SIDECAR_URL"].endswith(f":{ports['FABRICSCOPE_SIDECAR_PORT']}")


def test_podman_compose_reads_the_port_variables():
    """The engine's own reading of the file (podman-compose config: YAML, then variables):
    a port set in the environment reaches every service that uses it."""
    podman_compose = Path(sys.executable).parent / "podman-compose"
    if not podman_compose.exists():
        missing_tool("podman-compose", "podman-compose (pip, the test extra)")
    ports = {name: str(21000 + i) for i, name in enumerate(COMPOSE_PORT_DEFAULTS)}
    done = subprocess.run([str(podman_compose), "-f", str(DEPLOY / "compose" / "compose.yaml"), "config"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **ports})
    assert done.returncode == 0, done.stderr[-3000:]
    services = yaml.safe_load(done.stdout)["services"]
    expected = compose_file("compose.yaml", ports)["services"]
    for name, service in expected.items():
        for key in ("command", "entrypoint"):
            assert services[name].get(key) == service.get(key), (name, key)
    assert f"--port={ports['FABRICSCOPE_SIDECAR_PORT']}" in services["sidecar"]["command"]


def test_compose_prometheus_targets_are_the_files_sidecar_init_writes(tmp_path):
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    mounted = "/etc/prometheus/fabricscope/"
    written = deploy_secrets.write_targets(tmp_path, exporter="127.0.0.1:1", sidecar="127.0.0.1:2",
                                           alertmanager="127.0.0.1:3")
    files = [f for job in config["scrape_configs"] for sd in job["file_sd_configs"] for f in sd["files"]]
    files += [f for am in config["alerting"]["alertmanagers"] for sd in am["file_sd_configs"] for f in sd["files"]]
    assert sorted(files) == sorted(mounted + str(p.relative_to(tmp_path)) for p in written.glob("*.json"))


def test_compose_sidecar_reconciles_with_the_compose_alertmanager():
    """Without --alertmanager-url an alert that resolved while inhibited (no resolution is
    sent) stays firing in the sidecar's records."""
    def flag(command: list[str], name: str) -> str:
        return next(arg.split("=", 1)[1] for arg in command if arg.startswith(name + "="))

    am_port = flag(COMPOSE["services"]["alertmanager"]["command"], "--web.listen-address").rsplit(":", 1)[1]
    assert flag(COMPOSE["services"]["sidecar"]["command"], "--alertmanager-url") == f"http://127.0.0.1:{am_port}"


def _daemonset_container() -> dict:
    daemonset = next(d for d in yaml.safe_load_all((DEPLOY / "kubernetes/exporter.yaml").read_text())
                     if d["kind"] == "DaemonSet")
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    return container


def _unit_settings() -> dict[str, str]:
    lines = (DEPLOY / "systemd/fabricscope-exporter.service").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def test_systemd_unit_has_the_daemonsets_memory_and_cpu_limits():
    limits = _daemonset_container()["resources"]["limits"]
    unit = _unit_settings()
    mebibytes = {"Mi": 1, "Gi": 1024}
    memory = limits["memory"]
    assert unit["MemoryMax"] == f"{int(memory[:-2]) * mebibytes[memory[-2:]]}M"
    millicores = int(limits["cpu"].removesuffix("m")) if limits["cpu"].endswith("m") else int(limits["cpu"]) * 1000
    assert unit["CPUQuota"] == f"{millicores // 10}%"


def test_exporter_help_lists_every_collector_switch():
    """--no-collector.NAME is how a collector is turned off: --help must say so."""
    parser = argparse.ArgumentParser()
    exporter_main.add_arguments(parser)
    usage = parser.format_help()
    for name in COLLECTORS:
        assert f"--collector.{name}" in usage and f"--no-collector.{name}" in usage, name


def test_daemonset_pulls_what_the_docs_push_from_what_the_build_tags():
    import importlib.util
    spec = importlib.util.spec_from_file_location("image_build", DEPLOY / "image" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    built = build.fabricscope_image()
    pulled = _daemonset_container()["image"]
    section = (REPO / "docs" / "deploy.md").read_text().split("## Kubernetes", 1)[1]
    lines = section.split("```sh", 1)[1].split("```", 1)[0].split()
    assert lines[:4] == ["podman", "tag", built, pulled], lines
    assert lines[4:7] == ["podman", "push", pulled], lines
    assert pulled.rsplit("/", 1)[1] == built.rsplit("/", 1)[1]
