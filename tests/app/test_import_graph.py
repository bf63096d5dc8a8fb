"""No import circles in app/ or kvcore/: every import counts, not only the ones that run at import time.

import-linter checks the layers; this checks what layers cannot see: two modules of one layer importing each
other, or a circle closed by an import under `if TYPE_CHECKING:` or inside a function. A circle is a strongly
connected component of more than one module in the graph of `import` / `from ... import` statements (relative ones
resolved). Parent packages are not edges: `import a.b.c` runs a/__init__ too, but an __init__ that re-exports its
package would then close a circle with every module of it, which is how packages work, not a design fault.
"""

from __future__ import annotations

import ast
from collections import deque
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "kvcore")


def module_files() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its __init__)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` names, or its nearest enclosing module of ours (a name imported from a module)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module of ours, line) for every import statement anywhere in the file."""
    is_package = path.name == "__init__.py"
    edges = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            names = [f"{base}.{alias.name}" for alias in node.names]  # a submodule when there is one
        else:
            continue
        for imported in names:
            target = _target(imported, modules)
            if target is not None and target != name:
                edges.append((target, node.lineno))
    return edges


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: line of its first import}."""
    modules = module_files()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        graph[name] = {}
        for target, line in imports_of(name, path, modules):
            graph[name].setdefault(target, line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                components.append(sorted(component))
    return components


def a_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One shortest circle through the component's first module, as the modules it passes."""
    members, start = set(component), component[0]
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in graph[node]:
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if child in members and child not in came_from:
                came_from[child] = node
                queue.append(child)
    return component


def describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return "\n".join(f"  {a} -> {b} (line {graph[a][b]})" for a, b in pairwise(cycle))


def test_the_graph_sees_every_kind_of_import(tmp_path):
    graph = import_graph()
    assert "app.window.main_window" in graph["app.gui"]  # function-local
    assert "kvcore.engine.session" in graph["app.engine.jobs"]  # module level
    assert len(graph) > 100
    source = tmp_path / "b.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import A\nfrom . import c\n"
        "def f():\n    from .d.e import g\n    import os\n"
    )
    modules = dict.fromkeys(["p", "p.a", "p.b", "p.c", "p.d", "p.d.e"], source)
    assert sorted(imports_of("p.b", source, modules)) == [("p.a", 3), ("p.c", 4), ("p.d.e", 6)]


def test_a_circle_is_found_and_a_one_way_import_is_not():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}, "e": {}}
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert circles == [["a", "b", "c"]]
    assert a_cycle(graph, circles[0]) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_in_an_import_circle(package):
    graph = import_graph()
    circles = [c for c in strongly_connected(graph) if len(c) > 1 and c[0].split(".")[0] == package]
    report = "\n\n".join(
        f"{len(c)} modules in a circle: {', '.join(c)}\none circle:\n{describe(graph, a_cycle(graph, c))}"
        for c in circles
    )
    assert not circles, f"import circles in {package}/:\n{report}"
