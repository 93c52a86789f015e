"""Natural-language accuracy without an LLM, on questions the layer was not tuned to.

bench/query_eval_operators.yaml holds operator questions in two parts, `dev` (tuned on)
and `heldout` (never tuned on), each with questions that no registered query answers.
Each part is scored twice, as the two endpoints ask:

- parameters: each question alone (GET /ai/query/parameters);
- conversation: the questions in 10-turn sessions, each turn seeing the previous one
  (POST /ai/query/conversation): an unrelated question must not be read as a follow-up.

It prints, per part and endpoint: the right query, the right query with the right
parameters (registry defaults added), abstention on the questions with no answer (and its
precision: of all abstentions, how many were right to), and the per-question latency.
The older set bench/query_eval.yaml (tuned on, follow-ups) is reported as a regression
figure only. bench/query_eval_fresh.yaml (part `fresh`) is a batch written and frozen
before the answer contract's tuning, in another style (shorthand, typos, chat), with
out-of-scope questions, action requests, unknown names and constraints no query takes.
Each part also prints "exact" (right answer or rightly named abstention), "constraints
dropped" (a constraint the question names that an answer which ran does not filter by) and
abstention recall and precision.

    python bench/query_accuracy.py [--verbose] [--part dev|heldout|fresh] [--write-docs docs/query.md]

--write-docs puts the table of this run between the markers of docs/query.md.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import yaml

from fabricscope.queryapi.query.extract import Vocabulary
from fabricscope.queryapi.query.nl import Interpreter
from fabricscope.queryapi.query.params import ParamError
from fabricscope.queryapi.query.registry import UnknownQuery, default_registry, load_registry

OPERATORS = Path(__file__).with_name("query_eval_operators.yaml")
TUNED = Path(__file__).with_name("query_eval.yaml")
FRESH = Path(__file__).with_name("query_eval_fresh.yaml")
SESSION_TURNS = 10
TARGETS = {"right query and parameters": 0.90, "abstained": 0.90, "abstention precision": 0.90,
           "exact": 0.90, "p99_ms": 20.0}


def vocabulary_of(cluster: dict) -> Vocabulary:
    # As the sidecar builds it with a chaos topology: the topology's devices include the hosts.
    hosts = cluster.get("hosts", [])
    return Vocabulary(hosts, [*cluster.get("devices", []), *hosts], racks=cluster.get("racks", []),
                      pdus=cluster.get("pdus", []), services=cluster.get("services", []),
                      clusters=cluster.get("clusters", []), jobs=cluster.get("jobs", {}))


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(round(0.99 * len(ordered))) - 1)]


# Parameters that narrow what a question is about: a named one that the answer does not
# filter by is a constraint dropped (the answer would look like the answer to the question).
CONSTRAINTS = ("window", "host", "device", "job", "rank", "comm", "trace", "op", "cluster", "gpu", "port", "service",
               "xid", "ip")


def expects_abstention(item: dict) -> bool:
    return bool(item.get("abstain") or item.get("refuse") or item.get("unknown"))


def decided_right(item: dict, match, expected: tuple | None) -> bool:
    """An abstention is right when nothing ran and the answer names what it must (the
    constraint no query takes, the unknown name, the refused action); an answer is right
    when its query and parameters are exactly the expected ones."""
    if not expects_abstention(item):
        return (match.query_name, match.params) == expected
    if match.query_name is not None:
        return False
    if item.get("action") and not match.actions:
        return False
    if any(slot not in match.unsupported for slot in item.get("refuse") or ()):
        return False
    return all(name in match.unknown_names for name in item.get("unknown") or ())


def dropped_constraints(item: dict, match, expected: tuple | None) -> list[str]:
    """The constraints the question names that an answer that ran does not filter by."""
    if match.query_name is None:
        return []
    values = {str(v) for v in match.params.values()}
    if expected is not None:
        named = {k: v for k, v in expected[1].items() if k in CONSTRAINTS and k in (item.get("params") or {})}
        return [k for k, v in named.items() if str(v) not in values]
    return [*(item.get("refuse") or ()), *(n for n in item.get("unknown") or () if n not in values)]


def _expected_params(registry, item: dict) -> dict:
    """The expected parameters with the registry's defaults (as written when the registry
    cannot take them: a catalog older than the question scores it wrong, not an error)."""
    try:
        return registry.validate(item["query"], item.get("params") or {})
    except (ParamError, UnknownQuery):
        return dict(item.get("params") or {})


def score(items: list[dict], vocabulary: Vocabulary, interpreter: Interpreter, session: bool,
          misses: list | None = None) -> dict:
    registry = interpreter.registry
    answerable = [item for item in items if not expects_abstention(item)]
    right_query = right_params = abstained_right = abstained_wrong = exact = 0
    dropped: list[tuple[str, list[str]]] = []
    latencies = []
    bands: dict[float, list[bool]] = {}      # confidence band -> was the decision right
    previous = None
    for turn, item in enumerate(items):
        if not session or turn % SESSION_TURNS == 0:
            previous = None
        start = time.perf_counter()
        match = interpreter.interpret(item["q"], vocabulary, previous).match
        latencies.append((time.perf_counter() - start) * 1000)
        if session and match.query_name:
            previous = {"query_name": match.query_name, "params": match.params}
        got = (match.query_name, match.params)
        expected = None if expects_abstention(item) else (item["query"], _expected_params(registry, item))
        right = decided_right(item, match, expected)
        exact += right
        lost = dropped_constraints(item, match, expected)
        if lost:
            dropped.append((item["q"], lost))
        band = bands.setdefault(min(0.9, int(match.confidence * 5) / 5), [])
        band.append(right)
        if expects_abstention(item):
            abstained_right += match.query_name is None
        else:
            abstained_wrong += match.query_name is None
            right_query += got[0] == expected[0]
            right_params += got == expected
        if not right and misses is not None:
            misses.append((item["q"], expected or {k: item[k] for k in ("abstain", "refuse", "unknown", "action")
                                                   if k in item}, got, match))
    no_answer = len(items) - len(answerable)
    abstentions = abstained_right + abstained_wrong
    return {"questions": len(items), "answerable": len(answerable), "no_answer": no_answer,
            "exact": exact / len(items),
            "right query": right_query / len(answerable),
            "right query and parameters": right_params / len(answerable),
            "constraints dropped": sum(len(lost) for _, lost in dropped), "dropped": dropped,
            "abstained": abstained_right / no_answer if no_answer else 1.0,
            "abstention precision": abstained_right / abstentions if abstentions else 1.0,
            "p50_ms": statistics.median(latencies), "p99_ms": _p99(latencies),
            # Calibration: per confidence band (0-0.2, ..., 0.8-1), questions and the share the
            # layer got right (answered exactly above the floor, abstained rightly below it).
            "calibration": {f"{low:.1f}-{low + 0.2:.1f}": (len(hits), sum(hits) / len(hits))
                            for low, hits in sorted(bands.items())}}


def evaluate(part: str, path: Path = OPERATORS, verbose: bool = False,
             interpreter: Interpreter | None = None) -> dict[str, dict]:
    """Score one part of an evaluation file (`dev`, `heldout`, or the fresh batch's
    `questions`) on both endpoints."""
    data = yaml.safe_load(path.read_text())
    vocabulary = vocabulary_of(data["cluster"])
    interpreter = interpreter or Interpreter(default_registry())
    results = {}
    for endpoint, session in (("parameters", False), ("conversation", True)):
        misses: list = []
        results[endpoint] = score(data[part], vocabulary, interpreter, session, misses)
        if verbose:
            for question, expected, got, match in misses:
                print(f"MISS [{part}/{endpoint}] {question!r}\n     expected {expected}\n     got      {got}"
                      f"  {_why(match)}")
    return results


def _why(match) -> str:
    said = {"unexplained": match.unexplained, "unsupported": match.unsupported, "unknown": match.unknown_names,
            "actions": match.actions}
    return " ".join(f"{k}={v}" for k, v in said.items() if v)


def evaluate_tuned(path: Path = TUNED) -> dict:
    """The older, tuned-on set with its follow-up conversations: a regression figure."""
    data = yaml.safe_load(path.read_text())
    vocabulary = Vocabulary(data["vocabulary"]["hosts"], data["vocabulary"]["devices"])
    interpreter = Interpreter(default_registry())
    total = correct = 0
    for conversation in data["conversations"]:
        previous = None
        for turn in conversation:
            expected = (turn["query"], interpreter.registry.validate(turn["query"], turn.get("params") or {}))
            match = interpreter.interpret(turn["q"], vocabulary, previous).match
            total += 1
            correct += (match.query_name, match.params) == expected
            if match.query_name:
                previous = {"query_name": match.query_name, "params": match.params}
    return {"questions": total, "correct": correct, "accuracy": correct / total}


BEGIN, END = "<!-- query-accuracy:begin -->", "<!-- query-accuracy:end -->"
PARTS = {"dev": (OPERATORS, "dev"), "heldout": (OPERATORS, "heldout"), "fresh": (FRESH, "questions")}


def docs_table(results: dict[str, dict[str, dict]], frozen: dict[str, str]) -> str:
    rows = ["| part | endpoint | answerable / no answer | exact | right query and parameters | constraints dropped "
            "| abstention recall / precision | p50 / p99 (interpretation) |", "|---|---|---|---|---|---|---|---|"]
    for part, by_endpoint in results.items():
        for endpoint, r in by_endpoint.items():
            rows.append(f"| {part} (frozen {frozen[part]}) | {endpoint} | {r['answerable']} / {r['no_answer']} | "
                        f"{r['exact']:.1%} | {r['right query and parameters']:.1%} | {r['constraints dropped']} | "
                        f"{r['abstained']:.1%} / {r['abstention precision']:.1%} | "
                        f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} ms |")
    return "\n".join(rows)


def write_docs(doc: Path, table: str) -> None:
    # Imported here: tests load this file by path, without bench/ on sys.path, and never write.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from measure import replace_between_markers

    replace_between_markers(doc, BEGIN, END, table)


def targets_met(part: str, result: dict) -> bool:
    """Held-out parts (never tuned on before their scoring): the issue's targets."""
    if part == "dev":
        return True
    met = result["constraints dropped"] == 0 and result["p99_ms"] <= TARGETS["p99_ms"]
    if part == "heldout":
        return met and all(result[key] >= TARGETS[key]
                           for key in ("right query and parameters", "abstained", "abstention precision"))
    return met and result["exact"] >= TARGETS["exact"]


