"""OpenAPI helpers for handlers that parse their own body."""
from __future__ import annotations

from typing import Callable

from apiflask.scaffold import _annotate


def documented_body(model, content_types: str | list[str] = "application/json") -> Callable:
    """Put `model` in the OpenAPI document as the request body without validating it
    up front: the handler validates item by item (a batch keeps its good items). The
    declared content types are also what the app accepts (415 otherwise)."""
    def decorator(view: Callable) -> Callable:
        _annotate(view, body=model, content_type=content_types)
        return view
    return decorator
