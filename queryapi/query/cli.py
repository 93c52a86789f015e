"""`fabricscope query "<question or MeshQL>"`: ask the running sidecar, or Prometheus
directly, and print a table.

    fabricscope query "which links are down?"                       # the sidecar (default)
    fabricscope query 'SHOW HANGS LAST 1h' --dry-run                  # query name + params only
    fabricscope query "p99 latency of gpu-node-1" --prometheus http://127.0.0.1:19090

Against the sidecar it needs a key (--api-key or FABRICSCOPE_API_KEY) and, for the demo's
TLS, its CA (--cacert or FABRICSCOPE_CACERT). Directly against Prometheus it runs the same
registered queries with no sidecar; tools that need the sidecar's store say so.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

DEFAULT_SIDECAR = "https://127.0.0.1:19500"
MESHQL_PREFIX = "show"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="a question in plain language, or a MeshQL statement (SHOW ...)")
    parser.add_argument("--sidecar", default=os.environ.get("FABRICSCOPE_SIDECAR_URL", DEFAULT_SIDECAR),
                        help=f"sidecar URL (default: $FABRICSCOPE_SIDECAR_URL or {DEFAULT_SIDECAR})")
    parser.add_argument("--api-key", default=os.environ.get("FABRICSCOPE_API_KEY"),
                        help="sidecar API key (default: $FABRICSCOPE_API_KEY)")
    parser.add_argument("--cacert", default=os.environ.get("FABRICSCOPE_CACERT"),
                        help="CA file for the sidecar's TLS certificate (default: $FABRICSCOPE_CACERT)")
    parser.add_argument("--prometheus", metavar="URL",
                        help="skip the sidecar: run the registered query against this Prometheus")
    parser.add_argument("--session", metavar="ID", help="continue a sidecar conversation (follow-ups)")
    parser.add_argument("--dry-run", action="store_true", help="show the query and parameters, do not run")
    parser.add_argument("--json", action="store_true", help="print the full JSON answer")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for an answer")


class QueryCliError(Exception):
    pass


def is_meshql(text: str) -> bool:
    return text.lstrip().lower().startswith(MESHQL_PREFIX + " ") or text.strip().lower() == MESHQL_PREFIX


def ask_sidecar(args: argparse.Namespace) -> dict[str, Any]:
    import requests
    if not args.api_key:
        raise QueryCliError("the sidecar needs an API key: --api-key or FABRICSCOPE_API_KEY "
                            "(or use --prometheus URL to query Prometheus directly)")
    base = args.sidecar.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"}
    verify: Any = args.cacert or True
    try:
        if is_meshql(args.text):
            response = requests.post(f"{base}/queries/meshql", json={"query": args.text, "execute": not args.dry_run},
                                     headers=headers, verify=verify, timeout=args.timeout)
        elif args.dry_run:
            response = requests.get(f"{base}/ai/query/parameters", params={"message": args.text},
                                    headers=headers, verify=verify, timeout=args.timeout)
        else:
            body = {"message": args.text, **({"session_id": args.session} if args.session else {})}
            response = requests.post(f"{base}/ai/query/conversation", json=body, headers=headers, verify=verify,
                                     timeout=args.timeout)
    except requests.RequestException as exc:
        raise QueryCliError(f"cannot reach the sidecar at {base}: {exc}") from None
    try:
        body = response.json()
    except ValueError:
        raise QueryCliError(f"the sidecar answered HTTP {response.status_code} without JSON") from None
    if response.status_code >= 400:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        detail = error.get("detail") or {}
        where = f" (at position {detail['position']}, expected {' or '.join(detail.get('expected', []))})" \
            if "position" in detail and detail.get("expected") else ""
        raise QueryCliError(f"{error.get('code', response.status_code)}: {error.get('message', '')}{where}")
    return body


@dataclass
class _DirectState:
    """What the executor needs for a PromQL query, when there is no sidecar."""
    prom: Any
    config: Any


def ask_prometheus(args: argparse.Namespace) -> dict[str, Any]:
    from types import SimpleNamespace

    from ..prom import PrometheusClient, PrometheusError
    from . import executor, meshql
    from .calls import ToolUnavailable
    from .contract import abstention_answer
    from .extract import Vocabulary
    from .nl import Interpreter
    from .params import ParamError
    from .registry import default_registry
    state = _DirectState(PrometheusClient(args.prometheus, timeout=args.timeout),
                         SimpleNamespace(prometheus_timeout_seconds=args.timeout))
    registry = default_registry()
    try:
        if is_meshql(args.text):
            statement = meshql.parse(args.text, registry)
            body: dict[str, Any] = {"query_name": statement.query_name, "params": statement.params}
        else:
            try:
                vocabulary = Vocabulary(state.prom.label_values("node"), state.prom.label_values("device"))
            except PrometheusError:
                vocabulary = Vocabulary()
            # No LLM here: the command line gives the deterministic answer.
            interpretation = Interpreter(registry).interpret(args.text, vocabulary)
            body = interpretation.to_dict()
            if body["query_name"] is None:
                raise QueryCliError(abstention_answer(interpretation.match))
            if body["missing"]:
                raise QueryCliError(f"query {body['query_name']} needs: {', '.join(body['missing'])}")
        if not args.dry_run:
            if registry.get(body["query_name"]).promql is None:
                raise QueryCliError(f"query {body['query_name']} is a sidecar tool (it reads the sidecar's store "
                                    "or topology): ask the sidecar, or use --dry-run")
            body.update(executor.run(state, registry, body["query_name"], body["params"]))
    except meshql.MeshQLError as exc:
        raise QueryCliError(f"{exc.message}") from None
    except (ParamError, PrometheusError, ToolUnavailable) as exc:
        raise QueryCliError(str(exc)) from None
    return body


def format_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no results)"
    label_keys: list[str] = []
    extra_keys: list[str] = []
    for row in rows:
        for key in row.get("labels", {}):
            if key not in label_keys and key != "__name__":
                label_keys.append(key)
        for key in row:
            if key not in ("labels", "value") and key not in extra_keys:
                extra_keys.append(key)
    header = label_keys + ["value"] + extra_keys
    lines = [[str(row.get("labels", {}).get(k, "")) for k in label_keys] + [_cell(row.get("value"))]
             + [_cell(row.get(k)) for k in extra_keys] for row in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.upper().ljust(w) for h, w in zip(header, widths))]
    out += ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return "" if value is None else str(value)


def run(args: argparse.Namespace, out=sys.stdout) -> int:
    try:
        body = ask_prometheus(args) if args.prometheus else ask_sidecar(args)
    except QueryCliError as exc:
        print(f"fabricscope query: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(body, indent=2), file=out)
        return 0
    if body.get("query_name") is None:
        print(body.get("answer", "no registered query matches"), file=out)
        return 1
    params = ", ".join(f"{k}={v}" for k, v in sorted(body.get("params", {}).items()))
    print(f"query: {body['query_name']}({params})", file=out)
    if body.get("session_id"):
        print(f"session: {body['session_id']}  (--session for a follow-up)", file=out)
    if body.get("missing"):
        print(body.get("answer", ""), file=out)
        return 1
    if "results" in body:
        print(format_table(body["results"]), file=out)
        if body.get("truncated"):
            print("(truncated)", file=out)
    return 0
