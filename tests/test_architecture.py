"""The shape docs/architecture.md describes, checked on the code: no import cycle in the
package, no package imported by a name string, every import across folders one the
document's table allows, and `ruff check` clean under the committed configuration."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
# Modules whose job is to put components together (the document says why).
COMPOSITION_ROOTS = re.compile(r"^fabricscope\.(cli|deploy_\w+|\w+\.cli|demo\.stack(\..+)?)$")


def package_files() -> dict[str, Path]:
    """Module name -> file, from pyproject's package list and folder mapping."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"fabricscope": ROOT / "fabricscope",
               **{name: ROOT / folder for name, folder in config["package-dir"].items()}}
    modules = {}
    for package in config["packages"]:
        prefix = max((p for p in folders if package == p or package.startswith(p + ".")), key=len)
        folder = folders[prefix].joinpath(*package[len(prefix):].strip(".").split(".")) \
            if package != prefix else folders[prefix]
        for path in sorted(folder.glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (types, not imports at run time)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for child in node.body for inner in ast.walk(child))
    return skipped


def import_graph() -> dict[str, set[str]]:
    modules = package_files()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        skipped = _type_checking_only(tree)
        found = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def documented_components() -> dict[str, set[str]]:
    """import name -> the component names it may import, from the document's table."""
    table = DOC.read_text().split("<!-- architecture:begin -->")[1].split("<!-- architecture:end -->")[0]
    allowed = {}
    for line in table.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        name = cells[1].strip("`")
        allowed[name] = {c.strip("` ") for c in cells[3].split(",") if c.strip("` —")}
    return allowed


def component_of(module: str, components: dict[str, set[str]]) -> str:
    return max((c for c in components if module == c or module.startswith(c + ".")), key=len)


def short(component: str) -> str:
    return component.rpartition(".")[2] if component != "fabricscope" else "fabricscope"


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_package_is_imported_by_a_name_string():
    """importlib.import_module("fabricscope...") or "module:attribute" strings hide an
    import from readers and from the graph above: imports are statements."""
    offenders = []
    modules = package_files()
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            # A table of module names (to import later by name) is the same thing.
            # (`python -m <module>` in a command line starts a process: not an import.)
            if isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set)):
                items = list(ast.iter_child_nodes(node))
                for before, item in zip([None, *items], items):
                    runs_it = isinstance(before, ast.Constant) and before.value == "-m"
                    if isinstance(item, ast.Constant) and item.value in modules and not runs_it:
                        offenders.append(f"{name}:{item.lineno} {item.value!r}")
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(("import_module", "__import__")):
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) or (isinstance(first, ast.JoinedStr) and isinstance(
                        first.values[0], ast.Constant)):
                    offenders.append(f"{name}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    re.fullmatch(r"fabricscope(\.\w+)+:\w+", node.value):
                offenders.append(f"{name}:{node.lineno} {node.value!r}")
    assert offenders == []


def test_every_folder_is_documented_and_imports_go_the_documented_way():
    components = documented_components()
    modules = package_files()
    assert {component_of(m, components) for m in modules} == set(components), \
        "a component of the package is missing from docs/architecture.md"
    crossing = []
    for module, imported in import_graph().items():
        if COMPOSITION_ROOTS.match(module):
            continue
        own = component_of(module, components)
        for target in imported:
            other = component_of(target, components)
            if other != own and short(other) not in components[own]:
                crossing.append(f"{module} -> {target}")
    assert crossing == []


@pytest.mark.parametrize("name", ["exporter", "fabricscope"])
def test_the_node_side_imports_no_server_side_component(name):
    """What a GPU node installs and runs never reaches the sidecar, chaos or dashboards."""
    components = documented_components()
    assert not components[f"fabricscope.{name}" if name != "fabricscope" else name] & {
        "queryapi", "chaos", "dashboards"}


def test_ruff_is_clean_under_the_committed_configuration():
    """pyproject's [tool.ruff]: the rules the code's noqa markers name, and RUF100 so a
    marker that silences nothing is an error too."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is in the test extra (make setup installs it)"
    result = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
