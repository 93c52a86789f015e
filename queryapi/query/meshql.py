"""MeshQL: parse `SHOW ...` statements into a registered query name and parameters.

A real grammar (meshql.lark, LALR) with token positions: a syntax error names the
character offset, line and column and the tokens that could have come there; a value the
query's parameter type refuses is reported at the position of the string that carried it.
MeshQL never produces PromQL itself: it yields (query name, params) for the registry.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from lark import Lark, Token, Transformer, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from .params import ParamError
from .registry import Registry, default_registry

MAX_STATEMENT = 2000

# How expected terminals read in an error message.
_READABLE = {"STRING": 'a "quoted string"', "DURATION": "a duration (e.g. 1h, 30m)",
             "FIELD": "a field name", "EQUAL": "'='", "$END": "end of statement",
             "<END-OF-FILE>": "end of statement"}


class MeshQLError(ValueError):
    """A statement that does not parse or whose values are refused (HTTP 422)."""

    def __init__(self, message: str, position: int, line: int, column: int,
                 expected: list[str] | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.position = position
        self.line = line
        self.column = column
        self.expected = expected or []
        self.param = param

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": "meshql_syntax" if self.param is None else "meshql_invalid_value",
                                "message": self.message, "position": self.position,
                                "line": self.line, "column": self.column, "expected": self.expected}
        if self.param is not None:
            body["param"] = self.param
        return body


@dataclass
class Statement:
    query_name: str
    params: dict[str, Any]
    positions: dict[str, Token] = field(default_factory=dict)


def _unquote(token: Token) -> str:
    return re.sub(r'\\(["\\])', r"\1", token[1:-1])


class _ToStatement(Transformer):
    def _one(self, name: str, **tokens: Token | None) -> Statement:
        params = {}
        positions = {}
        for key, token in tokens.items():
            if token is None:
                continue
            params[key] = _unquote(token) if token.type == "STRING" else str(token)
            positions[key] = token
        return Statement(name, params, positions)

    def start(self, children):
        return children[0]

    def neighbors(self, c):
        return self._one("device_neighbors", device=c[0])

    def impact(self, c):
        return self._one("blast_radius_device", device=c[0])

    def devices(self, c):
        statement = self._one("all_devices", field=c[0], value=c[1])
        if "field" in statement.params:
            statement.params["field"] = statement.params["field"].lower()
        return statement

    def summary(self, c):
        return self._one("fleet_summary")

    def stragglers(self, c):
        return self._one("slowest_ranks", comm=c[0])

    def cost(self, c):
        return self._one("straggler_cost", comm=c[0])

    def hangs(self, c):
        return self._one("nccl_hangs_by_node", host=c[0], window=c[1])

    def latency(self, c):
        return self._one("host_latency", host=c[0])

    def links(self, c):
        return self._one("links_by_state", state=c[0])

    def alerts(self, c):
        return self._one("firing_alerts", severity=c[0])


@lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = Path(__file__).with_name("meshql.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _readable(terminals) -> list[str]:
    names = []
    for name in sorted(set(terminals)):
        if name in _READABLE:
            names.append(_READABLE[name])
        elif name.startswith("_"):
            names.append(name[1:])
        else:
            names.append(name)
    return sorted(set(names))


def _syntax_error(text: str, exc: UnexpectedInput) -> MeshQLError:
    if isinstance(exc, UnexpectedEOF):
        expected = _readable(exc.expected)
        position = len(text.rstrip())
        found = "end of statement"
    elif isinstance(exc, UnexpectedToken):
        expected = _readable(exc.expected)
        at_end = exc.token.type == "$END"
        # lark places the end marker at the last token; the user's cursor is after it.
        position = len(text.rstrip()) if at_end else exc.token.start_pos
        found = "end of statement" if at_end else repr(str(exc.token)[:40])
    elif isinstance(exc, UnexpectedCharacters):
        expected = _readable(exc.allowed or ())
        position = exc.pos_in_stream
        found = repr(text[position:position + 1])
    else:  # pragma: no cover - lark raises only the three above
        expected, position, found = [], 0, "?"
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    return MeshQLError(f"unexpected {found} at line {line} column {column}; expected {' or '.join(expected)}",
                       position, line, column, expected)


def parse(text: Any, registry: Registry | None = None) -> Statement:
    """Parse and validate one statement; MeshQLError on any problem."""
    if not isinstance(text, str):
        raise MeshQLError("`query` must be a string holding one MeshQL statement", 0, 1, 1)
    if len(text) > MAX_STATEMENT:
        raise MeshQLError(f"statement longer than {MAX_STATEMENT} characters", MAX_STATEMENT, 1, MAX_STATEMENT + 1)
    try:
        statement = _ToStatement().transform(_parser().parse(text))
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None
    registry = registry or default_registry()
    try:
        statement.params = registry.validate(statement.query_name, statement.params)
    except ParamError as exc:
        token = statement.positions.get(exc.param)
        position = token.start_pos if token is not None else 0
        line = token.line if token is not None else 1
        column = token.column if token is not None else 1
        raise MeshQLError(f"{exc} (line {line} column {column})", position, line, column,
                          param=exc.param) from None
    return statement
