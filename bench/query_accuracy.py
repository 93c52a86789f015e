"""Deterministic NL accuracy: every question of bench/query_eval.yaml through extraction and
catalog matching (no LLM), exact match of query name + validated parameters, and the
per-question latency. Targets: >= 90 % exact match, p99 <= 20 ms.

    python bench/query_accuracy.py [--verbose]
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

EVAL_SET = Path(__file__).with_name("query_eval.yaml")
ACCURACY_TARGET = 0.90
P99_TARGET_MS = 20.0


def evaluate(path: Path = EVAL_SET, verbose: bool = False) -> dict:
    data = yaml.safe_load(path.read_text())
    vocabulary = Vocabulary(data["vocabulary"]["hosts"], data["vocabulary"]["devices"])
    registry = default_registry()
    interpreter = Interpreter(registry)
    total = correct = 0
    latencies = []
    misses = []
    for conversation in data["conversations"]:
        previous = None
        for turn in conversation:
            expected = (turn["query"], registry.validate(turn["query"], turn.get("params") or {}))
            start = time.perf_counter()
            match = interpreter.interpret(turn["q"], vocabulary, previous).match
            latencies.append((time.perf_counter() - start) * 1000)
            got = (match.query_name, match.params)
            total += 1
            if got == expected:
                correct += 1
            else:
                misses.append((turn["q"], expected, got))
            if match.query_name:
                previous = {"query_name": match.query_name, "params": match.params}
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(round(0.99 * len(latencies))) - 1)]
    if verbose:
        for question, expected, got in misses:
            print(f"MISS {question!r}\n     expected {expected}\n     got      {got}")
    return {"questions": total, "correct": correct, "accuracy": correct / total,
            "p50_ms": statistics.median(latencies), "p99_ms": p99, "max_ms": latencies[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print every miss")
    args = parser.parse_args(argv)
    # Warm-up: compiled patterns and typo caches are per process, like in the sidecar.
    evaluate()
    result = evaluate(verbose=args.verbose)
    print(f"query accuracy (deterministic, no LLM): {result['correct']}/{result['questions']} exact "
          f"= {result['accuracy']:.1%} (target >= {ACCURACY_TARGET:.0%})")
    print(f"query latency per question: p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms, "
          f"max {result['max_ms']:.2f} ms (target p99 <= {P99_TARGET_MS:.0f} ms)")
    ok = result["accuracy"] >= ACCURACY_TARGET and result["p99_ms"] <= P99_TARGET_MS
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
