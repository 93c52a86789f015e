"""Catalog matching (phase one of NL, no LLM): pick the registered query a question means.

Each query's `terms` in queries.yaml weigh the words that point at it; a question scores
the sum of the terms it contains (words typo-corrected against the catalog's vocabulary),
plus a little for each extracted parameter the query can use and minus a little for a
required parameter nobody supplied. The best score wins above a floor; below it, a
conversation's previous query is reused (a follow-up such as "and for node-3?").

Abstention (the contract, contract.py). Nothing runs, and the answer says why, when the
question asks for an action ("restart", "drain": the layer only reads), names something the
cluster does not know, holds a word nothing explains (words.py: not a catalog term, plain
English or the fabric's nouns: "temperature", "bandwidth"), or names a constraint that
neither the best query, its variants, nor a query nearly as likely can take. Otherwise each
answer carries a confidence, a logistic function of the winning score, and below
CONFIDENCE_FLOOR nothing runs either; the answer lists the nearest queries with their
descriptions. bench/query_accuracy.py prints how well the confidence is calibrated.
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from .contract import untaken
from .extract import Extraction
from .params import ParamError
from .registry import QuerySpec, Registry
from .words import ACTIONS, DOMAIN as _DOMAIN, EXPLAINED as _EXPLAINED, FILLER as _FILLER, \
    OUT_OF_SCOPE, PLAIN as _PLAIN

MIN_SCORE = 1.5          # below this, nothing in the question names a query
CONSTRAINT_MARGIN = 1.0  # a query this close to the best may answer when it takes a constraint the best cannot
PARAM_BONUS = 0.75       # per extracted parameter the query accepts
MISSING_PENALTY = 1.0    # per required parameter with no value
# Confidence = logistic(SLOPE x (score - MIN_SCORE) - UNKNOWN_WEIGHT x unknown words
# - ACTION_WEIGHT x action verbs); answered when >= CONFIDENCE_FLOOR (fitted on dev).
SLOPE = 1.5
UNKNOWN_WEIGHT = 3.0
ACTION_WEIGHT = 4.0
CONFIDENCE_FLOOR = 0.5
# Slots that say something about the question (a window or limit fits almost any query).
_SPECIFIC = {"host", "device", "gpu", "comm", "ip", "service", "quantile", "severity", "rank", "field", "xid", "op",
             "cluster", "trace", "threshold", "state", "failure_type", "job", "port", "rack", "pdu"}
_ACTIONS = ACTIONS
# Words that may come before a request's verb ("please", "can you", "I need to").
_PRELUDE = frozenset("""please pls plz kindly can could would will you u go ahead just now then and also ok okay hey
yo hi so i we need want wanna to lets let us me quickly quick right""".split())
_FOLLOW_UP = re.compile(r"^\s*(?:and|also|what about|how about|same for|now|then|ok(?:ay)?|and what about)\b"
                        r"|^\s*(?:for|on|in)\s", re.I)
_WORD = re.compile(r"[a-z0-9]+")


@dataclass
class Match:
    query_name: str | None
    params: dict[str, Any] = field(default_factory=dict)
    score: float = 0.0
    missing: list[str] = field(default_factory=list)
    invalid: dict[str, str] = field(default_factory=dict)
    follow_up: bool = False
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    confidence: float = 0.0
    abstained: bool = False
    unexplained: list[str] = field(default_factory=list)   # words no query explains
    # Why nothing ran, besides unexplained words: constraints the question names that no
    # registered query can take (slot -> value), names the cluster does not know (name ->
    # close known names), and action verbs (the layer only reads).
    unsupported: dict[str, Any] = field(default_factory=dict)
    unknown_names: dict[str, list[str]] = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)
    # Constraints named that the answer covers whole, said with it ("late to the allreduce":
    # arrival lag has no per-collective breakdown).
    covered: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"query_name": self.query_name, "params": self.params, "score": round(self.score, 2),
                "confidence": round(self.confidence, 2), "abstained": self.abstained,
                "missing": self.missing, "invalid": self.invalid, "follow_up": self.follow_up,
                "alternatives": self.alternatives, **({"unexplained": self.unexplained} if self.unexplained else {}),
                **({"unsupported": self.unsupported} if self.unsupported else {}),
                **({"unknown_names": self.unknown_names} if self.unknown_names else {}),
                **({"refused_actions": self.actions} if self.actions else {}),
                **({"covered_not_split": self.covered} if self.covered else {})}


def confidence(score: float, unknown: int, actions: int) -> float:
    z = SLOPE * (score - MIN_SCORE) - UNKNOWN_WEIGHT * unknown - ACTION_WEIGHT * actions
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


class Matcher:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.vocabulary = sorted({word for q in registry.queries.values() for term in q.terms
                                  for word in term.split()})
        self._vocab_set = set(self.vocabulary)
        self._stems: dict[str, list[str]] = {}
        for word in self.vocabulary:
            if len(word) >= 4 and word.isalpha():
                self._stems.setdefault(word[:4], []).append(word)
        self._anagrams: dict[tuple[str, str], list[str]] = {}
        for word in self.vocabulary:
            if 3 <= len(word) <= 4 and word.isalpha():
                self._anagrams.setdefault((word[0], "".join(sorted(word))), []).append(word)
        self._correct = lru_cache(maxsize=4096)(self._correct_word)
        self._plain_word = lru_cache(maxsize=4096)(self._plain_word)

    def _correct_word(self, word: str) -> str:
        """A typo of a catalog word ("slowets"), or a form of one ("laggards" of "lagging",
        "retransmitting" of "retransmit"), as that word; any other word as it is."""
        if (word in self._vocab_set or word in _PLAIN or word in OUT_OF_SCOPE or word in ACTIONS or len(word) < 3
                or not word.isalpha()):
            return word
        if len(word) < 5:
            # A short word's typo is two letters swapped ("xdi", "prot"): the same letters,
            # the same first one, and one catalog word only.
            swapped = self._anagrams.get((word[0], "".join(sorted(word))), [])
            return swapped[0] if len(swapped) == 1 and word not in _FILLER and word not in _DOMAIN else word
        # A typo keeps its first letter and about its length ("hnags"), so "using" is not
        # read as "causing" nor "burning" as "bouncing".
        close = [c for c in difflib.get_close_matches(word, self.vocabulary, n=3, cutoff=0.8)
                 if c[0] == word[0] and abs(len(c) - len(word)) <= (2 if len(word) >= 8 else 1)]
        if close:
            return close[0]
        return self._form_of(word) or word

    def _form_of(self, word: str) -> str | None:
        """The catalog word sharing the longest stem with `word`: at least 4 letters and
        3/4 of the shorter word ("laggards" -> "lagging", "retransmissions" -> "retransmits")."""
        best, best_len = None, 0
        for term in self._stems.get(word[:4], ()):
            shared = len(_common_prefix(word, term))
            if shared >= len(word.rstrip("s")) and len(term) >= shared + 3:
                continue     # a whole word inside a longer one ("times" in "timeline") is another word
            if shared >= 4 and shared >= 0.75 * min(len(word), len(term)) and shared > best_len:
                best, best_len = term, shared
        return best

    def normalise(self, message: str) -> tuple[str, set[str]]:
        lowered = _CONTRACTION.sub(lambda m: _CONTRACTIONS[m.group(1)], message.lower())
        words = [self._correct(w) for w in _WORD.findall(lowered)]
        return " " + " ".join(words) + " ", set(words)

    def term_score(self, spec: QuerySpec, text: str, words: set[str]) -> float:
        score = 0.0
        for term, weight in spec.terms.items():
            if (" " in term and f" {term} " in text) or term in words:
                score += weight
        return score

    def fill(self, spec: QuerySpec, slots: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The query's raw parameters from extracted slots, and how many specific ones it used."""
        params: dict[str, Any] = {}
        used = 0
        for name, pspec in spec.params.items():
            sources = [name] + list(pspec.nl_from)
            for source in sources:
                if source in slots:
                    params[name] = slots[source]
                    used += source in _SPECIFIC
                    break
        return params, used

    def rank(self, message: str, extraction: Extraction) -> list[tuple[float, float, QuerySpec]]:
        text, words = self.normalise(message)
        ranked = []
        for spec in self.registry.queries.values():
            terms = self.term_score(spec, text, words)
            if terms <= 0:
                continue
            params, used = self.fill(spec, extraction.slots)
            missing = sum(1 for n, p in spec.params.items() if p.required and n not in params)
            ranked.append((terms + PARAM_BONUS * used - MISSING_PENALTY * missing, terms, spec))
        ranked.sort(key=lambda item: (-item[0], item[2].name))
        return ranked

    def unexplained(self, message: str, extraction: Extraction) -> tuple[list[str], list[str]]:
        """(unknown words, action words) of the question, outside what extraction took
        (names, numbers, windows): the words no registered query explains."""
        chars = list(message[:2000])
        for _, start, end in extraction.spans:
            chars[start:end] = " " * (end - start)
        _, words = self.normalise("".join(chars))
        actions = self._requested_actions(message)
        # A number no pattern took ("xdi 79") would be a constraint dropped: it is named.
        unknown = sorted(w for w in words if w in OUT_OF_SCOPE or w.isdigit() or (
            len(w) >= 3 and w.isalpha() and w not in self._vocab_set and w not in actions
            and not self._plain_word(w) and not (w.endswith("s") and (w[:-1] in self._vocab_set or w[:-1] in _DOMAIN))))
        return unknown, actions

    def _requested_actions(self, message: str) -> list[str]:
        """Action verbs used as requests: first after a courtesy ("please drain", "could you
        restart", "and silence them") or after "to" ("I need to reboot"). "pod restarts"
        or "why did it reboot" ask about an action: words like any other, none explains."""
        tokens = _WORD.findall(message.lower())
        found = []
        for i, token in enumerate(tokens):
            if (token in _ACTIONS or self._action_typo(token)) and (
                    all(t in _PRELUDE for t in tokens[:i]) or (i and tokens[i - 1] in ("to", "please", "then"))):
                found.append(token)
        return sorted(set(found))

    @staticmethod
    def _action_typo(word: str) -> bool:
        """A typo of an action verb ("restrat") is still a request for an action."""
        if len(word) < 5 or word in _PLAIN or word in _FILLER or word in _DOMAIN:
            return False
        close = difflib.get_close_matches(word, sorted(ACTIONS), n=1, cutoff=0.85)   # "drawn" is not "drain"
        return bool(close) and close[0][0] == word[0] and len(close[0]) == len(word)

    def _plain_word(self, word: str) -> bool:
        """English that carries no topic, or a typo of it ("whcih", "anythign")."""
        if word in _PLAIN or word in _DOMAIN or word in _FILLER:
            return True
        if len(word) < 4:
            return False
        # A typo keeps its first letter and about its length: only those are compared.
        # Short words keep their length ("whcih"): "users" is not a typo of "uses".
        close = difflib.get_close_matches(word, _EXPLAINED.get(word[0], ()), n=1, cutoff=0.8)
        return bool(close) and abs(len(close[0]) - len(word)) <= (1 if len(word) >= 7 else 0)

    def nearest(self, ranked: list, message: str) -> list[dict[str, Any]]:
        """Two or three queries closest to a question none answers: by score, then by the
        words the question shares with their descriptions."""
        near = [(spec, round(score, 2)) for score, _, spec in ranked[:3]]
        if len(near) < 2:
            _, words = self.normalise(message)
            words -= _PLAIN
            overlap = sorted(((len(words & set(_words(spec.description))), spec.name) for spec in
                              self.registry.queries.values() if spec.name not in {s.name for s, _ in near}),
                             reverse=True)
            near += [(self.registry.get(name), 0.0) for shared, name in overlap[:3 - len(near)] if shared]
        return [{"query_name": spec.name, "score": score, "description": spec.description} for spec, score in near]

    def match(self, message: str, extraction: Extraction, previous: dict[str, Any] | None = None) -> Match:
        ranked = self.rank(message, extraction)
        alternatives = [{"query_name": spec.name, "score": round(score, 2)} for score, _, spec in ranked[1:4]]
        unknown, actions = self.unexplained(message, extraction)
        # The contract (contract.py): an action is refused, an unknown name is named, a word
        # nothing explains is named; in each case nothing runs.
        if actions or extraction.unknown or unknown:
            return Match(None, confidence=confidence(ranked[0][0] if ranked else 0.0, len(unknown), len(actions)),
                         abstained=True, unexplained=[*actions, *unknown], actions=actions,
                         unknown_names=dict(extraction.unknown), alternatives=self.nearest(ranked, message))
        looks_like_follow_up = bool(_FOLLOW_UP.match(message)) and not actions
        best_terms = ranked[0][1] if ranked else 0.0
        best = ranked[0][0] if ranked else 0.0
        same_query = bool(ranked) and previous is not None and ranked[0][2].name == previous.get("query_name")
        if previous and previous.get("query_name") in self.registry and (looks_like_follow_up or not (
                unknown or actions)) and (
                not ranked or best < MIN_SCORE
                or (looks_like_follow_up and (best_terms < 2.0 or same_query))):
            spec = self._honouring(self.registry.get(previous["query_name"]), extraction)
            if isinstance(spec, Match):
                return spec
            params, _ = self.fill(spec, extraction.slots)
            merged = {k: v for k, v in {**previous.get("params", {}), **params}.items() if k in spec.params}
            result = self._validated(spec, merged, best, alternatives)
            result.covered = _covered(spec, extraction)
            result.follow_up = True
            # A follow-up is as sure as its reading as one: what it adds is only parameters.
            result.confidence = confidence(MIN_SCORE + 1.0, len(unknown), 0)
            return result
        sure = confidence(best, len(unknown), len(actions))
        if not ranked or best < MIN_SCORE or sure < CONFIDENCE_FLOOR:
            return Match(None, confidence=sure, abstained=True, unexplained=[*actions, *unknown],
                         alternatives=self.nearest(ranked, message))
        score, _, spec = ranked[0]
        spec = self._honouring(spec, extraction, ranked, message)
        if isinstance(spec, Match):
            spec.confidence = sure
            return spec
        params, _ = self.fill(spec, extraction.slots)
        result = self._validated(spec, params, score, alternatives)
        result.confidence = sure
        result.covered = _covered(spec, extraction)
        return result

    def _honouring(self, spec: QuerySpec, extraction: Extraction, ranked: list | None = None,
                   message: str = "") -> QuerySpec | Match:
        """`spec` if it takes every constraint the question names, else the first of its
        variants that does, else an abstention naming what no registered query takes."""
        left = untaken(spec, extraction)
        if not left:
            return spec
        for name in spec.variants:
            variant = self.registry.get(name)
            if not untaken(variant, extraction):
                return variant
        # A query nearly as likely that takes them all: the question's constraint decides.
        for score, terms, other in (ranked or [])[1:]:
            if score < ranked[0][0] - CONSTRAINT_MARGIN or terms < MIN_SCORE:
                break
            if not untaken(other, extraction):
                return other
        closest = [spec, *(self.registry.get(name) for name in spec.variants)]
        near = [{"query_name": q.name, "score": 0.0, "description": q.description} for q in closest]
        near += [n for n in self.nearest(ranked or [], message) if n["query_name"] not in {q.name for q in closest}]
        return Match(None, abstained=True, unsupported=left, alternatives=near[:4])

    def _validated(self, spec: QuerySpec, params: dict[str, Any], score: float,
                   alternatives: list[dict[str, Any]]) -> Match:
        """Validate each parameter alone: a bad one is reported and dropped, the rest kept."""
        good: dict[str, Any] = {}
        invalid: dict[str, str] = {}
        for name, value in params.items():
            try:
                good[name] = self.registry.validate(spec.name, {**_required_stubs(spec, name), name: value})[name]
            except ParamError as exc:
                if exc.param == name:
                    invalid[name] = exc.message
        if invalid:
            # A value its type refuses ("the last 45 days" past the longest window) is not
            # quietly replaced by the default: nothing runs, the answer says why.
            return Match(None, {}, score, [], invalid, abstained=True, alternatives=[
                {"query_name": spec.name, "score": round(score, 2), "description": spec.description}])
        missing = [n for n, p in spec.params.items() if p.required and n not in good]
        final = {}
        if not missing:
            final = self.registry.validate(spec.name, good)
        else:
            final = good
        return Match(spec.name, final, score, missing, invalid, alternatives=alternatives)


_CONTRACTIONS = {"n't": " not", "'s": " is", "'re": " are", "'ve": " have", "'ll": " will", "'d": " would"}
_CONTRACTION = re.compile(r"(n't|'s|'re|'ve|'ll|'d)\b")


def _covered(spec: QuerySpec, extraction: Extraction) -> dict[str, Any]:
    return {slot: extraction.slots[slot] for slot in spec.covers
            if slot in extraction.slots and slot not in spec.params}


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _required_stubs(spec: QuerySpec, except_name: str) -> dict[str, Any]:
    """Placeholder values so one parameter can be validated without the others."""
    stubs = {"host": "x", "device": "x", "ip": "127.0.0.1", "comm": "0" * 16, "name": "x", "text": "x"}
    return {n: stubs.get(p.type, 1) for n, p in spec.params.items()
            if p.required and n != except_name}
