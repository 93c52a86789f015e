"""Writing values into PromQL label matchers. User text never becomes query text except
through these functions, which quote it as a PromQL string literal."""
from __future__ import annotations

import re
from typing import Iterable

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}


def escape_label_value(value: str) -> str:
    """`value` as the inside of a double-quoted PromQL string (backslash, quote, newline)."""
    return "".join(_ESCAPES.get(ch, ch) for ch in str(value))


def quote(value: str) -> str:
    return f'"{escape_label_value(value)}"'


def equals_any(values: Iterable[str]) -> str:
    """The right-hand side of `label=~...` matching exactly one of `values` (RE2-escaped,
    then string-escaped), e.g. `"gpu\\\\.node-1|ib-sw-01"`."""
    alternatives = sorted({re.escape(str(v)) for v in values})
    return quote("|".join(alternatives)) if alternatives else '""'
