"""The one way a value enters PromQL text: as a double-quoted string literal.

PromQL string literals follow Go's quoting rules (strconv.Unquote). Escaping the
backslash and the double quote is what keeps a value inside its literal; control
characters are written as escapes so a value can never end a line of the query either.
Every label value of every registered query goes through `promql_string`; nothing else
in this package writes user-supplied text into a query.
"""
from __future__ import annotations

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
    """The body of a PromQL double-quoted literal whose decoded value is exactly `value`."""
    if not isinstance(value, str):
        raise TypeError(f"label values are strings, got {type(value).__name__}")
    return "".join(_escape_char(char) for char in value)


def promql_string(value: str) -> str:
    """`value` as a complete PromQL string literal, quotes included."""
    return f'"{escape_label_value(value)}"'
