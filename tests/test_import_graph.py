"""How the code imports itself (issue 26, item 5), read from the source so nothing heavy
is imported: no circles among the modules of looplab/, trainables/, sweeps/ and
analysis/ (imports inside functions and under TYPE_CHECKING count: a refactor turns
them into real ones), no upward arrows (the library imports no platform layer, and
inside the library each room imports only the floors below it: LIBRARY_FLOORS), no
private name imported across modules, and the vocabulary the platform reads stays free
of torch."""

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
# The library's own floors, from the ground up: a room (a subpackage, or a module at the
# package's top) may import rooms on lower floors and itself, never a room above nor one
# beside it. docs/architecture.md draws the same list.
LIBRARY_FLOORS = (
    ("errors", "keys", "threads", "console"),  # nothing of looplab
    ("arguments",),  # the command lines' flags (its errors' wording from errors)
    ("fields", "policy", "devices", "destinations", "retrofit"),  # field checks, exit rules, device, HF shapes
    ("tasks", "stages"),  # the tasks and their configs; the stage registry
    ("config",),  # the experiment's typed configs
    ("tracking", "presets", "models"),  # MLflow names; presets; the looped model
    ("checkpoint", "dashboard", "inference"),  # weights on disk; the dashboard's URLs; prefill and decoding
    ("export", "costs", "evaluation", "dashboard_server"),  # to Hugging Face; FLOPs, memory, timing; scoring
    # under exit policies; serving a store's dashboard
    ("training",),  # a stage's run
    ("doctor",),  # a node's health check
    ("cli", "__init__"),  # the `looplab` command; the package's face
)
LIBRARY_FLOOR = {room: floor for floor, rooms in enumerate(LIBRARY_FLOORS) for room in rooms}
# The torch-free vocabulary the platform reads (each imports no torch).
VOCABULARY = ("looplab.config", "looplab.fields", "looplab.policy", "looplab.errors", "looplab.keys", "looplab.stages")


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
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
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


def library_room(module: str) -> str:
    """looplab.training.train -> training; looplab.config -> config; looplab -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up a floor or sideways into another package of the same floor,
    and, inside looplab/, into a room of the same floor or one above (LIBRARY_FLOORS)."""
    wrong = []
    for module, targets in graph.items():
        top = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != top and FLOOR[other] >= FLOOR[top]:
                wrong.append(f"{module} -> {target}")
            elif top == other == "looplab":
                here, there = library_room(module), library_room(target)
                if here != there and LIBRARY_FLOOR[there] >= LIBRARY_FLOOR[here]:
                    wrong.append(f"{module} -> {target}")
    return sorted(wrong)


def test_every_library_room_has_a_floor():
    rooms = {library_room(m) for m in import_graph() if m.split(".")[0] == "looplab"}
    assert sorted(rooms - set(LIBRARY_FLOOR)) == [] and sorted(set(LIBRARY_FLOOR) - rooms) == []


def test_the_checks_find_a_circle_and_an_upward_arrow():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert upward_arrows(
        {
            "looplab.training.train": {"sweeps.sweep"},
            "analysis.load": {"trainables.trial"},
            "looplab.models.looped": {"looplab.checkpoint", "looplab.config"},
            "looplab.costs.timing": {"looplab.evaluation.validation", "looplab.costs.spread"},
            "looplab.stages": {"looplab.training.distributed"},
            "sweeps.sweep": {"looplab.config"},
        }
    ) == [
        "analysis.load -> trainables.trial",
        "looplab.costs.timing -> looplab.evaluation.validation",
        "looplab.models.looped -> looplab.checkpoint",
        "looplab.stages -> looplab.training.distributed",
        "looplab.training.train -> sweeps.sweep",
    ]


def test_the_graph_is_real():
    graph = import_graph()
    assert "looplab.training.objectives" in graph["looplab.training.steps"] and "sweeps.sweep" in graph["sweeps.launch"]


def test_no_circle_anywhere():
    assert circles(import_graph()) == []


def test_no_upward_arrow():
    wrong = upward_arrows(import_graph())
    assert not wrong, "imports that run back up (LIBRARY_FLOORS, FLOOR):\n" + "\n".join(wrong)


def test_no_private_name_is_imported_across_modules():
    modules = module_files()
    private = [
        f"{path.relative_to(ROOT).as_posix()}:{node.lineno}: from {node.module} import {a.name}"
        for path in modules.values()
        for node in import_nodes(path)
        if isinstance(node, ast.ImportFrom) and node.module in modules
        for a in node.names
        if a.name.startswith("_") and a.name != "__version__"
    ]
    assert not private, "\n".join(private)


@pytest.mark.parametrize("module", VOCABULARY + ("looplab.presets",))
def test_the_vocabulary_imports_no_torch(module):
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_the_platform_reads_argument_types_not_the_library_command_line():
    """sweeps/, trainables/ and analysis/ take Parser and the argument types from
    looplab/arguments.py; looplab/cli/ is the `looplab` command alone."""
    graph = import_graph()
    reaching = sorted(m for m, targets in graph.items() if not m.startswith("looplab") and "looplab.cli" in targets)
    assert reaching == [] and "looplab.arguments" in graph["sweeps.flags"]


# The tools around the research core: the command line, a node's health check, the
# dashboard and its server, and MLflow's helpers (the tracking package's names are the
# vocabulary every room writes and reads; its mlflow_runs module is the tool that writes
# them). The CPU backend is a room of its own inside models/ (models/cpu/).
TOOLS = (
    "looplab.cli",
    "looplab.doctor",
    "looplab.dashboard",
    "looplab.dashboard_server",
    "looplab.tracking.mlflow_runs",
)


def is_tool(module: str) -> bool:
    return any(module == tool or module.startswith(tool + ".") for tool in TOOLS)


def is_core(module: str) -> bool:
    return module.startswith("looplab") and not is_tool(module) and not module.startswith("looplab.tracking")


def tool_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from the research core into a tool."""
    return [f"{m} -> {t}" for m, targets in graph.items() if is_core(m) for t in targets if is_tool(t)]


def mlflow_helper_calls(sources: dict[str, str]) -> list[str]:
    """`tracking.<helper>(` in the research core (sources: module -> text): an MLflow
    helper reached through the tracking package's face, a tool used without its name."""
    helpers = {
        node.name
        for node in ast.parse((ROOT / "looplab" / "tracking" / "mlflow_runs.py").read_text()).body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    }
    found = []
    for module, text in sources.items():
        if is_core(module):
            for node in ast.walk(ast.parse(text)):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "tracking"
                    and node.attr in helpers
                ):
                    found.append(f"{module}: tracking.{node.attr}")
    return found


def test_the_research_core_imports_no_tool():
    """Models, stages, training, inference, tasks, configs, keys, costs and evaluation
    never import the tools around them: a researcher changes the core without them."""
    sources = {module: path.read_text() for module, path in module_files().items()}
    assert tool_imports(import_graph()) + mlflow_helper_calls(sources) == []


def test_the_core_rule_sees_a_planted_tool_import():
    """The rule is live: a core module importing the doctor, or calling an MLflow helper
    through the tracking package, is caught; the names it reads are not."""
    graph = import_graph()
    graph["looplab.training.train"] = graph["looplab.training.train"] | {"looplab.doctor"}
    assert tool_imports(graph) == ["looplab.training.train -> looplab.doctor"]
    planted = "from looplab import tracking\ntracking.log_metrics(None, 'r', {})\nx = tracking.VAL_PPL\n"
    assert mlflow_helper_calls({"looplab.training.train": planted}) == ["looplab.training.train: tracking.log_metrics"]
