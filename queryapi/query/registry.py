"""The registry of named queries (queries.yaml): load, validate parameters, render PromQL.

Only a query listed in the YAML can run, whoever asks. A query is either a PromQL template
or a sidecar tool (Python function registered in `tools`). Templates contain placeholders
and nothing else user-controlled:

    {{ match host }}   ->  node="gpu-node-1"        (the parameter's label; absent optional
                                                     parameter -> node!="" which keeps all)
    {{ value window }} ->  1h  /  0.99  /  "text"    (bare for numbers and durations, an
                                                     escaped string literal otherwise)
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from fabricscope import yamlsafe
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..promql import quote as promql_string
from .params import TYPES, ParamError, parse_value

REGISTRY_PATH = Path(__file__).with_name("queries.yaml")
_PLACEHOLDER = re.compile(r"\{\{\s*(match|value)\s+([a-z_][a-z0-9_]*)\s*\}\}")


class UnknownQuery(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no registered query named {str(name)[:80]!r}")
        self.name = name


class RegistryError(ValueError):
    """queries.yaml itself is wrong (found at load time, never at request time)."""


class ParamSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str
    description: str = ""
    required: bool = False
    default: Any = None
    label: str | None = None          # label name for {{ match }}; default: parameter name
    label_from: str | None = None     # label name comes from this (device_field) parameter
    nl_from: list[str] = []           # extracted slots (besides its own name) that can fill it
    # An absent optional {{ match }}: "present" keeps series that have the label (label!=""),
    # "any" keeps every series, also those without it (a Prometheus whose targets carry no
    # cluster label still answers).
    absent: Literal["present", "any"] = "present"

    @model_validator(mode="after")
    def _known_type(self) -> "ParamSpec":
        if self.type not in TYPES:
            raise ValueError(f"unknown parameter type {self.type!r} (known: {', '.join(sorted(TYPES))})")
        if self.required and self.default is not None:
            raise ValueError("a required parameter has no default")
        return self


class QuerySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{1,63}$")
    category: str
    description: str
    params: dict[str, ParamSpec] = {}
    promql: str | None = None
    tool: str | None = None
    result: Literal["vector", "table"] = "vector"
    scope: Literal["read", "write", "admin"] = "read"   # the key scope running it needs
    # Natural-language matching: words (or "two words") and their weights.
    terms: dict[str, float] = {}
    examples: list[str] = []
    # Queries that answer the same question with more filters (the windowed form of an
    # instant query): natural language moves to one when the question names a constraint
    # this query cannot take.
    variants: list[str] = []
    # Constraints the answer covers whole and cannot split by (arrival lag is per rank over
    # every collective: "late to the allreduce" is answered for all of them, and the answer
    # says so).
    covers: list[Literal["op"]] = []

    @model_validator(mode="after")
    def _one_body(self) -> "QuerySpec":
        if (self.promql is None) == (self.tool is None):
            raise ValueError("a query has exactly one of `promql` and `tool`")
        if self.promql is not None:
            leftover = _PLACEHOLDER.sub("", self.promql)
            if "{{" in leftover or "}}" in leftover:
                raise ValueError("malformed placeholder (use {{ match p }} or {{ value p }})")
            for _, name in _PLACEHOLDER.findall(self.promql):
                if name not in self.params:
                    raise ValueError(f"template uses undeclared parameter {name!r}")
        for name, spec in self.params.items():
            if spec.label_from and (spec.label_from not in self.params
                                    or self.params[spec.label_from].type != "device_field"):
                raise ValueError(f"parameter {name!r}: label_from must name a device_field parameter")
        return self

    def public(self) -> dict[str, Any]:
        """What the catalog shows: no templates' internals beyond the PromQL itself."""
        return {
            "name": self.name, "category": self.category, "description": self.description,
            "kind": "promql" if self.promql else "tool", "scope": self.scope,
            "params": {name: {"type": spec.type, "required": spec.required, "default": spec.default,
                              "description": spec.description or TYPES[spec.type].description}
                       for name, spec in self.params.items()},
            "examples": self.examples,
        }

    def input_schema(self) -> dict[str, Any]:
        """JSON schema of the parameters (MCP tool input, HTTP body)."""
        properties = {}
        for name, spec in self.params.items():
            schema = dict(TYPES[spec.type].json_schema)
            schema["description"] = spec.description or TYPES[spec.type].description
            if spec.default is not None:
                schema["default"] = spec.default
            properties[name] = schema
        return {"type": "object", "properties": properties,
                "required": [n for n, s in self.params.items() if s.required],
                "additionalProperties": False}


