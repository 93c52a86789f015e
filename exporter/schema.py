"""Validating a configuration file against its schema, with errors a person can act on.

Every file the exporter reads at start-up (--config.file, --web.config.file) is checked
against a pydantic model before anything starts. A problem stops the process with one
line per problem: the file, the key path, what was expected and (shortened) what was
found, e.g.

    config.yml: infiniband.thresholds.link_downed.delta: expected a number, got 'high'

Importing this module costs nothing: pydantic and PyYAML are imported by the functions that
use them. `fabricscope exporter` runs those in a short-lived child process
(exporter/isolated.py), so neither stays resident in the serving exporter (`shown` and
ConfigError are used while serving).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound="BaseModel")

# Strict: YAML already carries types, so "3" for a number or 1 for a name is a mistake
# to report, not a value to coerce. Forbid: a misspelt key must not be silently ignored.
# (pydantic's ConfigDict is a TypedDict: this plain dict is the same value.)
STRICT = dict(extra="forbid", strict=True, frozen=True)


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names file and key."""


def shown(value: Any, limit: int = 60) -> str:
    """A value as it may appear in an error message: never more than `limit` characters,
    so a large or hostile input is not echoed back whole."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _path(loc: tuple) -> str:
    parts = []
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + str(part))
    return "".join(parts) or "(top level)"


def _message(error: dict) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "value_error":   # our own validators: the message says it all
        return message.removeprefix("Value error, ")
    value = error.get("input")
    message = message[0].lower() + message[1:] if message else message
    return f"{message}, got {shown(value)}"


def format_errors(source: str, exc: ValidationError, at: tuple = ()) -> str:
    lines = []
    for error in exc.errors(include_url=False):
        loc = at + tuple(part for part in error["loc"]
                         if not (isinstance(part, str) and part.startswith("function-")))
        lines.append(f"{source}: {_path(loc)}: {_message(error)}")
    return "\n".join(lines)


def validate(model: type[Model], data: Any, source: str, at: tuple = ()) -> Model:
    """`data` as a `model`, or a ConfigError naming `source` and each key path (prefixed
    with `at` when `data` is part of a larger file)."""
    from pydantic import ValidationError

    try:
        return model.model_validate({} if data is None else data)
    except ValidationError as exc:
        raise ConfigError(format_errors(source, exc, at)) from None


def load_yaml(path: str | Path) -> Any:
    """The parsed file, or a ConfigError naming it."""
    import yaml

    from .parsers.files import read_file_bytes

    try:
        text = read_file_bytes(path).decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    from fabricscope import yamlsafe

    try:
        return yamlsafe.load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
