"""The sharded VictoriaMetrics backend (demo/stack/shards.py) under faults of its own: two
clusters of demo nodes, three vmagents in cluster mode (every target scraped by two), one
VictoriaMetrics, one vmalert per cluster with that cluster's rules, one Alertmanager.

- a port of a node of cluster pod-b goes down: it pages once, from pod-b's vmalert, and
  pod-a's vmalert never sees it;
- a vmagent member is killed: no target's `up` series has a gap longer than two scrape
  intervals (the member's targets were scraped by a second member all along);
- pod-b's vmalert is killed and started again while the alert fires: the alert is
  firing again at once (its state restored from the store, not pending through its
  `for:` again), and the pager is not paged a second time.

About 100 s: the port goes down 10 s in and its alert holds 30 s (fast alerts).

`fabricscope stack --backend victoriametrics --shards N` brings the same set-up up from the
one command (about 30 s): every demo exporter scraped by exactly --replication members,
the store holding each node once, the cluster's vmalert on the rules scoped to it; and
bad --shards/--replication values stop it before anything starts."""
from __future__ import annotations

import re
import signal
import time

import pytest
import requests
import yaml

from fabricscope.demo import stack
from fabricscope.demo.cluster import DemoCluster
from fabricscope.demo.scenario import load_scenario
from fabricscope.demo.stack.shards import ShardedVictoria
from fabricscope.demo.targets import file_sd_groups, write_targets_file
from fabricscope.cli import main as fabricscope_main
from tests import procs
from tests.test_stack_victoria import read_until, start_victoria_stack

pytestmark = pytest.mark.slow

SCRAPE_SECONDS = 3
ALERT = "FabricInfinibandPortDown"
FAULT = {"kind": "link_down", "node": 1, "at": "10s", "target": {"device": "mlx5_0", "port": 1}}


def scenario(name: str, seed: int, faults: list) -> dict:
    return {"seed": seed, "cluster": {"name": name, "nodes": 2, "gpus_per_node": 2, "hcas_per_node": 2},
            "tick_seconds": 1, "faults": faults}


