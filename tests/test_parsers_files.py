"""Single-value file reads: every way a sysfs file goes wrong is a specific reason."""
from __future__ import annotations

import pytest

from fabricscope.exporter.parsers.files import ReadProblem, read_int, read_text


@pytest.mark.parametrize("content, expected", [
    ("42\n", 42),
    ("0x1f\n", 31),
    ("N/A (no PMA)\n", "no_pma"),
    ("", "empty"),
    ("  \n", "empty"),
    ("12abc", "not_a_number"),
])
def test_read_int_table(tmp_path, content, expected):
    path = tmp_path / "value"
    path.write_text(content)
    result = read_int(path)
    if isinstance(expected, int):
        assert result == expected
    else:
        assert isinstance(result, ReadProblem) and result.reason == expected


def test_absent_and_directory(tmp_path):
    assert read_text(tmp_path / "missing").reason == "absent"
    (tmp_path / "dir").mkdir()
    assert read_text(tmp_path / "dir").reason == "not_a_file"


def test_a_file_where_a_directory_belongs_is_not_a_file(tmp_path):
    (tmp_path / "counters").write_text("not a directory\n")
    assert read_text(tmp_path / "counters" / "symbol_error").reason == "not_a_file"
