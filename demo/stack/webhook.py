"""A local Alertmanager webhook receiver: records each notification and hands it on."""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from fabricscope.httpserver import HttpServer, read_body, respond

log = logging.getLogger("fabricscope.demo.stack.webhook")

SIDECAR_WEBHOOK_PATH = "/alerts/webhook"


@dataclass
class ReceivedNotification:
    received_at: float        # time.time() when the POST arrived
    payload: dict[str, Any]   # Alertmanager webhook payload (version "4")


class WebhookReceiver:
    """Accepts Alertmanager webhook POSTs, records them and hands each to
    `on_notification`. Bad requests get a 400 and are counted, never raised."""

    MAX_BODY = 4 * 1024 * 1024

    def __init__(self, host: str = "127.0.0.1", port: int = 0, path: str = SIDECAR_WEBHOOK_PATH,
                 on_notification: Callable[[ReceivedNotification], None] | None = None) -> None:
        self.path = path
        self.notifications: list[ReceivedNotification] = []
        self.rejected = 0
        self._lock = threading.Lock()
        self._on_notification = on_notification
        self.server = HttpServer(self._app, host, port, name="webhook-receiver", max_body_bytes=self.MAX_BODY)

    def _app(self, environ: dict[str, Any], start_response) -> list[bytes]:
        problem = self._accept(environ)
        body = json.dumps({"status": "error", "error": problem} if problem else {"status": "ok"}).encode()
        return respond(start_response, 400 if problem else 200, body, "application/json")

    def _accept(self, environ: dict[str, Any]) -> str | None:
        if environ.get("PATH_INFO") != self.path:
            return f"unknown path {environ.get('PATH_INFO')!r}; post to {self.path}"
        if environ.get("REQUEST_METHOD") != "POST":
            return f"use POST, not {environ.get('REQUEST_METHOD')}"
        body = read_body(environ, self.MAX_BODY)
        problem = None if body else f"the body must be between 1 and {self.MAX_BODY} bytes"
        if problem is None:
            try:
                payload = json.loads(body)
            except (ValueError, RecursionError) as exc:
                problem = f"body is not JSON: {exc}"
            else:
                if not (isinstance(payload, dict) and isinstance(payload.get("alerts"), list)):
                    problem = "body is not an Alertmanager webhook payload (no alerts list)"
        if problem:
            with self._lock:
                self.rejected += 1
            return problem
        notification = ReceivedNotification(time.time(), payload)
        with self._lock:
            self.notifications.append(notification)
        if self._on_notification is not None:
            try:
                self._on_notification(notification)
            except Exception:
                log.exception("webhook notification handler failed")
        return None

    @property
    def url(self) -> str:
        return self.server.url + self.path

    def alerts(self) -> list[tuple[float, dict[str, Any]]]:
        """Every alert received so far, as (received_at, alert), in arrival order."""
        with self._lock:
            return [(n.received_at, alert) for n in self.notifications for alert in n.payload["alerts"]]

    def start(self) -> "WebhookReceiver":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> "WebhookReceiver":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def format_notification(notification: ReceivedNotification) -> str:
    """One line per alert, as the stack prints them."""
    lines = []
    stamp = time.strftime("%H:%M:%S", time.localtime(notification.received_at))
    receiver = notification.payload.get("receiver", "?")
    for alert in notification.payload["alerts"]:
        labels = dict(alert.get("labels") or {})
        # Scrape bookkeeping says nothing about where the fault is; node does.
        labels.pop("instance", None)
        labels.pop("job", None)
        name = labels.pop("alertname", "?")
        severity = labels.pop("severity", "?")
        where = " ".join(f"{key}={value}" for key, value in sorted(labels.items()))
        summary = (alert.get("annotations") or {}).get("summary", "")
        lines.append(f"{stamp} [{receiver}] {str(alert.get('status', '?')).upper()} {name} ({severity}) "
                     f"{where}{' - ' + summary if summary else ''}")
    return "\n".join(lines)
