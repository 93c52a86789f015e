"""The real-server demo stack: `fabricscope stack`, and the pieces the end-to-end tests use.

    binaries    find_binary, ensure_port_free, free_port
    processes   ManagedProcess, start_prometheus, start_alertmanager
    configs     prometheus_config, alertmanager_config, render_rules, rule_files, write_yaml
    webhook     WebhookReceiver, ReceivedNotification, format_notification
    cli         add_arguments, run (the command itself)
"""
from __future__ import annotations

from .binaries import ensure_port_free, find_binary, free_port
from .cli import (DEFAULT_ALERTMANAGER_PORT, DEFAULT_PROMETHEUS_PORT, Stack, add_arguments, describe_faults,
                  load_stack_scenario, run, start_stack)
from .configs import (FAST_ALERT_OVERRIDES, SCRAPE_JOB, alertmanager_config, prometheus_config, render_rules,
                      rule_files, write_yaml)
from .errors import StackError
from .processes import ManagedProcess, start_alertmanager, start_prometheus
from .webhook import SIDECAR_WEBHOOK_PATH, ReceivedNotification, WebhookReceiver, format_notification

__all__ = [
    "DEFAULT_ALERTMANAGER_PORT", "DEFAULT_PROMETHEUS_PORT", "FAST_ALERT_OVERRIDES", "SCRAPE_JOB",
    "SIDECAR_WEBHOOK_PATH", "ManagedProcess", "ReceivedNotification", "Stack", "StackError", "WebhookReceiver",
    "add_arguments", "alertmanager_config", "describe_faults", "ensure_port_free", "find_binary",
    "format_notification", "free_port", "load_stack_scenario", "prometheus_config", "render_rules", "rule_files",
    "run", "start_alertmanager", "start_prometheus", "start_stack", "write_yaml",
]
