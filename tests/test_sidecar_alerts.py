"""The sidecar as Alertmanager's webhook receiver: real Alertmanager with the repository's
routing posts over TLS with an API key (http_config), and the sidecar records each alert
once per episode however often Alertmanager repeats it."""
from __future__ import annotations

import datetime as dt
import time

import pytest
import requests

from fabricscope.demo import stack
from fabricscope.devcerts import ensure_dev_certs
from fabricscope.demo.stack.sidecar import start_sidecar
from tests import procs
from tests.sidecar_helpers import bearer, make_keys

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Alertmanager first (its webhook points at the sidecar's port, with the sidecar's
    CA), then the sidecar, told Alertmanager's URL for reconciliation. The periodic
    reconciliation is set to an hour so that only the test's own POST /alerts/reconcile
    runs one."""
    work = tmp_path_factory.mktemp("alerts")
    keys = make_keys(work / "keys.yaml", {"alertmanager": "write"})
    port = stack.free_port()
    certs = ensure_dev_certs(work / "tls")          # the same files start_sidecar uses
    config = stack.alertmanager_config(
        f"https://127.0.0.1:{port}/alerts/webhook",
        timing={"group_wait": "1s", "group_interval": "1s", "repeat_interval": "2s"},
        webhook_http_config={"authorization": {"type": "Bearer", "credentials": keys["alertmanager"]},
                             "tls_config": {"ca_file": str(certs.ca)}})
    with procs.alertmanager(config, work / "am") as am:
        sidecar = start_sidecar(work, "127.0.0.1", port, f"http://127.0.0.1:{stack.free_port()}",
                                work / "keys.yaml", extra_args=["--alertmanager-url", am.url,
                                                                "--alertmanager-reconcile-seconds", "3600"])
        try:
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


def test_an_alert_resolved_while_inhibited_is_shown_resolved(setup):
    """Alertmanager sends no resolution for an alert that ends while inhibited, and never
    sends one inhibited from its start. After a reconciliation the sidecar's firing
    alerts are exactly Alertmanager's."""
    sidecar, am, keys = setup
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    node = {"cluster": "demo", "node": "gpu-node-9"}
    link_down = {"labels": {"alertname": "FabricNvlinkLinkDown", "severity": "critical", "gpu": "3", "link": "7", **node},
                 "startsAt": now.isoformat()}
    am.post("/api/v2/alerts", [link_down])
    procs.wait_for(lambda: recorded(sidecar, keys, alertname="FabricNvlinkLinkDown"), 60, "the link-down notification")
    # The driver's NVLink Xid silences the node's link-down alert (alertmanager.yml); a
    # second link goes down under it and is never notified.
    xid = {"labels": {"alertname": "FabricGpuXidFatal", "severity": "critical", "xid": "74", **node},
           "startsAt": now.isoformat()}
    second = {"labels": {**link_down["labels"], "link": "8"}, "startsAt": now.isoformat()}
    am.post("/api/v2/alerts", [xid, second])
    procs.wait_for(lambda: [a for a in am.get("/api/v2/alerts") if a["status"]["inhibitedBy"]
                            and a["labels"].get("link") == "7"], 30, "the link-down alert inhibited")
    am.post("/api/v2/alerts", [{**link_down, "endsAt": (now + dt.timedelta(seconds=1)).isoformat()}])
    procs.wait_for(lambda: not [a for a in am.get("/api/v2/alerts") if a["labels"].get("link") == "7"], 30,
                   "Alertmanager to drop the resolved link-down alert")
    # Several group intervals later no notification has said so: the record still fires.
    time.sleep(3)
    (before,) = [r for r in recorded(sidecar, keys, alertname="FabricNvlinkLinkDown") if r["labels"]["link"] == "7"]
    assert before["status"] == "firing"
    url, ca = sidecar.url + "/alerts/reconcile", str(sidecar.certs.ca)
    assert requests.post(url, headers=bearer(keys["reader"]), verify=ca, timeout=10).status_code == 403
    response = requests.post(url, headers=bearer(keys["writer"]), verify=ca, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["resolved"] >= 1 and response.json()["added"] >= 1
    rows = {(r["alertname"], r["labels"].get("link")): r for r in recorded(sidecar, keys)
            if r["labels"].get("node") == "gpu-node-9"}
    assert rows[("FabricNvlinkLinkDown", "7")]["status"] == "resolved"
    assert rows[("FabricNvlinkLinkDown", "8")]["status"] == "firing"
    assert rows[("FabricNvlinkLinkDown", "8")]["receive_count"] == 0
    assert rows[("FabricGpuXidFatal", None)]["status"] == "firing"
    firing = {r["fingerprint"] for r in recorded(sidecar, keys, status="firing")}
    assert firing == {a["fingerprint"] for a in am.get("/api/v2/alerts")}
    metrics = requests.get(sidecar.url + "/metrics", verify=ca, timeout=10).text
    assert 'fabric_sidecar_alerts_reconciled_total{action="resolved"}' in metrics
