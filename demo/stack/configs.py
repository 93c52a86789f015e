"""What the stack hands Prometheus and Alertmanager: rendered rules and config files."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fabricscope.alertmanager import ALERTMANAGER_CONFIG
from fabricscope.atomicfile import write_atomically
from fabricscope.rules import rule_files  # noqa: F401  (part of this module's interface)
from fabricscope.rules.render import RenderError, render

from .errors import StackError

SCRAPE_JOB = "fabricscope"


# Fast alerts, the default of `fabricscope stack` (`--production-alerts` turns them off):
# production `for:` durations (up to 15 minutes) outlast most demo faults, so a newcomer
# would see few alerts. These keep every threshold and range window (and so every
# alert's resolve bound, docs/alertmanager.md) and only shorten how long a condition
# must hold and how often each rule group runs. The NCCL groups run at the scrape interval:
# a late node's first late join is judged in the evaluation after the scrapes that show it
# (docs/nccl.md, "Across nodes, measured"); their rules read per-rank and recorded per-node
# series only.
FAST_ALERT_OVERRIDES: dict[str, Any] = {
    "intervals": {**{group: "15s" for group in ("tcp", "infiniband", "nvlink", "kernel", "pipeline")}, "nccl": "5s"},
    "for": {"ncclHang": "30s", "ncclRankStalled": "30s", "straggler": "1m", "ibPortDown": "30s",
            "ibDeviceMissing": "30s", "ibPortFatal": "30s", "ibFatalCounter": "30s", "ibDegraded": "1m",
            "ibAnomaly": "2m", "ibCounterSaturated": "1m", "nvlinkDown": "30s",
            "exporterDown": "1m", "collectorFailing": "1m", "ebpfUnavailable": "1m"},
}

def render_rules(overrides: dict[str, Any], out_dir: Path, exporter_config: dict[str, Any] | None = None) -> list[Path]:
    """The mixin rendered with `overrides` (fabricscope.rules.render), into `out_dir`;
    `exporter_config`: the demo exporters' config where it shortens a window the rules
    read (ebpf.window_seconds), so the rules follow it."""
    try:
        return render(overrides, out_dir, exporter_config)
    except RenderError as exc:
        raise StackError(f"rendering rules with overrides: {exc}") from None


SIDECAR_SCRAPE_JOB = "fabricscope-sidecar"


def prometheus_config(cluster: str, targets_file: Path, alertmanager_address: str,
                      rules: list[Path], scrape_interval: str = "5s",
                      evaluation_interval: str = "5s", self_address: str | None = None,
                      sidecar_address: str | None = None, sidecar_ca: Path | None = None) -> dict[str, Any]:
    scrape_configs: list[dict[str, Any]] = [{
        "job_name": SCRAPE_JOB,
        # The exporter sets `node` on every series itself; honouring it keeps one
        # `node` label instead of node + exported_node. Targets still label `up`.
        "honor_labels": True,
        "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "5s"}],
    }]
    if self_address:
        # Prometheus' own metrics feed the pipeline alerts (missed rule-group iterations).
        scrape_configs.append({"job_name": "prometheus", "static_configs": [{"targets": [self_address]}]})
    if sidecar_address:
        # The sidecar's own metrics (SLO violations, correlations) feed the tracing dashboard.
        scrape_configs.append({
            "job_name": SIDECAR_SCRAPE_JOB, "scheme": "https" if sidecar_ca else "http",
            **({"tls_config": {"ca_file": str(sidecar_ca)}} if sidecar_ca else {}),
            "static_configs": [{"targets": [sidecar_address], "labels": {"cluster": cluster}}]})
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": evaluation_interval,
            # Added to every alert sent to Alertmanager (routing groups by cluster).
            "external_labels": {"cluster": cluster},
        },
        "rule_files": [str(path) for path in rules],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_address]}]}]},
        "scrape_configs": scrape_configs,
    }


def alertmanager_config(webhook_url: str, base_config: Path = ALERTMANAGER_CONFIG,
                        timing: dict[str, str] | None = None,
                        webhook_http_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The repository's Alertmanager config, made runnable from another directory.

    Template globs become absolute (Alertmanager resolves them against the config file's
    directory), every webhook URL becomes `webhook_url`, and `timing` (group_wait,
    group_interval, repeat_interval) replaces those values on every route, which is how
    the end-to-end test gets 1s grouping without a second copy of the routing tree.
    `webhook_http_config` (Alertmanager's http_config: authorization, tls_config) is set
    on every webhook, which is how it reaches the sidecar over TLS with an API key."""
    try:
        config = yaml.safe_load(Path(base_config).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise StackError(f"cannot read Alertmanager config {base_config}: {exc}") from None
    if not isinstance(config, dict) or "route" not in config:
        raise StackError(f"{base_config}: not an Alertmanager config (no top-level route)")
    base_dir = Path(base_config).resolve().parent
    config["templates"] = [str(base_dir / glob) for glob in config.get("templates") or []]
    for receiver in config.get("receivers") or []:
        for webhook in receiver.get("webhook_configs") or []:
            webhook["url"] = webhook_url
            if webhook_http_config:
                webhook["http_config"] = webhook_http_config
    if timing:
        config["route"].update(timing)
        _override_route_timing(config["route"].get("routes") or [], timing)
    return config


def _override_route_timing(routes: list[dict[str, Any]], timing: dict[str, str]) -> None:
    # Child routes inherit from their parent, so only values a child sets itself need
    # replacing; the root gets them all.
    for route in routes:
        for key, value in timing.items():
            if key in route:
                route[key] = value
        _override_route_timing(route.get("routes") or [], timing)


def write_yaml(path: Path, data: Any) -> Path:
    """Atomically: Prometheus' file_sd watcher and a config reload never read half a file."""
    return write_atomically(path, yaml.safe_dump(data, sort_keys=False))
