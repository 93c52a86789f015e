"""pyproject.toml lists the packages explicitly; every package directory must be in it."""
from __future__ import annotations

import os
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP = {".venv", "tests", "var", "build", "bench", "rules", "docs", "deploy", "alertmanager", "dashboards"}


def test_every_package_is_listed():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    # os.walk does not follow symlinks: the demo's node trees are symlink graphs.
    for directory, subdirs, files in os.walk(REPO):
        parts = Path(directory).relative_to(REPO).parts
        if parts and (parts[0] in SKIP or parts[0].startswith(".")):
            subdirs.clear()
            continue
        if parts and "__init__.py" in files:
            found.add(".".join(parts))
    assert found == listed
