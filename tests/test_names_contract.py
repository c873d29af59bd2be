"""The tracking contract kept (issue 26, item 3; issue 36, item 2): every MLflow name is
spelled in looplab/tracking/names.py, and the library (looplab/), the platform (sweeps/,
trainables/), analysis/, the benchmarks and the scripts compose theirs from it
(tracking.policy_metric, tracking.VAL_PPL, tracking.EXECUTED_LOOPS, ...).

The check reads the source, not the running code: every string constant (the pieces of
an f-string included) fails the test when it is one of the contract's names (a string
tracking/names.py defines, or one its functions compose: a policy's metric, a per-loop metric,
an lm-eval quantity), or shaped like a metric name. A plain word (stage, policy, loss)
is the whole code's vocabulary and is not read as a name; docstrings and prose (a
constant with whitespace: help texts, messages) are documentation, not names.
analysis/names.py is the one other home of metric-shaped names: it holds the analysis'
own column names (ppl_full, skip_vs_full, ...), which must not be MLflow names in
disguise. Elsewhere a file may keep a contract's spelling for a store or a field of its
own only with a line in SPELLED_ELSEWHERE saying why.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from looplab import tracking
from looplab.policy import ExitPolicy

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("looplab", "benchmarks", "scripts", "sweeps", "trainables", "analysis")
CONTRACT = "looplab/tracking/names.py"
ANALYSIS_OWN = "analysis/names.py"
METRIC_SHAPES = tuple(
    re.compile(p)
    for p in (
        r"^(val|skip|dense|full|forced)_",  # a policy's metric prefix (val_, skip_q0.4_, forced_d2_, ...)
        r"_ppl$",
        r"^ppl_",  # a perplexity under some name
        r"executed_loops",  # the compute quantity, alone or inside a name
        r"loop\d+_",  # a per-loop instrument (loop2_hidden_norm)
    )
)
PLAIN_WORD = re.compile(r"[a-z]+")  # stage, policy, task, loss, ppl: everyone's words, not only the contract's
# lm-eval quantities the contract composes (tracking.lm_eval_quantity): lm_eval.<task>, <family>.<task>.
_FAMILIES = "|".join(map(re.escape, tracking.LM_EVAL_FAMILIES))
LM_EVAL_QUANTITY = re.compile(rf"^(?:{re.escape(tracking.LM_EVAL)}|(?:{_FAMILIES})\.)\S+$")
# analysis' own names spelled like an MLflow name, each with why it keeps that spelling.
SAME_SPELLING = {
    "val_executed_loops": "speed.csv's column (any timed policy's validation loops), named before the contract",
}
# Outside the contract, a file that spells a contract name (or a name's shape) as the word
# of a store or a field of its own: the names, and why. A line that no longer matches fails
# too (test_each_exemption_is_still_needed), so the table only shrinks with the code.
SPELLED_ELSEWHERE = {
    "looplab/policy.py": (
        {"val_", "forced_d"},
        "the home of a policy's metric prefix (ExitPolicy.metric_prefix), which tracking.policy_metric composes with",
    ),
    "looplab/checkpoint.py": (
        {"stage_key", "config_hash", "parent_checkpoint"},
        "a checkpoint's metadata keys: its own store (looplab.load_model reads it), whose words the content tags copy",
    ),
    "looplab/training/run_folder.py": ({"stage_key"}, "the training state's and the divergence marker's key"),
    "looplab/cli/preset_commands.py": ({"stage_key", "config_hash"}, "fields of the commands' JSON output"),
    "looplab/cli/generate_command.py": ({"prompt_executed_loops"}, "a field of the command's JSON output"),
    "looplab/evaluation/harness.py": ({"executed_loops_by_task"}, "lm-eval's config entry of the per-task means"),
    "looplab/tasks/text.py": ({"val_blocks"}, "a TextConfig field (the validation blocks), not a metric"),
    "trainables/keyed_step.py": (
        {"stage_key"},
        "the payload of a checkpoint's weights_key (a key's spelling is frozen: tests/test_keys.py)",
    ),
    "trainables/checkpoints.py": ({"config_hash"}, "a checkpoint's metadata key (looplab/checkpoint.py's store)"),
    "sweeps/sweep.py": ({"grid.", "range."}, "the sweep file's sections (grid.<axis>, range.<param>) in a message"),
    "benchmarks/lean_head.py": ({"tokens_per_s"}, "the benchmark's own report, not MLflow"),
    "benchmarks/mamba2_vs_hf.py": ({"tokens_per_s"}, "the benchmark's own report, not MLflow"),
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


def source_constants(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, text) of every string constant that could be a name: not a docstring, no whitespace."""
    tree = ast.parse(source, filename=filename)
    skip = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and node.value
        and not re.search(r"\s", node.value)
    ]


