"""Writing values into PromQL. User text never becomes query text except through these
functions, which write it as a PromQL double-quoted string literal. (Shared plumbing, not
the sidecar's own: any component that writes a label value into a query writes it here;
today the sidecar's registered queries and its trace correlation.)

PromQL string literals follow Go's quoting rules (strconv.Unquote). Escaping the backslash
and the double quote keeps a value inside its literal; control characters are written as
escapes so a value can never end a line of the query either. Property-tested in
tests/test_query_escaping.py, and round-tripped through a real Prometheus in
tests/test_query_prometheus.py.
"""
from __future__ import annotations

import re
from typing import Iterable

_SIMPLE = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class UnencodableValue(ValueError):
    """A value no PromQL literal can carry (a lone UTF-16 surrogate is not a character)."""


def _escape_char(char: str) -> str:
    simple = _SIMPLE.get(char)
    if simple is not None:
        return simple
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:
        raise UnencodableValue(f"lone surrogate U+{code:04X} is not a character")
    # C0/C1 controls and DEL: legal inside a Go literal only as escapes.
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return f"\\u{code:04x}"
    return char


def escape_label_value(value: str) -> str:
    """The inside of a double-quoted PromQL literal whose decoded value is exactly `value`."""
    return "".join(_escape_char(char) for char in str(value))


def quote(value: str) -> str:
    """`value` as a complete PromQL string literal, quotes included."""
    return f'"{escape_label_value(value)}"'


def equals_any(values: Iterable[str]) -> str:
    """The right-hand side of `label=~...` matching exactly one of `values` (RE2-escaped,
    then string-escaped), e.g. `"gpu\\\\.node-1|ib-sw-01"`."""
    alternatives = sorted({re.escape(str(v)) for v in values})
    return quote("|".join(alternatives)) if alternatives else '""'
