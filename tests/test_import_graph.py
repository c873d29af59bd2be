"""The platform's modules import in one direction (issue 26, item 5): among sweeps/,
trainables/ and analysis/ no import cycle, function-level imports included (a lazy
import is still a dependency), and no private name (_name) imported from another
module. Read from the source, so nothing heavy is imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sweeps", "trainables", "analysis")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path) -> list[ast.ImportFrom | ast.Import]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]


def import_graph() -> dict[str, set[str]]:
    """module -> the platform modules it imports (`from a import b` counts a.b when that is a module)."""
    known = modules()
    graph = {name: set() for name in known}
    for name, path in known.items():
        for node in imports(path):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                targets = []
            graph[name] |= {t for t in targets if t in known and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_platform_modules():
    assert cycles(import_graph()) == []


def test_the_sweep_driver_imports_one_way():
    graph = import_graph()
    assert "sweeps.evaluate" not in graph["sweeps.plan"] and "sweeps.launch" not in graph["sweeps.plan"]
    assert "sweeps.launch" not in graph["sweeps.evaluate"]


def test_no_private_name_is_imported_across_modules():
    known = modules()
    private = [f"{path.relative_to(REPO).as_posix()}:{node.lineno}: from {node.module} import {a.name}"
               for path in known.values() for node in imports(path)
               if isinstance(node, ast.ImportFrom) and node.module in known
               for a in node.names if a.name.startswith("_")]
    assert not private, "\n".join(private)