def firing(vmalert_url: str) -> list[dict]:
    alerts = requests.get(f"{vmalert_url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return [a for a in alerts or [] if a["name"] == ALERT and a["state"] == "firing"]   # null: none


def pages(receiver) -> list[dict]:
    """The critical alert in each notification Alertmanager sent (the pager receiver has
    no integration here; the sidecar's copy of every alert goes through the same routes
    and grouping)."""
    return [alert for note in receiver.notifications if note.payload.get("receiver") == "fabricscope-sidecar"
            for alert in note.payload["alerts"]
            if alert["labels"].get("alertname") == ALERT and alert["labels"].get("severity") == "critical"]


def largest_gap(vm_url: str, since: float) -> tuple[float, dict]:
    """The longest stretch between two stored `up` samples of any target since `since`
    (to now, so a target that stopped counts), and that target's labels."""
    window = int(time.time() - since) + 2 * SCRAPE_SECONDS
    result = requests.get(f"{vm_url}/api/v1/query", timeout=30,
                          params={"query": f'up{{job="fabricscope"}}[{window}s]'}).json()["data"]["result"]
    assert len(result) == 4, result                       # 2 clusters x 2 nodes
    worst = (0.0, {})
    now = time.time()
    for series in result:
        stamps = [float(t) for t, _ in series["values"] if float(t) >= since - 2 * SCRAPE_SECONDS] + [now]
        gap = max(b - a for a, b in zip(stamps, stamps[1:]))
        worst = max(worst, (gap, series["metric"]), key=lambda item: item[0])
    return worst


def test_a_shard_pages_once_and_survives_losing_an_agent_and_a_restart(tmp_path):
    for binary in ("victoria-metrics", "vmagent", "vmalert", "prometheus-alertmanager"):
        procs.require_binary(binary)
    # Fast alerts, every group on vmalert's own interval.
    overrides = {**stack.FAST_ALERT_OVERRIDES, "intervals": dict.fromkeys(stack.FAST_ALERT_OVERRIDES["intervals"], "")}
    rules = stack.render_rules(overrides, tmp_path / "rules")
    with stack.WebhookReceiver() as receiver, \
            procs.alertmanager(stack.alertmanager_config(receiver.url, timing={
                "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"}), tmp_path / "am") as am, \
            DemoCluster(load_scenario(scenario("pod-a", 1, [])), tmp_path / "pod-a") as pod_a, \
            DemoCluster(load_scenario(scenario("pod-b", 2, [FAULT])), tmp_path / "pod-b") as pod_b:
        t0 = time.time() - pod_b.now()
        groups = file_sd_groups(pod_a.targets, "pod-a") + file_sd_groups(pod_b.targets, "pod-b")
        targets = write_targets_file(tmp_path / "targets.json", [], "", groups=groups)
        scrape = stack.prometheus_config("fleet", targets, am.url.removeprefix("http://"), [],
                                         scrape_interval=f"{SCRAPE_SECONDS}s")
        backend = ShardedVictoria(tmp_path / "backend", scrape, ["pod-a", "pod-b"], rules, am.url,
                                  scrape_interval=f"{SCRAPE_SECONDS}s", evaluation_interval="2s").start()
        try:
            # The page, from pod-b's shard.
            procs.wait_for(lambda: pages(receiver), 150, f"{ALERT} at the pager")
            page = pages(receiver)[0]
            assert page["labels"]["cluster"] == "pod-b" and page["labels"]["node"] == "gpu-node-1"
            assert page["generatorURL"].startswith(backend.vmalert_url("pod-b")), page["generatorURL"]
            assert firing(backend.vmalert_url("pod-a")) == []
            print(f"paged {time.time() - t0 - 10:.0f} s after the port went down")

            # A vmagent member lost: its targets were scraped by another member all along.
            backend.vmagents[1].stop()
            killed = time.time()
            time.sleep(6 * SCRAPE_SECONDS)
            gap, labels = largest_gap(backend.url, killed)
            assert gap <= 2 * SCRAPE_SECONDS, f"{labels}: no sample for {gap:.1f} s after a vmagent member stopped"

            # pod-b's vmalert restarted while the alert fires: restored firing, no new page.
            before = firing(backend.vmalert_url("pod-b"))
            assert before
            backend.restart_vmalert("pod-b")
            restarted = time.time()
            after = procs.wait_for(lambda: firing(backend.vmalert_url("pod-b")), 20,
                                   f"{ALERT} firing again after the restart")
            # Firing again well within the alert's for: (30 s): restored, not re-evaluated.
            assert time.time() - restarted < 20
            # The same activeAt (restored from the store's ALERTS_FOR_STATE, whole seconds).
            assert after[0]["activeAt"][:19] == before[0]["activeAt"][:19]
            time.sleep(6)                                  # Alertmanager's group_interval, twice over
            notified = pages(receiver)
            assert {alert["status"] for alert in notified} == {"firing"}
            assert len({alert["startsAt"] for alert in notified}) == 1, notified
        finally:
            backend.stop()


@pytest.mark.parametrize("flags, error", [
    (["--shards", "3"], "--shards needs --backend victoriametrics"),
    (["--backend", "victoriametrics", "--shards", "1"], "--shards must be at least 2"),
    (["--backend", "victoriametrics", "--shards", "2", "--replication", "3"], "at least --replication (3)"),
    (["--backend", "victoriametrics", "--shards", "3", "--replication", "0"], "--replication must be at least 1"),
    (["--replication", "2"], "--replication needs --shards"),
])
def test_stack_refuses_bad_sharding_flags_before_starting_anything(flags, error, tmp_path, capsys):
    workdir = tmp_path / "work"
    assert fabricscope_main(["stack", *flags, "--workdir", str(workdir)]) == 2
    assert error in capsys.readouterr().err
    assert not workdir.exists()                       # nothing started, nothing written


def test_stack_shards_brings_up_the_sharded_set_up(tmp_path):
    for binary in ("victoria-metrics", "vmagent", "vmalert", "prometheus-alertmanager"):
        procs.require_binary(binary)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario("shardstack", 3, [])))
    child, lines = start_victoria_stack(path, tmp_path / "work", "--shards", "3")
    try:
        banner = read_until(lines, "Ctrl-C stops everything", 120, child)
        vm_url = re.search(r"^VictoriaMetrics:\s+(http://\S+)", banner, re.M).group(1)
        members = re.findall(r"^    member \d:\s+(http://\S+)", banner, re.M)
        vmalert_url = re.search(r"^  vmalert:\s+(http://\S+)\s+\(cluster shardstack;", banner, re.M).group(1)
        assert len(members) == 3 and "each target scraped by 2" in banner
        exporters = set(re.findall(r"^  gpu-node-\d\s+http://(\S+)/metrics", banner, re.M))
        assert len(exporters) == 2

        def scraped_by() -> dict[str, int]:
            counts = dict.fromkeys(exporters, 0)
            for member in members:
                active = requests.get(f"{member}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
                for target in active:
                    if target["labels"].get("job") == "fabricscope" and target["health"] == "up":
                        counts[target["labels"]["instance"]] += 1
            return counts
        # Cluster mode with replication 2: every exporter scraped by exactly two of the three.
        procs.wait_for(lambda: set(scraped_by().values()) == {2}, 60, "each exporter scraped by two members")
        # The store deduplicates the two copies: one `up` series, one sample a scrape interval.
        samples = procs.wait_for(lambda: requests.get(f"{vm_url}/api/v1/query", timeout=10, params={
            "query": 'count_over_time(up{job="fabricscope"}[10s])'}).json()["data"]["result"], 30, "up in the store")
        assert sorted(s["metric"]["node"] for s in samples) == ["gpu-node-0", "gpu-node-1"]
        assert all(float(s["value"][1]) <= 6 for s in samples), samples      # 10 s / 2 s, not twice that
        # The cluster's vmalert evaluates the rules scoped to its cluster.
        groups = requests.get(f"{vmalert_url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        queries = [rule["query"] for group in groups for rule in group["rules"]]
        assert queries and all('cluster="shardstack"' in q for q in queries if "fabric_" in q)
        child.send_signal(signal.SIGTERM)
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