def frozen_times() -> dict[str, str]:
    frozen = dict(yaml.safe_load(OPERATORS.read_text())["frozen"])
    frozen["fresh"] = yaml.safe_load(FRESH.read_text())["frozen"]
    return frozen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print every miss")
    parser.add_argument("--part", choices=tuple(PARTS), action="append", help="default: all")
    parser.add_argument("--write-docs", type=Path, help="write the table into this document's markers")
    parser.add_argument("--registry", type=Path, help="score another queries.yaml (e.g. an older commit's)")
    args = parser.parse_args(argv)
    interpreter = Interpreter(load_registry(args.registry) if args.registry else default_registry())
    evaluate("dev", interpreter=interpreter)     # warm-up: compiled patterns and typo caches are per process
    frozen = frozen_times()
    ok = True
    results: dict[str, dict[str, dict]] = {}
    for part in args.part or tuple(PARTS):
        path, key = PARTS[part]
        results[part] = evaluate(key, path, verbose=args.verbose, interpreter=interpreter)
        for endpoint, result in results[part].items():
            print(f"{part:8s} {endpoint:12s} ({result['answerable']} answerable, {result['no_answer']} with no answer; "
                  f"frozen {frozen[part]}): exact {result['exact']:.1%}, right query {result['right query']:.1%}, "
                  f"right query and parameters {result['right query and parameters']:.1%}, "
                  f"constraints dropped {result['constraints dropped']}, abstention recall {result['abstained']:.1%} "
                  f"precision {result['abstention precision']:.1%}, p50 {result['p50_ms']:.2f} ms, "
                  f"p99 {result['p99_ms']:.2f} ms")
            for question, lost in result["dropped"]:
                print(f"         dropped {', '.join(lost)}: {question!r}")
            print("         confidence bands (questions, share decided right): " + ", ".join(
                f"{band} {n} {share:.0%}" for band, (n, share) in result["calibration"].items()))
            ok &= targets_met(part, result)
    if args.write_docs:
        write_docs(args.write_docs, docs_table(results, frozen))
    tuned = evaluate_tuned()
    print(f"regression (bench/query_eval.yaml, tuned on): {tuned['correct']}/{tuned['questions']} "
          f"= {tuned['accuracy']:.1%}")
    print("targets: held-out right query and parameters >= 90%, abstention recall and precision >= 90%; fresh exact "
          ">= 90%; constraints dropped 0 and p99 <= 20 ms on both: " + ("met" if ok else "NOT met"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
