"""The sidecar as Alertmanager's webhook receiver: real Alertmanager with the repository's
routing posts over TLS with an API key (http_config), and the sidecar records each alert
once per episode however often Alertmanager repeats it."""
from __future__ import annotations

import datetime as dt

import pytest
import requests

from fabricscope import stack
from fabricscope.stack.sidecar import start_sidecar
from tests import procs
from tests.sidecar_helpers import bearer, make_keys

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    work = tmp_path_factory.mktemp("alerts")
    keys = make_keys(work / "keys.yaml", {"alertmanager": "write"})
    sidecar = start_sidecar(work, "127.0.0.1", stack.free_port(), f"http://127.0.0.1:{stack.free_port()}",
                            work / "keys.yaml")
    try:
        config = stack.alertmanager_config(
            sidecar.url + "/alerts/webhook",
            timing={"group_wait": "1s", "group_interval": "1s", "repeat_interval": "2s"},
            webhook_http_config={"authorization": {"type": "Bearer", "credentials": keys["alertmanager"]},
                                 "tls_config": {"ca_file": str(sidecar.certs.ca)}})
        with procs.alertmanager(config, work / "am") as am:
            yield sidecar, am, keys
    finally:
        sidecar.stop()


def recorded(sidecar, keys, **params) -> list[dict]:
    response = requests.get(sidecar.url + "/alerts", params=params, headers=bearer(keys["reader"]),
                            verify=str(sidecar.certs.ca), timeout=10)
    response.raise_for_status()
    return response.json()["alerts"]


def test_alertmanager_notifications_are_recorded_once_per_episode(setup):
    sidecar, am, keys = setup
    starts = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    alert = {"labels": {"alertname": "FabricNcclHang", "severity": "critical", "cluster": "demo", "comm": "c0"},
             "annotations": {"summary": "hang"}, "startsAt": starts.isoformat()}
    am.post("/api/v2/alerts", [alert])
    # Alertmanager repeats the unresolved alert every 2s; it stays one row.
    rows = procs.wait_for(lambda: [r for r in recorded(sidecar, keys, alertname="FabricNcclHang")
                                   if r["receive_count"] >= 2], 60, "a repeated delivery of the alert")
    (row,) = rows
    assert row["status"] == "firing" and row["labels"]["comm"] == "c0" and row["receiver"] == "fabricscope-sidecar"
    ends = starts + dt.timedelta(seconds=1)
    am.post("/api/v2/alerts", [{**alert, "endsAt": ends.isoformat()}])
    (row,) = procs.wait_for(lambda: recorded(sidecar, keys, alertname="FabricNcclHang", status="resolved"),
                            60, "the resolved notification")
    assert row["receive_count"] >= 3
    assert len(recorded(sidecar, keys, alertname="FabricNcclHang")) == 1
    metrics = requests.get(sidecar.url + "/metrics", verify=str(sidecar.certs.ca), timeout=10).text
    assert 'fabric_sidecar_alerts_received_total{status="resolved"}' in metrics


def test_the_webhook_needs_the_write_scope_and_a_real_payload(setup):
    sidecar, _, keys = setup
    url, ca = sidecar.url + "/alerts/webhook", str(sidecar.certs.ca)
    payload = {"version": "4", "receiver": "x", "alerts": [{"status": "firing", "labels": {"alertname": "A"},
                                                           "startsAt": "2026-01-01T00:00:00Z", "fingerprint": "ab12"}]}
    assert requests.post(url, json=payload, verify=ca, timeout=10).status_code == 401
    assert requests.post(url, json=payload, headers=bearer(keys["reader"]), verify=ca, timeout=10).status_code == 403
    bad = {**payload, "alerts": [{"status": "exploded", "labels": {}, "startsAt": "x", "fingerprint": "../../"}]}
    response = requests.post(url, json=bad, headers=bearer(keys["writer"]), verify=ca, timeout=10)
    assert response.status_code == 422 and response.json()["error"]["code"] == "validation_failed"
    assert recorded(sidecar, keys, alertname="A") == []      # nothing of the bad payload was stored
    response = requests.post(url, json=payload, headers=bearer(keys["writer"]), verify=ca, timeout=10)
    assert response.json() == {"recorded": 1, "repeats": 0}


def test_a_nul_character_is_refused_on_both_backends_alike(setup):
    sidecar, _, keys = setup
    url, ca = sidecar.url + "/alerts/webhook", str(sidecar.certs.ca)
    for alert in ({"status": "firing", "labels": {"alertname": "N\u0000"}, "startsAt": "x", "fingerprint": "n1"},
                  {"status": "firing", "labels": {"alertname": "N"}, "startsAt": "x\u0000", "fingerprint": "n1"}):
        response = requests.post(url, json={"alerts": [alert]}, headers=bearer(keys["writer"]), verify=ca,
                                 timeout=10)
        assert response.status_code == 422, response.text
    for path, params in (("/alerts", {"alertname": "\u0000"}), ("/tracing/slo-violations", {"service": "a\u0000"}),
                         ("/tracing/correlations", {"trace_id": "\u0000"})):
        response = requests.get(sidecar.url + path, params=params, headers=bearer(keys["reader"]), verify=ca,
                                timeout=10)
        assert response.status_code == 422, (path, response.text)
