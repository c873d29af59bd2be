"""The tracking contract kept (issue 26, item 3): every MLflow name is spelled in
looplab/tracking.py, and the platform (sweeps/, trainables/) and analysis/ compose
theirs from it (tracking.policy_metric, tracking.VAL_PPL, tracking.EXECUTED_LOOPS, ...).

The check reads the source, not the running code: every string constant (the pieces
of an f-string included) that is shaped like a metric name fails the test. Docstrings
and prose (a constant with whitespace: help texts, messages) are documentation, not
names, and are not read. analysis/names.py is the one other home of such shapes: it
holds the analysis' own column names (ppl_full, skip_vs_full, ...), which must not be
MLflow names in disguise.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from looplab import tracking
from looplab.policy import ExitPolicy

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("sweeps", "trainables", "analysis")
ANALYSIS_OWN = "analysis/names.py"
METRIC_SHAPES = tuple(re.compile(p) for p in (
    r"^(val|skip|dense|full|forced)_",  # a policy's metric prefix (val_, skip_q0.4_, forced_d2_, ...)
    r"_ppl$", r"^ppl_",  # a perplexity under some name
    r"executed_loops",  # the compute quantity, alone or inside a name
    r"loop\d+_",  # a per-loop instrument (loop2_hidden_norm)
))
# analysis' own names spelled like an MLflow name, each with why it keeps that spelling.
SAME_SPELLING = {
    "val_executed_loops": "speed.csv's column (any timed policy's validation loops), named before the contract",
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant that could be a name: not a docstring, no whitespace."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and node.value and not re.search(r"\s", node.value)]


def metric_shaped(text: str) -> bool:
    return any(p.search(text) for p in METRIC_SHAPES)


def scanned_files() -> list[Path]:
    return sorted(f for d in SCANNED for f in (REPO / d).rglob("*.py"))


def test_no_metric_name_is_spelled_outside_the_tracking_contract():
    found = []
    for path in scanned_files():
        rel = path.relative_to(REPO).as_posix()
        if rel == ANALYSIS_OWN:
            continue
        found += [f"{rel}:{line}: {text!r}" for line, text in string_constants(path) if metric_shaped(text)]
    assert not found, ("metric names spelled outside looplab/tracking.py (compose them with tracking.policy_metric "
                       "and the quantity constants; analysis' own columns go to analysis/names.py):\n"
                       + "\n".join(found))


def _tracking_names() -> set[str]:
    """Every string the contract defines at its top level (names and tuples of names)."""
    values = set()
    for value in vars(tracking).values():
        if isinstance(value, str):
            values.add(value)
        elif isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            values.update(value)
    return values


def test_analysis_own_names_are_not_mlflow_names():
    """analysis/names.py may hold metric-shaped column names, but none the platform logs:
    no evaluation or per-loop metric, no quantity or other name of the contract."""
    contract = _tracking_names()
    clashes = [f"{ANALYSIS_OWN}:{line}: {text!r}" for line, text in string_constants(REPO / ANALYSIS_OWN)
               if text not in SAME_SPELLING
               and (text in contract or tracking.parse_metric(text) or tracking.parse_loop_metric(text))]
    assert not clashes, "MLflow names belong in looplab/tracking.py:\n" + "\n".join(clashes)


def test_analysis_reads_policy_names_from_exit_policy():
    """Labels and prefixes are ExitPolicy's (looplab/policy.py): analysis parses a metric
    name with tracking.parse_metric and reads the policy's names, never their templates."""
    templates = {"ZOO_LABELS", "PREFIX_PATTERN", "METRIC_PATTERN", "LOOP_PATTERN", "zoo_kind"}
    used = []
    for path in sorted((REPO / "analysis").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in templates:
                used.append(f"{path.relative_to(REPO).as_posix()}:{node.lineno}: {name}")
    assert not used, "analysis rebuilds policy names:\n" + "\n".join(used)


def test_analysis_names_re_exports_nothing():
    """analysis/names.py holds the analysis' own names; the contract's are read from
    looplab.tracking, looplab.policy and looplab.stages directly, never through it."""
    tree = ast.parse((REPO / ANALYSIS_OWN).read_text())
    assigned = {t.id: a.value for a in tree.body if isinstance(a, ast.Assign) for t in a.targets
                if isinstance(t, ast.Name)}
    assert "__all__" not in assigned, f"{ANALYSIS_OWN} re-exports names through __all__"
    renames = sorted(n for n, value in assigned.items() if isinstance(value, ast.Name))  # q_name = number_name
    assert not renames, f"renamed re-exports in {ANALYSIS_OWN}: {renames}"
    borrowed = {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("looplab") for a in node.names}
    readers = sorted(f"{path.relative_to(REPO).as_posix()}: names.{name}"
                     for path in (*scanned_files(), *(REPO / "tests").glob("*.py"), *(REPO / "benchmarks").glob("*.py"))
                     for name in borrowed if re.search(rf"\bnames\.{name}\b", path.read_text()))
    assert not readers, "read these from looplab directly:\n" + "\n".join(readers)


@pytest.mark.parametrize("policy, quantity, name", [
    (ExitPolicy.full(), "ppl", "val_ppl"),
    (ExitPolicy.skip(0.4), "executed_loops", "skip_q0.4_executed_loops"),
    (ExitPolicy.forced(2), "accuracy", "forced_d2_accuracy"),
    (ExitPolicy.parse("skip-entropy:2.5"), "loss", "skip_entropy2.5_loss"),
])
def test_policy_metric_names_a_policys_quantity(policy, quantity, name):
    assert tracking.policy_metric(policy, quantity) == name
    assert tracking.parse_metric(name) == (policy, quantity)


def test_the_full_depth_names():
    assert (tracking.VAL_PPL, tracking.VAL_ACCURACY, tracking.VAL_LOSS) == ("val_ppl", "val_accuracy", "val_loss")
    assert tracking.EVAL_QUANTITIES == ("executed_loops", "mean_exit_step", "accuracy", "ppl", "loss",
                                        "backbone_flops_per_token")
    assert tracking.TRAIN_METRICS == ("loss", "exit_entropy", "expected_exit_step", "lr", "grad_norm",
                                      "tokens_per_s")
