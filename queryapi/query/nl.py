"""Natural language -> registered query: extraction, catalog matching, then (optionally)
an LLM's refinement, which is validated like any other input and may only name a
registered query."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .words import expand_shorthand
from .extract import Extraction, Vocabulary, extract
from .matcher import Match, Matcher
from .registry import Registry, default_registry

log = logging.getLogger("fabricscope.queryapi.query")


@dataclass
class Interpretation:
    match: Match
    extraction: Extraction
    llm: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        body = self.match.to_dict()
        body["extracted"] = self.extraction.to_dict()
        if self.llm:
            body["llm"] = self.llm
        return body


class Interpreter:
    def __init__(self, registry: Registry | None = None, refiner=None) -> None:
        self.registry = registry or default_registry()
        self.matcher = Matcher(self.registry)
        self.refiner = refiner   # llm.Refiner or None

    def interpret(self, message: str, vocabulary: Vocabulary | None = None,
                  previous: dict[str, Any] | None = None) -> Interpretation:
        message = expand_shorthand(message)
        extraction = extract(message, vocabulary)
        match = self.matcher.match(message, extraction, previous)
        result = Interpretation(match, extraction)
        # An action, an unknown name or a constraint no query takes is refused whatever a
        # model would pick: the contract is not the LLM's to relax.
        refused = match.actions or match.unknown_names or match.unsupported
        if self.refiner is not None and self.refiner.available() and not refused:
            result.llm = self.refiner.refine(message, extraction.slots, match.to_dict(), previous)
            if result.llm.get("used"):
                # Validated by the registry already; the deterministic pick stays as an alternative.
                if match.query_name and match.query_name != result.llm["query_name"]:
                    match.alternatives.insert(0, {"query_name": match.query_name, "score": round(match.score, 2)})
                match.query_name = result.llm["query_name"]
                match.params = result.llm["params"]
                match.missing, match.invalid = [], {}
        return result
