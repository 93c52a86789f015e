"""The scale-out backend from Debian's `victoria-metrics` package: vmagent scrapes the
exporters and remote-writes to single-node VictoriaMetrics; vmalert evaluates the same
rendered mixin against it, writes recording-rule results and ALERTS back to it, and sends
alerts to the same Alertmanager. The sidecar and `fabricscope report` read
VictoriaMetrics' Prometheus-compatible query API (docs/scale.md).

    vm = start_victoria_metrics(data_dir, host, port, log_path)
    agent = start_vmagent(scrape_config, tmp_dir, host, port, vm_url, log_path)
    alerts = start_vmalert(vmalert_rules(rules, out_dir), vm_url, alertmanager_url, host, port, log_path,
                           evaluation_interval="5s", labels={"cluster": "demo"})
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from fabricscope.atomicfile import write_atomically

from .binaries import find_binary
from .errors import StackError
from .processes import ManagedProcess

# Rule fields the packaged vmalert (1.79) refuses, each with why dropping it is safe enough
# for this backend; docs/scale.md says what changes.
VMALERT_UNSUPPORTED_RULE_FIELDS = {
    # Prometheus 2.42+: hold a resolved alert firing a while (flapping sources). vmalert
    # 1.79 has no equivalent; the alert resolves as soon as its expression does.
    "keep_firing_for",
}


def vmalert_rules(rule_files: list[Path], out_dir: Path) -> tuple[list[Path], list[str]]:
    """Copies of the rendered rule files that vmalert accepts, and what was dropped
    ("group/rule: field")."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written, dropped = [], []
    for path in rule_files:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise StackError(f"cannot read rule file {path}: {exc}") from None
        for group in data.get("groups") or []:
            for rule in group.get("rules") or []:
                for name in VMALERT_UNSUPPORTED_RULE_FIELDS & set(rule):
                    del rule[name]
                    dropped.append(f"{group.get('name')}/{rule.get('alert') or rule.get('record')}: {name}")
        target = out_dir / Path(path).name
        write_atomically(target, yaml.safe_dump(data, sort_keys=False))
        written.append(target)
    return written, dropped


def vmagent_scrape_config(prometheus_config: dict[str, Any]) -> dict[str, Any]:
    """The scrape part of a Prometheus config (what vmagent reads; rules and alerting are
    vmalert's). file_sd's refresh_interval is dropped: vmagent refuses it and re-reads the
    files every -promscrape.fileSDCheckInterval."""
    jobs = copy.deepcopy(prometheus_config["scrape_configs"])
    for job in jobs:
        for file_sd in job.get("file_sd_configs") or []:
            file_sd.pop("refresh_interval", None)
    return {"global": {key: value for key, value in prometheus_config["global"].items()
                       if key in ("scrape_interval", "scrape_timeout")},
            "scrape_configs": jobs}


def own_metrics_jobs(host: str, servers: list[tuple[str, list[int]]]) -> list[dict[str, Any]]:
    """Scrape jobs for the backend's own metrics (ingestion, rule evaluation), one job per
    kind of server: [(job, [port, ...]), ...]."""
    return [{"job_name": job, "static_configs": [{"targets": [f"{host}:{port}" for port in ports]}]}
            for job, ports in servers]


def start_victoria_metrics(data_dir: Path, host: str, port: int, log_path: Path, retention: str = "2d",
                           extra_args: list[str] | None = None, timeout: float = 60.0) -> ManagedProcess:
    argv = [find_binary("victoria-metrics"), f"-storageDataPath={data_dir}", f"-httpListenAddr={host}:{port}",
            f"-retentionPeriod={retention}", "-loggerLevel=WARN",
            # Samples are queryable after 30 s by default (so a query never sees half a
            # scrape round); vmagent sends whole scrapes, and alerts must not lag 30 s more
            # than on Prometheus.
            "-search.latencyOffset=1s", *(extra_args or [])]
    return ManagedProcess("victoria-metrics", argv, f"http://{host}:{port}/health", log_path).start(timeout)


def start_vmagent(scrape_config: Path, tmp_dir: Path, host: str, port: int, remote_write_url: str,
                  log_path: Path, extra_args: list[str] | None = None, timeout: float = 60.0) -> ManagedProcess:
    argv = [find_binary("vmagent"), f"-promscrape.config={scrape_config}", f"-remoteWrite.url={remote_write_url}",
            f"-remoteWrite.tmpDataPath={tmp_dir}", f"-httpListenAddr={host}:{port}", "-loggerLevel=WARN",
            # file_sd is re-read this often (Prometheus' refresh_interval is not read).
            "-promscrape.fileSDCheckInterval=5s", *(extra_args or [])]
    return ManagedProcess("vmagent", argv, f"http://{host}:{port}/health", log_path).start(timeout)


def start_vmalert(rule_files: list[Path], datasource_url: str, notifier_url: str, host: str, port: int,
                  log_path: Path, evaluation_interval: str = "1m", labels: dict[str, str] | None = None,
                  extra_args: list[str] | None = None, timeout: float = 60.0) -> ManagedProcess:
    """vmalert reading and writing `datasource_url`: recording rules and ALERTS are written
    back (remote write), and alert state is restored from it after a restart."""
    argv = [find_binary("vmalert"), *(f"-rule={path}" for path in rule_files),
            f"-datasource.url={datasource_url}", f"-remoteWrite.url={datasource_url}",
            f"-remoteRead.url={datasource_url}", f"-notifier.url={notifier_url}",
            f"-evaluationInterval={evaluation_interval}", f"-httpListenAddr={host}:{port}",
            f"-external.url=http://{host}:{port}", "-loggerLevel=WARN",
            # vmalert adds alertgroup=<group> to every alert; Prometheus sends none, and
            # Alertmanager's grouping and inhibition should see the same labels.
            "-disableAlertgroupLabel",
            # The same labels Prometheus' external_labels put on every alert (routing groups
            # by cluster).
            *(f"-external.label={name}={value}" for name, value in (labels or {}).items()),
            *(extra_args or [])]
    return ManagedProcess("vmalert", argv, f"http://{host}:{port}/health", log_path).start(timeout)

