"""`fabricscope rules`: the rendered rules, for one cluster or all, as rule files or as
prometheus-operator PrometheusRule objects.

    fabricscope rules --out /etc/prometheus/rules                       # the committed files
    fabricscope rules --cluster pod-b --out /etc/vmalert/pod-b            # one shard's rules
    fabricscope rules --cluster pod-b --format prometheusrule --out k8s/  # for kube-prometheus
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from fabricscope.atomicfile import write_atomically

from . import rule_files
from .cluster import ScopeError, prometheus_rule, scope_rule_file

FORMATS = ("rules", "prometheusrule")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="directory for the written files")
    parser.add_argument("--cluster", default=None,
                        help="scope every series selector to this cluster (one shard's evaluator)")
    parser.add_argument("--cluster-label", default="cluster", help="the label naming the cluster (default: cluster)")
    parser.add_argument("--format", choices=FORMATS, default="rules",
                        help="rules: Prometheus/vmalert rule files; prometheusrule: PrometheusRule objects")
    parser.add_argument("--namespace", default="monitoring", help="PrometheusRule namespace (default: monitoring)")
    parser.add_argument("rules", nargs="*", type=Path, help="rendered rule files (default: the committed rules)")


def write(sources: list[Path], out: Path, cluster: str | None, label: str = "cluster", form: str = "rules",
          namespace: str = "monitoring") -> list[Path]:
    """The rule files scoped to `cluster` (all clusters when None), written under `out`."""
    if form not in FORMATS:
        raise ScopeError(f"format must be one of {', '.join(FORMATS)}, got {form!r}")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sources:
        data = scope_rule_file(source, cluster, label)
        stem = Path(source).stem + (f"-{cluster}" if cluster else "")
        if form == "prometheusrule":
            data = prometheus_rule(data, stem, namespace, {"fabricscope.io/cluster": cluster} if cluster else None)
        target = out / f"{stem}.yaml"
        write_atomically(target, yaml.safe_dump(data, sort_keys=False))
        written.append(target)
    return written


def run(args: argparse.Namespace) -> int:
    try:
        for path in write(args.rules or rule_files(), args.out, args.cluster, args.cluster_label, args.format,
                          args.namespace):
            print(path)
    except OSError as exc:
        print(f"fabricscope rules: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except (ScopeError, yaml.YAMLError) as exc:
        print(f"fabricscope rules: {exc}", file=sys.stderr)
        return 1
    return 0
