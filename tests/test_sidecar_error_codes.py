"""The error codes in docs/sidecar.md are the ones the code raises, each explained."""
from __future__ import annotations

from pathlib import Path

from fabricscope.queryapi import error_codes

DOC = Path(__file__).resolve().parent.parent / "docs" / "sidecar.md"


def test_every_raised_code_is_explained_and_every_explained_code_is_raised():
    found = error_codes.scan()
    assert set(found) - set(error_codes.MEANINGS) == set(), "codes raised without a meaning in error_codes.MEANINGS"
    assert set(error_codes.MEANINGS) - set(found) == set(), "MEANINGS holds codes that nothing raises"


def test_the_scan_sees_calls_spread_over_lines_and_f_string_codes():
    found = error_codes.scan()
    assert found["chaos_rate_limited"] == {429}                       # a call over three lines
    assert found["prometheus_timeout"] == {504}                       # f"prometheus_{exc.reason}"
    assert found["chaos_invalid_device"] == {422}                     # f"chaos_invalid_{exc.field}"
    assert found["invalid_session_id"] == {422}                       # ToolError(status, code, ...)
    meshql = (error_codes.PACKAGE / "query" / "meshql.py").read_text()
    assert all(f'"{code}"' in meshql for code in error_codes.FROM_BODIES)


def test_the_docs_table_is_the_generated_one():
    text = DOC.read_text()
    table = text.split(error_codes.BEGIN)[1].split(error_codes.END)[0].strip()
    assert table == error_codes.markdown(), \
        "docs/sidecar.md is out of date: python -m fabricscope.queryapi.error_codes docs/sidecar.md"