def string_constants(path: Path) -> list[tuple[int, str]]:
    return source_constants(path.read_text(), str(path))


def metric_shaped(text: str) -> bool:
    return any(p.search(text) for p in METRIC_SHAPES)


def contract_names() -> set[str]:
    """Every name the contract defines at its top level: its public string constants and
    the strings of its tuples of names."""
    values = set()
    for name, value in vars(tracking).items():
        if name.startswith("_"):
            continue
        if isinstance(value, str):
            values.add(value)
        elif isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            values.update(value)
    return values


NAMES = contract_names()


def contract_name(text: str) -> bool:
    """Whether the contract defines or composes this name: one of its constants (not a
    plain word), a policy's metric (tracking.policy_metric, for any policy the build
    knows), a per-loop metric (tracking.loop_metric) or an lm-eval quantity."""
    return (
        (text in NAMES and not PLAIN_WORD.fullmatch(text))
        or tracking.parse_metric(text) is not None
        or tracking.parse_loop_metric(text) is not None
        or LM_EVAL_QUANTITY.match(text) is not None
    )


def spelled_names(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, text) of each contract name or metric-shaped name spelled in the source."""
    return sorted(
        (line, text) for line, text in source_constants(source, filename) if contract_name(text) or metric_shaped(text)
    )


def scanned_files() -> list[Path]:
    return sorted(
        f
        for d in SCANNED
        for f in (REPO / d).rglob("*.py")
        if f.relative_to(REPO).as_posix() not in (CONTRACT, ANALYSIS_OWN)
    )


@functools.cache  # one read of the tree for the two tests below
def spelled_outside_the_contract() -> tuple[list[str], set[tuple[str, str]]]:
    """The names spelled outside tracking/names.py that no exemption covers, and the
    (file, name) exemptions that were used."""
    found, used = [], set()
    for path in scanned_files():
        rel = path.relative_to(REPO).as_posix()
        exempt = SPELLED_ELSEWHERE.get(rel, (set(), ""))[0]
        for line, text in spelled_names(path.read_text(), str(path)):
            if text in exempt:
                used.add((rel, text))
            else:
                found.append(f"{rel}:{line}: {text!r}")
    return found, used


def test_no_metric_name_is_spelled_outside_the_tracking_contract():
    found, _ = spelled_outside_the_contract()
    assert not found, (
        "MLflow names spelled outside looplab/tracking/names.py (import its constants, compose with "
        "tracking.policy_metric / loop_metric / lm_eval_quantity; analysis' own columns go to "
        "analysis/names.py, another store's own word to SPELLED_ELSEWHERE with why):\n" + "\n".join(found)
    )


def test_each_exemption_is_still_needed():
    _, used = spelled_outside_the_contract()
    unused = sorted(
        f"{rel}: {name!r}" for rel, (names, _) in SPELLED_ELSEWHERE.items() for name in names if (rel, name) not in used
    )
    assert not unused, "SPELLED_ELSEWHERE holds names the file no longer spells:\n" + "\n".join(unused)


def test_the_check_finds_a_planted_name():
    """The checker on a source string: a contract constant, a composed name (whole or as
    an f-string's pieces), a per-loop and an lm-eval name are found; a docstring, prose,
    a plain word and a name the contract does not have are not."""
    source = '''
def diagnostics(q, loss):
    """exit_entropy in a docstring is documentation."""
    key = "exit_entropy"
    other = {"loop2_active": 1, "lm_eval_loops.piqa": 2, "forced_d2_accuracy": 3}
    return {key: loss, f"skip_q{q}_ppl": loss, "stage": "chase", "say exit_entropy": 0, "warmup_steps": 4}
'''
    assert spelled_names(source) == [
        (4, "exit_entropy"),
        (5, "forced_d2_accuracy"),
        (5, "lm_eval_loops.piqa"),
        (5, "loop2_active"),
        (6, "_ppl"),
        (6, "skip_q"),
    ]
    assert contract_name("expected_exit_step") and contract_name(tracking.VAL_PPL)
    assert not contract_name("loss") and not contract_name("warmup_steps")


def test_the_contract_names_hold_what_its_functions_compose():
    """NAMES holds the constants; contract_name also recognises the composed names, for
    every policy the presets evaluate and every loop."""
    from looplab.presets import PRESETS, get_preset
    from looplab.stages import STAGES

    assert {"exit_entropy", "expected_exit_step", "tokens_per_s_full", "hole_branch", "mlflow.runName"} <= NAMES
    loops = {get_preset(name).model.n_loops for name in PRESETS}
    policies = {p for stage in STAGES.values() for n in loops for p in stage.eval_policies(n)}
    composed = [tracking.policy_metric(p, q) for p in policies for q in tracking.EVAL_QUANTITIES]
    composed += [
        tracking.loop_metric(q, r, p)
        for p in (None, *policies)
        for r in range(1, max(loops) + 1)
        for q in tracking.LOOP_QUANTITIES
    ]
    composed += [
        tracking.policy_metric(ExitPolicy.full(), tracking.lm_eval_quantity("piqa", f))
        for f in (None, *tracking.LM_EVAL_FAMILIES)
    ]
    assert len(composed) > 40 and all(contract_name(n) for n in composed), [n for n in composed if not contract_name(n)]


def test_analysis_own_names_are_not_mlflow_names():
    """analysis/names.py may hold metric-shaped column names, but none the platform logs:
    no evaluation or per-loop metric, no quantity or other name of the contract."""
    contract = NAMES
    clashes = [
        f"{ANALYSIS_OWN}:{line}: {text!r}"
        for line, text in string_constants(REPO / ANALYSIS_OWN)
        if text not in SAME_SPELLING
        and (text in contract or tracking.parse_metric(text) or tracking.parse_loop_metric(text))
    ]
    assert not clashes, "MLflow names belong in looplab/tracking/names.py:\n" + "\n".join(clashes)


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
    assigned = {
        t.id: a.value for a in tree.body if isinstance(a, ast.Assign) for t in a.targets if isinstance(t, ast.Name)
    }
    assert "__all__" not in assigned, f"{ANALYSIS_OWN} re-exports names through __all__"
    renames = sorted(n for n, value in assigned.items() if isinstance(value, ast.Name))  # q_name = number_name
    assert not renames, f"renamed re-exports in {ANALYSIS_OWN}: {renames}"
    borrowed = {
        a.asname or a.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("looplab")
        for a in node.names
    }
    read = re.compile(rf"\bnames\.({'|'.join(sorted(borrowed))})\b")
    readers = sorted(
        {
            f"{path.relative_to(REPO).as_posix()}: names.{name}"
            for path in {*scanned_files(), *(REPO / "tests").glob("*.py")}
            for name in read.findall(path.read_text())
        }
    )
    assert not readers, "read these from looplab directly:\n" + "\n".join(readers)


@pytest.mark.parametrize(
    "policy, quantity, name",
    [
        (ExitPolicy.full(), "ppl", "val_ppl"),
        (ExitPolicy.skip(0.4), "executed_loops", "skip_q0.4_executed_loops"),
        (ExitPolicy.forced(2), "accuracy", "forced_d2_accuracy"),
        (ExitPolicy.parse("skip-entropy:2.5"), "loss", "skip_entropy2.5_loss"),
    ],
)
def test_policy_metric_names_a_policys_quantity(policy, quantity, name):
    assert tracking.policy_metric(policy, quantity) == name
    assert tracking.parse_metric(name) == (policy, quantity)


def test_the_full_depth_names():
    assert (tracking.VAL_PPL, tracking.VAL_ACCURACY, tracking.VAL_LOSS) == ("val_ppl", "val_accuracy", "val_loss")
    assert tracking.EVAL_QUANTITIES == (
        "executed_loops",
        "mean_exit_step",
        "accuracy",
        "ppl",
        "loss",
        "backbone_flops_per_token",
    )
    assert tracking.TRAIN_METRICS == ("loss", "exit_entropy", "expected_exit_step", "lr", "grad_norm", "tokens_per_s")