class Registry:
    def __init__(self, queries: list[QuerySpec]) -> None:
        self.queries = {q.name: q for q in queries}
        if len(self.queries) != len(queries):
            raise RegistryError("duplicate query names in the registry")
        for query in queries:
            unknown = [name for name in query.variants if name not in self.queries or name == query.name]
            if unknown:
                raise RegistryError(f"query {query.name!r}: variants {unknown} are not other registered queries")

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.queries

    def get(self, name: Any) -> QuerySpec:
        if not isinstance(name, str) or name not in self.queries:
            raise UnknownQuery(str(name))
        return self.queries[name]

    def catalog(self) -> list[dict[str, Any]]:
        """All queries sorted by category, then name."""
        return [q.public() for q in sorted(self.queries.values(), key=lambda q: (q.category, q.name))]

    def validate(self, name: Any, params: Any) -> dict[str, Any]:
        """Canonical parameters for query `name`, defaults filled; ParamError otherwise."""
        spec = self.get(name)
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ParamError("params", f"expected an object, got {type(params).__name__}")
        unknown = sorted(str(k)[:40] for k in params if k not in spec.params)
        if unknown:
            known = ", ".join(spec.params) or "none"
            raise ParamError(unknown[0], f"query {spec.name!r} has no such parameter (it takes: {known})")
        values: dict[str, Any] = {}
        for pname, pspec in spec.params.items():
            raw = params.get(pname)
            if raw is None:
                if pspec.required:
                    raise ParamError(pname, f"required by query {spec.name!r}")
                if pspec.default is None:
                    continue
                raw = pspec.default
            values[pname] = parse_value(pname, pspec.type, raw)
        return values

    def render(self, name: str, values: dict[str, Any]) -> str:
        """PromQL for already-validated `values` (validate() first)."""
        spec = self.get(name)
        if spec.promql is None:
            raise ValueError(f"query {name!r} is a tool, not a PromQL template")

        def substitute(match: re.Match[str]) -> str:
            kind, pname = match.groups()
            pspec = spec.params[pname]
            value = values.get(pname)
            if kind == "value":
                if value is None:
                    raise ParamError(pname, "a template value with no default")
                return _literal(pspec.type, value)
            label = pspec.label or pname
            if pspec.label_from:
                label = values.get(pspec.label_from) or label
            if value is None:
                return f'{label}=~".*"' if pspec.absent == "any" else f'{label}!=""'
            # Label values are strings in PromQL whatever the parameter's type (gpu="3").
            return f"{label}={promql_string(str(value))}"

        return _PLACEHOLDER.sub(substitute, spec.promql).strip()


def _literal(type_name: str, value: Any) -> str:
    how = TYPES[type_name].render
    if how == "bare":
        text = repr(value) if isinstance(value, float) else str(value)
        # Canonical numbers and durations only: the parser made them, this guards the guard.
        if not re.fullmatch(r"[0-9][0-9a-z.]*", text):
            raise ValueError(f"refusing to write {text[:32]!r} bare into PromQL")
        return text
    if how == "label":
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", str(value)):
            raise ValueError(f"refusing label name {str(value)[:32]!r}")
        return str(value)
    return promql_string(str(value))


def load_registry(path: str | Path = REGISTRY_PATH) -> Registry:
    try:
        data = yamlsafe.load(Path(path).read_text())
        return Registry([QuerySpec.model_validate(q) for q in data["queries"]])
    except ValidationError as exc:
        raise RegistryError(f"{path}: {exc}") from None
    except (KeyError, TypeError) as exc:
        raise RegistryError(f"{path}: expected a top-level `queries:` list ({exc})") from None


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    return load_registry()
