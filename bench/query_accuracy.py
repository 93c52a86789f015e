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
figure only.

    python bench/query_accuracy.py [--verbose] [--part dev|heldout] [--write-docs docs/query.md]

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
from fabricscope.queryapi.query.registry import default_registry

OPERATORS = Path(__file__).with_name("query_eval_operators.yaml")
TUNED = Path(__file__).with_name("query_eval.yaml")
SESSION_TURNS = 10
TARGETS = {"right query and parameters": 0.90, "abstained": 0.90, "p99_ms": 20.0}


def vocabulary_of(cluster: dict) -> Vocabulary:
    return Vocabulary(cluster.get("hosts", []), cluster.get("devices", []), racks=cluster.get("racks", []),
                      pdus=cluster.get("pdus", []), services=cluster.get("services", []),
                      clusters=cluster.get("clusters", []), jobs=cluster.get("jobs", {}))


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(round(0.99 * len(ordered))) - 1)]


def score(items: list[dict], vocabulary: Vocabulary, interpreter: Interpreter, session: bool,
          misses: list | None = None) -> dict:
    registry = interpreter.registry
    answerable = [item for item in items if not item.get("abstain")]
    right_query = right_params = abstained_right = abstained_wrong = 0
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
        band = bands.setdefault(min(0.9, int(match.confidence * 5) / 5), [])
        if item.get("abstain"):
            band.append(match.query_name is None)
            if match.query_name is None:
                abstained_right += 1
            elif misses is not None:
                misses.append((item["q"], "abstain", got))
            continue
        if match.query_name is None:
            abstained_wrong += 1
        expected = (item["query"], registry.validate(item["query"], item.get("params") or {}))
        right_query += got[0] == expected[0]
        right_params += got == expected
        # An abstention on an answerable question is wrong; an answer is right when exact.
        band.append(got == expected)
        if got != expected and misses is not None:
            misses.append((item["q"], expected, got))
    no_answer = len(items) - len(answerable)
    abstentions = abstained_right + abstained_wrong
    return {"questions": len(items), "answerable": len(answerable), "no_answer": no_answer,
            "right query": right_query / len(answerable),
            "right query and parameters": right_params / len(answerable),
            "abstained": abstained_right / no_answer if no_answer else 1.0,
            "abstention precision": abstained_right / abstentions if abstentions else 1.0,
            "p50_ms": statistics.median(latencies), "p99_ms": _p99(latencies),
            # Calibration: per confidence band (0-0.2, ..., 0.8-1), questions and the share the
            # layer got right (answered exactly above the floor, abstained rightly below it).
            "calibration": {f"{low:.1f}-{low + 0.2:.1f}": (len(hits), sum(hits) / len(hits))
                            for low, hits in sorted(bands.items())}}


def evaluate(part: str, path: Path = OPERATORS, verbose: bool = False) -> dict[str, dict]:
    data = yaml.safe_load(path.read_text())
    vocabulary = vocabulary_of(data["cluster"])
    interpreter = Interpreter(default_registry())
    results = {}
    for endpoint, session in (("parameters", False), ("conversation", True)):
        misses: list = []
        results[endpoint] = score(data[part], vocabulary, interpreter, session, misses)
        if verbose:
            for question, expected, got in misses:
                print(f"MISS [{part}/{endpoint}] {question!r}\n     expected {expected}\n     got      {got}")
    return results


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


def docs_table(results: dict[str, dict[str, dict]], frozen: dict[str, str]) -> str:
    rows = ["| part | endpoint | answerable / no answer | right query | right query and parameters | abstained "
            "(precision) | p50 / p99 (interpretation) |", "|---|---|---|---|---|---|---|"]
    for part, by_endpoint in results.items():
        for endpoint, r in by_endpoint.items():
            rows.append(f"| {part} (frozen {frozen[part]}) | {endpoint} | {r['answerable']} / {r['no_answer']} | "
                        f"{r['right query']:.1%} | {r['right query and parameters']:.1%} | {r['abstained']:.1%} "
                        f"({r['abstention precision']:.1%}) | {r['p50_ms']:.2f} / {r['p99_ms']:.2f} ms |")
    return "\n".join(rows)


def write_docs(doc: Path, table: str) -> None:
    # Imported here: tests load this file by path, without bench/ on sys.path, and never write.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from measure import replace_between_markers

    replace_between_markers(doc, BEGIN, END, table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print every miss")
    parser.add_argument("--part", choices=("dev", "heldout"), action="append", help="default: both")
    parser.add_argument("--write-docs", type=Path, help="write the table into this document's markers")
    args = parser.parse_args(argv)
    evaluate("dev")     # warm-up: compiled patterns and typo caches are per process, as in the sidecar
    frozen = yaml.safe_load(OPERATORS.read_text())["frozen"]
    ok = True
    results: dict[str, dict[str, dict]] = {}
    for part in args.part or ("dev", "heldout"):
        results[part] = evaluate(part, verbose=args.verbose)
        for endpoint, result in results[part].items():
            print(f"{part:8s} {endpoint:12s} ({result['answerable']} answerable, {result['no_answer']} with no answer; "
                  f"frozen {frozen[part]}): right query {result['right query']:.1%}, right query and parameters "
                  f"{result['right query and parameters']:.1%}, abstained {result['abstained']:.1%} "
                  f"(precision {result['abstention precision']:.1%}), p50 {result['p50_ms']:.2f} ms, "
                  f"p99 {result['p99_ms']:.2f} ms")
            print("         confidence bands (questions, share decided right): " + ", ".join(
                f"{band} {n} {share:.0%}" for band, (n, share) in result["calibration"].items()))
            if part == "heldout":
                ok &= all(result[key] >= target for key, target in TARGETS.items() if key != "p99_ms")
                ok &= result["p99_ms"] <= TARGETS["p99_ms"]
    if args.write_docs:
        write_docs(args.write_docs, docs_table(results, frozen))
    tuned = evaluate_tuned()
    print(f"regression (bench/query_eval.yaml, tuned on): {tuned['correct']}/{tuned['questions']} "
          f"= {tuned['accuracy']:.1%}")
    print("targets on held-out: right query and parameters >= 90%, abstained >= 90%, p99 <= 20 ms: "
          + ("met" if ok else "NOT met"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
