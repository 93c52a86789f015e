"""Every error code the sidecar can answer with, found in its own source, and the table
of them in docs/sidecar.md, generated from that scan:

    python -m fabricscope.queryapi.error_codes docs/sidecar.md

The scan reads each `ApiError(status, ..., code=...)` and `ToolError(status, code, ...)`
call of the package (ast, no import side effects); codes built with an f-string are
expanded through EXPANDED. MEANINGS says what each code means to a client; the test
(tests/test_sidecar_error_codes.py) fails when the code raises one it lacks, when it
holds one nothing raises, or when the doc's table is not what this module writes.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
BEGIN, END = "<!-- error-codes:begin -->", "<!-- error-codes:end -->"

# Default code per status when the raiser gives none.
DEFAULT_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_failed",
    429: "rate_limited",
    500: "internal_error",
    502: "upstream_error",
    503: "unavailable",
    504: "upstream_timeout",
}

# f-string codes -> the (code, status) they can become.
EXPANDED = {
    "prometheus_{exc.reason}": {"prometheus_unreachable": 503, "prometheus_timeout": 504,
                                "prometheus_bad_response": 502, "prometheus_query_error": 502},
    "chaos_invalid_{exc.field}": {"chaos_invalid_device": 422, "chaos_invalid_failure_type": 422},
}
# Codes that come from a body rather than a call: MeshQLError.to_dict (query/meshql.py).
FROM_BODIES = {"meshql_syntax": 422, "meshql_invalid_value": 422}

MEANINGS = {
    "alertmanager_not_configured": "reconciling needs the sidecar started with --alertmanager-url",
    "alertmanager_unavailable": "Alertmanager's API did not answer the reconciliation",
    "all_spans_rejected": "every span of the batch failed validation; `detail.rejected` lists each by index",
    "bad_credentials": "the API key is not known (or was revoked)",
    "bad_gzip": "the body says gzip but does not inflate",
    "bad_json": "the body is not JSON",
    "bad_otlp": "the OTLP body does not decode (protobuf or JSON)",
    "bad_request": "the request is malformed (e.g. a tool call whose body is not JSON)",
    "bad_time_window": "the time window is empty, reversed or too long",
    "batch_too_large": "more spans in one batch than the cap; split the batch",
    "chaos_invalid_device": "the device is not in the topology; `detail.choices` holds close matches",
    "chaos_invalid_failure_type": "the failure type is unknown or cannot apply to that device",
    "chaos_no_topology": "the sidecar runs without --chaos-topology",
    "chaos_rate_limited": "the key's chaos simulations per minute are spent; see Retry-After",
    "conflict": "the request conflicts with the stored state",
    "forbidden": "the key lacks the scope this endpoint needs",
    "internal_error": "a bug: the sidecar logged it with the request id",
    "invalid_message": "the conversation message is empty, not a string or too long",
    "invalid_session_id": "the conversation session id is malformed or unknown",
    "invalid_params": "a query or tool parameter is refused; `detail.param` names it",
    "meshql_invalid_value": "a MeshQL value is refused; position and parameter are given",
    "meshql_syntax": "the MeshQL statement does not parse; position and expected tokens are given",
    "method_not_allowed": "the endpoint exists but not with this method",
    "not_a_span_batch": "the body is JSON but not a span batch (`{\"spans\": [...]}`)",
    "not_found": "no such endpoint",
    "payload_too_large": "the body (or its inflated size) is over the limit",
    "prometheus_bad_response": "Prometheus answered something that is not a query result",
    "prometheus_query_error": "Prometheus refused the query",
    "prometheus_timeout": "Prometheus did not answer in time",
    "prometheus_unreachable": "Prometheus cannot be reached",
    "rate_limited": "the key's request rate is spent; see Retry-After",
    "request_timeout": "the request body did not arrive in time",
    "simulation_not_found": "no simulation with that id",
    "storage_unavailable": "the database cannot be reached or is locked",
    "tool_not_found": "no registered tool of that name",
    "tool_unavailable": "the tool needs a capability this sidecar lacks (e.g. a topology)",
    "unauthenticated": "no API key in the request",
    "unknown_query": "no registered query of that name",
    "unknown_rate_class": "no GPU-hour price for that rate class",
    "unsupported_encoding": "Content-Encoding other than gzip or none",
    "unsupported_media_type": "Content-Type the endpoint does not accept",
    "upstream_error": "an upstream service failed",
    "upstream_timeout": "the request did not finish within its deadline",
    "unavailable": "the sidecar cannot serve the request now",
    "validation_failed": "the query string or body fails the endpoint's schema; each field is named",
}


def _literal(node: ast.AST | None) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return ast.unparse(node)[2:-1]            # f'x_{y}' -> x_{y}
    return None


def _called(node: ast.Call) -> str | None:
    return getattr(node.func, "id", None) or getattr(node.func, "attr", None)


def scan(package: Path = PACKAGE) -> dict[str, set[int]]:
    """code -> the HTTP statuses it is raised with, from the source."""
    found: dict[str, set[int]] = {code: {status} for code, status in FROM_BODIES.items()}
    found.update({code: {status} for status, code in DEFAULT_CODES.items()})
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or _called(node) not in ("ApiError", "ToolError") or not node.args:
                continue
            status = _literal(node.args[0])
            if _called(node) == "ApiError":
                code = _literal(next((k.value for k in node.keywords if k.arg == "code"), None))
            else:
                code = _literal(node.args[1]) if len(node.args) > 1 else None
            if code is None and isinstance(status, int) and _called(node) == "ApiError":
                code = DEFAULT_CODES.get(status)
            if not isinstance(code, str):
                continue                              # passes another error's code along
            for concrete, fixed in EXPANDED.get(code, {code: status}).items():
                if isinstance(fixed, int):
                    found.setdefault(concrete, set()).add(fixed)
    return found


def markdown(found: dict[str, set[int]] | None = None) -> str:
    found = scan() if found is None else found
    rows = [f"| `{code}` | {', '.join(map(str, sorted(statuses)))} | {MEANINGS.get(code, '')} |"
            for code, statuses in sorted(found.items())]
    return "\n".join(["| code | HTTP | meaning |", "|---|---|---|", *rows])


def write_docs(doc: Path) -> None:
    text = doc.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    doc.write_text(f"{head}{BEGIN}\n{markdown()}\n{END}{tail}")


if __name__ == "__main__":
    write_docs(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE.parent / "docs" / "sidecar.md")
