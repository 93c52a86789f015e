"""pyproject.toml lists the packages explicitly; every package directory must be in it, under
its `fabricscope.` import name (package-dir maps the top-level folders into the namespace)."""
from __future__ import annotations

import os
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP = {".venv", "tests", "var", "build", "bench", "docs", "deploy"}


def _setuptools():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def import_name(parts: tuple[str, ...]) -> str:
    """The import name of a package folder: a folder that package-dir maps is renamed."""
    folder_to_name = {folder: name for name, folder in _setuptools().get("package-dir", {}).items()}
    for depth in range(len(parts), 0, -1):
        prefix = "/".join(parts[:depth])
        if prefix in folder_to_name:
            return ".".join((folder_to_name[prefix], *parts[depth:]))
    return ".".join(parts)


def test_every_package_is_listed():
    listed = set(_setuptools()["packages"])
    found = set()
    # os.walk does not follow symlinks: the demo's node trees are symlink graphs.
    for directory, subdirs, files in os.walk(REPO):
        parts = Path(directory).relative_to(REPO).parts
        if parts and (parts[0] in SKIP or parts[0].startswith(".")):
            subdirs.clear()
            continue
        if parts and "__init__.py" in files:
            found.add(import_name(parts))
    assert found == listed


def test_no_generic_top_level_package_is_installed():
    assert all(name == "fabricscope" or name.startswith("fabricscope.") for name in _setuptools()["packages"])
