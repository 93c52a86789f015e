"""The VictoriaMetrics backend sharded on the engine's own terms (docs/scale.md):

- vmagent in cluster mode: `members` vmagents, each with the same scrape config and its
  own -promscrape.cluster.memberNum, each scraping its share of the targets, every target
  scraped by `replication` members, so losing a member loses no series;
- one VictoriaMetrics single-node store; -dedup.minScrapeInterval keeps one sample per
  scrape interval of the `replication` copies;
- one vmalert per cluster (the shard), evaluating the rules scoped to that cluster
  (`fabricscope rules --cluster`, rules/cluster.py), writing its recording rules and
  ALERTS back to the store and restoring alert state from it after a restart;
- every vmalert alerts the same Alertmanager.

    backend = ShardedVictoria(workdir, scrape_config, ["pod-a", "pod-b"], rules,
                              alertmanager_url, scrape_interval="5s").start()
    backend.vmagents[1].stop()          # a member lost: the others still scrape its targets
    backend.restart_vmalert("pod-b")    # state restored from the store
    backend.stop()
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fabricscope.rules.cli import write as write_scoped_rules

from .binaries import free_ports
from .configs import write_yaml
from .processes import ManagedProcess
from .victoria import (own_metrics_jobs, start_victoria_metrics, start_vmagent, start_vmalert, vmagent_scrape_config,
                       vmalert_rules)


class ShardedVictoria:
    def __init__(self, workdir: Path, prometheus_config: dict[str, Any], clusters: list[str], rules: list[Path],
                 alertmanager_url: str, scrape_interval: str = "30s", evaluation_interval: str | None = None,
                 members: int = 3, replication: int = 2, host: str = "127.0.0.1", store_port: int = 0,
                 own_metrics: bool = False) -> None:
        """`store_port` 0 picks a free port; `own_metrics` adds scrape jobs for the store's,
        the vmagents' and the vmalerts' own metrics (as Prometheus scrapes itself)."""
        if not 1 <= replication <= members:
            raise ValueError(f"replication {replication} must be between 1 and the members ({members})")
        if len(set(clusters)) != len(clusters) or not clusters:
            raise ValueError(f"clusters must be distinct names, got {clusters!r}")
        self.workdir, self.host = Path(workdir), host
        self.scrape = vmagent_scrape_config(prometheus_config)
        self.clusters, self.rules, self.alertmanager_url = clusters, rules, alertmanager_url
        self.scrape_interval, self.evaluation_interval = scrape_interval, evaluation_interval or scrape_interval
        self.members, self.replication = members, replication
        ports = free_ports(1 + members + len(clusters), host)
        self.vm_port, self.vmagent_ports = store_port or ports[0], ports[1:1 + members]
        self.vmalert_ports = dict(zip(clusters, ports[1 + members:]))
        if own_metrics:
            self.scrape["scrape_configs"] += own_metrics_jobs(host, [
                ("victoria-metrics", [self.vm_port]), ("vmagent", self.vmagent_ports),
                ("vmalert", list(self.vmalert_ports.values()))])
        # What vmalert's copies of the rules left out ("group/rule: field"), per cluster.
        self.dropped: dict[str, list[str]] = {}
        self.victoria_metrics: ManagedProcess | None = None
        self.vmagents: list[ManagedProcess] = []
        self.vmalerts: dict[str, ManagedProcess] = {}
        self._rule_files: dict[str, list[Path]] = {}

    @property
    def url(self) -> str:
        """The store's Prometheus query API (the sidecar's --prometheus-url)."""
        return f"http://{self.host}:{self.vm_port}"

    def vmalert_url(self, cluster: str) -> str:
        return f"http://{self.host}:{self.vmalert_ports[cluster]}"

    def vmagent_url(self, member: int) -> str:
        return f"http://{self.host}:{self.vmagent_ports[member]}"

    def processes(self) -> list[ManagedProcess]:
        """Every server process started (the ones that must keep running)."""
        return [part for part in [self.victoria_metrics, *self.vmagents, *self.vmalerts.values()] if part is not None]

    def start(self) -> "ShardedVictoria":
        try:
            self.victoria_metrics = start_victoria_metrics(
                self.workdir / "victoria-metrics-data", self.host, self.vm_port, self.workdir / "victoria-metrics.log",
                # Every target arrives `replication` times (one copy a member): keep one
                # sample per scrape interval.
                extra_args=[f"-dedup.minScrapeInterval={self.scrape_interval}"])
            config = write_yaml(self.workdir / "vmagent.yml", self.scrape)
            for member in range(self.members):
                self.vmagents.append(self._start_vmagent(config, member))
            for cluster in self.clusters:
                scoped = write_scoped_rules(self.rules, self.workdir / "rules" / cluster, cluster)
                self._rule_files[cluster], self.dropped[cluster] = vmalert_rules(scoped, self.workdir / "vmalert-rules" / cluster)
                self.vmalerts[cluster] = self._start_vmalert(cluster)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_vmagent(self, config: Path, member: int) -> ManagedProcess:
        return start_vmagent(config, self.workdir / f"vmagent-{member}-data", self.host, self.vmagent_ports[member],
                             f"{self.url}/api/v1/write", self.workdir / f"vmagent-{member}.log",
                             extra_args=[f"-promscrape.cluster.membersCount={self.members}",
                                         f"-promscrape.cluster.memberNum={member}",
                                         f"-promscrape.cluster.replicationFactor={self.replication}"])

    def _start_vmalert(self, cluster: str) -> ManagedProcess:
        return start_vmalert(self._rule_files[cluster], self.url, self.alertmanager_url, self.host,
                             self.vmalert_ports[cluster], self.workdir / f"vmalert-{cluster}.log",
                             evaluation_interval=self.evaluation_interval, labels={"cluster": cluster})

    def restart_vmalert(self, cluster: str) -> ManagedProcess:
        """Stop one shard's vmalert and start it again on the same port; it restores its
        alerts' state from the store (-remoteRead.url)."""
        self.vmalerts[cluster].stop()
        self.vmalerts[cluster] = self._start_vmalert(cluster)
        return self.vmalerts[cluster]

    def stop(self) -> None:
        for part in [*self.vmalerts.values(), *self.vmagents, self.victoria_metrics]:
            if part is not None:
                part.stop()
