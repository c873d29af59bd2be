"""How the code imports itself (issue 26, item 5), read from the source so nothing heavy
is imported: no circles among the modules of looplab/, trainables/, sweeps/ and
analysis/ (imports inside functions and under TYPE_CHECKING count: a refactor turns
them into real ones), no upward arrows (the library imports no platform layer, the
models and tasks none of the library above them), no private name imported across
modules, and the vocabulary the platform reads stays free of torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("looplab", "trainables", "sweeps", "analysis")
# Each package's floor: an import may point at a lower floor or its own package, never
# up, nor sideways into another package of the same floor.
FLOOR = {"looplab": 0, "trainables": 1, "analysis": 1, "sweeps": 2}
# What the models and tasks (the library's ground floor) may import of the library:
# each other and the torch-free vocabulary, never training, inference, costs or I/O.
GROUND = ("looplab.models", "looplab.tasks")
VOCABULARY = ("looplab.config", "looplab.fields", "looplab.policy", "looplab.errors", "looplab.keys",
              "looplab.stages")


def module_files() -> dict[str, Path]:
    """Every module by dotted name (a package by its __init__)."""
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def import_nodes(path: Path) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]


def imported_names(path: Path, module: str) -> list[str]:
    """The dotted names one file imports anywhere in it; `from a import b` gives a.b
    (a submodule, or a name inside a: resolved against the modules later)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in import_nodes(path):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: up level - 1 packages from this one
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the project's modules it imports."""
    modules = module_files()

    def owner(name: str) -> str | None:  # the longest module prefix of an imported name
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        targets = {owner(name) for name in imported_names(path, module) if name.split(".")[0] in PACKAGES}
        graph[module] = {t for t in targets if t and t != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up a floor or sideways into another package of the same floor,
    and imports of the ground floor (models, tasks) into the library above it."""
    wrong = []
    for module, targets in graph.items():
        top = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != top and FLOOR[other] >= FLOOR[top]:
                wrong.append(f"{module} -> {target}")
            elif module.startswith(GROUND) and other == "looplab" and not target.startswith(GROUND + VOCABULARY):
                wrong.append(f"{module} -> {target}")
    return sorted(wrong)


def test_the_checks_find_a_circle_and_an_upward_arrow():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert upward_arrows({"looplab.training.train": {"sweeps.plan"}, "analysis.load": {"trainables.trial"},
                          "looplab.models.looped": {"looplab.checkpoint", "looplab.config"},
                          "sweeps.plan": {"looplab.config"}}) == [
        "analysis.load -> trainables.trial", "looplab.models.looped -> looplab.checkpoint",
        "looplab.training.train -> sweeps.plan"]


def test_the_graph_is_real():
    graph = import_graph()
    assert "looplab.training.objectives" in graph["looplab.training.train"] and "sweeps.plan" in graph["sweeps.launch"]


def test_no_circle_anywhere():
    assert circles(import_graph()) == []


def test_no_upward_arrow():
    assert upward_arrows(import_graph()) == []


def test_no_private_name_is_imported_across_modules():
    modules = module_files()
    private = [f"{path.relative_to(ROOT).as_posix()}:{node.lineno}: from {node.module} import {a.name}"
               for path in modules.values() for node in import_nodes(path)
               if isinstance(node, ast.ImportFrom) and node.module in modules
               for a in node.names if a.name.startswith("_") and a.name != "__version__"]
    assert not private, "\n".join(private)


@pytest.mark.parametrize("module", VOCABULARY + ("looplab.presets",))
def test_the_vocabulary_imports_no_torch(module):
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_the_platform_reads_argument_types_not_the_library_command_line():
    """sweeps/, trainables/ and analysis/ take Parser and the argument types from
    looplab/arguments.py; looplab/cli.py is the `looplab` command alone."""
    graph = import_graph()
    reaching = sorted(m for m, targets in graph.items() if not m.startswith("looplab") and "looplab.cli" in targets)
    assert reaching == [] and "looplab.arguments" in graph["sweeps.flags"]
