"""The PromQL literal writers, shared with the chaos engine's live merge: fabricscope/promql.py."""
from fabricscope.promql import UnencodableValue, equals_any, escape_label_value, quote

__all__ = ["UnencodableValue", "equals_any", "escape_label_value", "quote"]
