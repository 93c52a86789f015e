"""The `fabricscope` command: one CLI, a subcommand per component.

Subcommands import their component lazily so `fabricscope exporter` on a GPU node never
imports the sidecar's dependencies (and the exporter imports neither queryapi nor chaos).
"""
from __future__ import annotations

import argparse
import sys
from types import ModuleType
from typing import Callable


# Each subcommand's module, imported only when that subcommand runs: a function per
# subcommand holding a real import statement (readable, and seen by the import checks).
def _exporter() -> ModuleType:
    from fabricscope.exporter import main
    return main


def _demo() -> ModuleType:
    from fabricscope.demo import main
    return main


def _stack() -> ModuleType:
    from fabricscope.demo.stack import cli
    return cli


def _sidecar() -> ModuleType:
    from fabricscope.queryapi import server
    return server


def _query() -> ModuleType:
    from fabricscope.queryapi.query import cli
    return cli


def _chaos() -> ModuleType:
    from fabricscope.chaos import cli
    return cli


def _rules() -> ModuleType:
    from fabricscope.rules import cli
    return cli


def _report() -> ModuleType:
    from fabricscope.dashboards import report
    return report


# subcommand -> (its module, with add_arguments(parser) and run(args); one-line help)
SUBCOMMANDS: dict[str, tuple[Callable[[], ModuleType], str]] = {
    "exporter": (_exporter, "run the node exporter"),
    "demo": (_demo, "run the simulated demo cluster (one exporter per node)"),
    "stack": (_stack, "run the demo stack: demo cluster, Prometheus with the rules, Alertmanager"),
    "sidecar": (_sidecar, "run the query sidecar (tracing, SLO correlation, cluster questions)"),
    "query": (_query, "ask the sidecar (or Prometheus) a question or a MeshQL statement"),
    "chaos": (_chaos, "blast-radius simulation on the cluster topology"),
    "rules": (_rules, "write the rules for one cluster (or all) as rule files or PrometheusRule objects"),
    "report": (_report, "render the dashboards to PNG images and one HTML page from Prometheus"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="fabricscope", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    modules = {}
    for name, (load, help_text) in SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=help_text)
        # Only the chosen subcommand's module is imported (and its flags built).
        if name == wanted:
            modules[name] = load()
            modules[name].add_arguments(subparser)
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
