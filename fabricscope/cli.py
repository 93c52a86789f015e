"""The `fabricscope` command: one CLI, a subcommand per component.

Subcommands import their component lazily so `fabricscope exporter` on a GPU node never
imports the sidecar's dependencies (and the exporter imports neither queryapi nor chaos).
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module with add_arguments(parser) and run(args), one-line help)
SUBCOMMANDS = {
    "exporter": ("fabricscope.exporter.main", "run the node exporter"),
    "demo": ("fabricscope.demo.main", "run the simulated demo cluster (one exporter per node)"),
    "stack": ("fabricscope.stack.cli", "run the demo stack: demo cluster, Prometheus with the rules, Alertmanager"),
    "sidecar": ("fabricscope.queryapi.server", "run the query sidecar (tracing, SLO correlation, cluster questions)"),
    "query": ("fabricscope.queryapi.query.cli", "ask the sidecar (or Prometheus) a question or a MeshQL statement"),
    "chaos": ("fabricscope.chaos.cli", "blast-radius simulation on the cluster topology"),
    "report": ("fabricscope.dashboards.report", "render the dashboards to PNG images and one HTML page from Prometheus"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="fabricscope", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=help_text)
        # Only the chosen subcommand's module is imported (and its flags built).
        if name == wanted:
            modules[name] = importlib.import_module(module_name)
            modules[name].add_arguments(subparser)
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
