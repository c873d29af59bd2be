"""A fuzzer over looplab's commands and files: whatever a user types or whatever state a
crash or a hand leaves on disk, a command ends in one of two ways, success (exit 0) or
one line on stderr and exit 2 naming the input. Never a traceback, never a hang past
BOUND_S, never a file written outside the destination it was given.

Hypothesis draws the inputs (every command's flags and `section.field=value` overrides
with hostile values; checkpoints, trainer state, metrics and datasets damaged in ways
a crash, a full disk or a hand make). The suite runs a fast profile (FAST_EXAMPLES per
test, derandomized, so CI sees the same inputs every time); the long profile is
`LOOPLAB_FUZZ_EXAMPLES=2000 python -m pytest -m fuzz`, randomised, with Hypothesis
printing any input that fails. What it found on the way is in docs/training.md's table of
bad inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from looplab.arguments import has_control_characters  # noqa: E402
from looplab.cli import main as looplab_main  # noqa: E402

pytestmark = pytest.mark.fuzz

LONG = int(os.environ.get("LOOPLAB_FUZZ_EXAMPLES", "0"))
FAST_EXAMPLES = 12
BOUND_S = 120  # seconds one command may take: a tiny run is seconds; a hang is not
TINY = ["train.steps=2", "train.batch_size=4", "task.eval_count=20", "train.eval_every=0"]


def profile(examples: int = FAST_EXAMPLES):
    """The fast profile (the suite: derandomized) or the long one (LOOPLAB_FUZZ_EXAMPLES)."""
    return settings(
        max_examples=LONG or examples,
        deadline=None,
        derandomize=not LONG,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )


# ---- values a hostile user types -------------------------------------------------------------------
LOOP = "{loop}"  # a path that is a symlink loop (made in each sandbox: `symlink_loop`)
HOSTILE = [
    "",
    " ",
    "0",
    "-1",
    "-0",
    "1e20",
    "100000000000000000000",
    "1000000000",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e-50",
    "0x10",
    "1,2",
    "1,,2",
    "a,a",
    "true",
    "None",
    "null",
    "[]",
    "{}",
    "'",
    '"',
    "\\",
    "..",
    "~",
    "/",
    "/proc/looplab",
    "/sys/looplab",
    "/dev/null",
    "x" * 300,
    "é",
    "\u202e",
    "skip",
    "forced:9",
    "skip:2",
    "dense:-1",
    "full",
    "auto",
    "cuda",
    "cuda:7",
    "cpu",
    "fp16",
    "bf16",
    "mistral",
    "bytes",
    # What issue 52's hostile probe typed: seeds past torch's 64 bits, a learning rate
    # float32 weights cannot feel, terminal escapes and a bell in a path, a symlink loop
    "9223372036854775808",
    "99999999999999999999999",
    "1e-320",
    "\x1b[2Jrun",
    "run\x07",
    LOOP,
]


def hostile_values() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(HOSTILE),
        st.integers(-3, 64).map(str),
        st.floats(allow_nan=True, allow_infinity=True, width=32).map(repr),
        st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
    )


def override_names() -> list[str]:
    """Every config field a `section.field=value` override reaches, except the one that
    is valid and slow by design (compiling takes a minute on a CPU) and the task kind
    (another task's fields differ: its own row of tests)."""
    from looplab.config import ExitConfig, HoleConfig, ModelConfig, TrainConfig
    from looplab.tasks.phop import PhopConfig

    names = [
        f"{section}.{f.name}"
        for section, cls in (
            ("model", ModelConfig),
            ("train", TrainConfig),
            ("exit", ExitConfig),
            ("hole", HoleConfig),
            ("task", PhopConfig),
        )
        for f in dataclasses.fields(cls)
    ]
    return [n for n in names if n not in ("train.compile", "task.kind")]


# ---- running one command ------------------------------------------------------------------------------
class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"ran past {BOUND_S} s")


def run(argv: list[str], cwd: Path) -> tuple[int, str]:
    """looplab's CLI in this process, from cwd, bounded by BOUND_S: (exit status, stderr).
    An exception other than SystemExit escapes: the traceback a user would have seen."""
    err = io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(BOUND_S)
    here = os.getcwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = looplab_main(argv)
            except SystemExit as e:  # argparse's own refusals
                code = e.code
    finally:
        os.chdir(here)
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, err.getvalue()


def files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def assert_clean_outcome(argv: list[str], code: int, err: str) -> None:
    """Exit 0, or exit 2 with one line that says what is invalid."""
    assert code in (0, 2), f"exit {code} for {argv}: {err[-2000:]}"
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "error" in lines[0], f"{argv}: {err[-2000:]}"
        # an input is echoed escaped: a terminal never receives what the user pasted by accident
        assert not has_control_characters(lines[0]), f"{argv}: {lines[0]!r}"


# ---- fixtures: a trained checkpoint to damage ---------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    assert looplab_main(["train", "--preset", "phop-debug", "--out", str(root / "run"), *TINY]) == 0
    return root / "run"


def _sandbox() -> Path:
    return Path(tempfile.mkdtemp(prefix="looplab-fuzz-"))


# ---- commands × flags × overrides ---------------------------------------------------------------------------
COMMANDS = {
    # command: (base argv with {ckpt} and {dest}, flags the fuzzer sets)
    "train": (
        ["train", "--preset", "phop-debug", "--out", "{dest}/run", *TINY],
        ["--preset", "--stage", "--init", "--out", "--stop-at", "--threads"],
    ),
    "eval": (
        ["eval", "--checkpoint", "{ckpt}", "--limit", "8"],
        ["--policies", "--batch-size", "--json", "--device", "--threads", "--limit"],
    ),
    "generate": (
        ["generate", "--checkpoint", "{ckpt}", "--prompt", "1 2", "--max-new-tokens", "3"],
        ["--prompt", "--policy", "--max-new-tokens", "--temperature", "--top-p", "--seed", "--threads"],
    ),
    "bench": (
        [
            "bench",
            "--preset",
            "phop-debug",
            "--oracle-mean",
            "2",
            "--batch",
            "1",
            "--seq-len",
            "8",
            "--repeats",
            "1",
            "--warmup",
            "0",
        ],
        [
            "--batch",
            "--seq-len",
            "--oracle-mean",
            "--policies",
            "--dtype",
            "--packing",
            "--repeats",
            "--json",
            "--threads",
        ],
    ),
    "data": (["data", "phop", "--count", "2"], ["--n", "--p", "--count", "--seed"]),
    "info": (["info", "--preset", "phop-debug"], ["--preset"]),
    "export": (["export", "--checkpoint", "{ckpt}", "{dest}/hf"], ["--checkpoint", "--format", "--policy"]),
}


DESTINATION_FLAGS = ("--json", "--out", "--output", "--markdown")


def destinations(argv: list[str], cwd: Path) -> list[Path]:
    """Where a command line asks its output to go (relative paths: from its working
    directory): the values of the destination flags, and export's OUT_DIR."""
    named = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in DESTINATION_FLAGS]
    if argv[0] == "export":
        named.append(argv[-1])
    return [(cwd / n).resolve() for n in named if n]


@st.composite
def command_lines(draw) -> tuple[str, list[str]]:
    name = draw(st.sampled_from(sorted(COMMANDS)))
    base, flags = COMMANDS[name]
    argv = list(base)
    for flag in draw(st.lists(st.sampled_from(flags), max_size=2, unique=True)):
        argv += [flag, draw(hostile_values())]
    if name in ("train", "bench"):  # overrides: section.field=value
        for key in draw(st.lists(st.sampled_from(override_names()), max_size=2, unique=True)):
            argv.append(f"{key}={draw(hostile_values())}")
    return name, argv


def symlink_loop(box: Path) -> Path:
    """box/loop → box/loop-back → box/loop: resolving it fails with "Symlink loop"."""
    (box / "loop").symlink_to(box / "loop-back")
    (box / "loop-back").symlink_to(box / "loop")
    return box / "loop"


@profile()
@given(command_lines())
@example(
    ("train", ["train", "--preset", "phop-debug", "--out", "{dest}/run", *TINY, "train.seed=99999999999999999999999"])
)
@example(("train", ["train", "--preset", "phop-debug", "--out", LOOP, *TINY]))
@example(("train", ["train", "--preset", "phop-debug", "--out", "{dest}/run", *TINY, "train.lr=1e-320"]))
@example(("train", ["train", "--preset", "phop-debug", "--out", "{dest}/run", *TINY, "train.warmup_steps=1000000"]))
@example(("eval", ["eval", "--checkpoint", "{ckpt}", "--limit", "8", "--json", "\x1b[2J/out.json"]))
@example(("generate", ["generate", "--checkpoint", "{ckpt}", "--prompt", "1 2", "--temperature", "nan"]))
def test_any_command_line_succeeds_or_is_one_line(trained, drawn):
    name, template = drawn
    box = _sandbox()
    try:
        (box / "cwd").mkdir()
        dest, loop = box / "dest", symlink_loop(box)
        argv = [
            a.replace("{ckpt}", str(trained / "checkpoint")).replace("{dest}", str(dest)).replace(LOOP, str(loop))
            for a in template
        ]
        source = files(trained)
        code, err = run(argv, box / "cwd")
        assert_clean_outcome(argv, code, err)
        assert files(trained) == source, f"{argv} changed the checkpoint it read"
        stray = [
            p
            for p in (box / "cwd").rglob("*")
            if not any(p == d or d in p.parents for d in destinations(argv, box / "cwd"))
        ]
        assert not stray, f"{argv} wrote {stray[0]} outside its destinations"
    finally:
        shutil.rmtree(box, ignore_errors=True)


# ---- damaged files ------------------------------------------------------------------------------------------------
DAMAGE = ("truncate", "garble", "empty", "folder", "delete", "json")
CHECKPOINT_FILES = ("config.json", "model.safetensors", "trainer.json", "optimizer.safetensors")


def damage(path: Path, how: str, where: float, value=None) -> None:
    """One kind of damage at a relative position `where` of the file: cut it there,
    overwrite bytes there, empty it, replace it by a folder, delete it, or (JSON files)
    set one of its top-level values to `value`."""
    data = path.read_bytes()
    at = int(where * len(data))
    if how == "truncate":
        path.write_bytes(data[:at])
    elif how == "garble":
        path.write_bytes(data[:at] + bytes((b ^ 0x5A) for b in data[at : at + 16]) + data[at + 16 :])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "folder":
        path.unlink()
        path.mkdir()
    elif how == "delete":
        path.unlink()
    elif how == "json" and path.suffix == ".json":
        doc = json.loads(data)
        keys = sorted(doc) if isinstance(doc, dict) else []
        if keys:
            doc[keys[int(where * len(keys)) % len(keys)]] = value
            path.write_text(json.dumps(doc))


@profile()
@given(
    st.sampled_from(CHECKPOINT_FILES),
    st.sampled_from(DAMAGE),
    st.floats(0.0, 0.999),
    st.sampled_from(["", "x", -1, 10**12, None, [], {}, 0.5]),
    st.sampled_from(["resume", "eval", "init"]),
)
# What the long profile found (a TypeError deep in the checkpoint check), kept as a case:
@example(file="config.json", how="json", where=0.75, value=-1, use="resume")  # weights_sha256 = -1
def test_any_damaged_checkpoint_is_refused_in_one_line_or_used(trained, file, how, where, value, use):
    """A resume from it, an evaluation of it, a stage that continues it."""
    box = _sandbox()
    try:
        run_dir = box / "run"
        shutil.copytree(trained, run_dir)
        damage(run_dir / "checkpoint" / file, how, where, value)
        (box / "cwd").mkdir()
        ckpt = str(run_dir / "checkpoint")
        argv = {
            "resume": ["train", "--preset", "phop-debug", "--out", str(run_dir), *TINY[:1], "train.steps=3", *TINY[1:]],
            "eval": ["eval", "--checkpoint", ckpt, "--limit", "8"],
            "init": [
                "train",
                "--preset",
                "phop-debug",
                "--stage",
                "stage1",
                "--init",
                ckpt,
                "--out",
                str(box / "child"),
                *TINY,
            ],
        }[use]
        code, err = run(argv, box / "cwd")
        assert_clean_outcome(argv + [f"({file}: {how} at {where:.3f})"], code, err)
        assert not any((box / "cwd").iterdir())
    finally:
        shutil.rmtree(box, ignore_errors=True)


@profile()
@given(
    st.sampled_from(["truncate", "garble", "empty", "folder", "lines"]),
    st.floats(0.0, 0.999),
    st.sampled_from(["", "{", "null", "[]", '{"kind": "train"}', '{"kind": "train", "step": "x"}', "\x00"]),
)
def test_any_damaged_metrics_file_resumes_or_is_one_line(trained, how, where, line):
    box = _sandbox()
    try:
        run_dir = box / "run"
        shutil.copytree(trained, run_dir)
        metrics = run_dir / "metrics.jsonl"
        if how == "lines":
            text = metrics.read_text().splitlines()
            text.insert(int(where * len(text)), line)
            metrics.write_text("\n".join(text) + "\n")
        else:
            damage(metrics, how, where)
        (box / "cwd").mkdir()
        argv = ["train", "--preset", "phop-debug", "--out", str(run_dir), "train.steps=3", *TINY[1:]]
        code, err = run(argv, box / "cwd")
        assert_clean_outcome(argv + [f"(metrics.jsonl: {how} at {where:.3f}, {line!r})"], code, err)
    finally:
        shutil.rmtree(box, ignore_errors=True)


@profile()
@given(
    st.sampled_from([".jsonl", ".txt", ".json", ".parquet", ".csv"]),
    st.one_of(
        st.sampled_from(
            [
                "",
                "\n",
                "{",
                '{"text": 1}',
                '{"text": ""}',
                '{"body": "x"}',
                "[]",
                "null",
                '{"text": "a"}\n{',
                "\x00\x01",
                "a" * 10,
            ]
        ),
        st.text(max_size=64),
    ),
)
def test_any_dataset_file_trains_or_is_one_line(suffix, content):
    box = _sandbox()
    try:
        data = box / f"data{suffix}"
        data.write_text(content)
        (box / "cwd").mkdir()
        argv = [
            "train",
            "--preset",
            "debug",
            "--out",
            str(box / "run"),
            f"task.dataset={data}",
            "task.tokenizer=bytes",
            "train.seq_len=16",
            *TINY,
        ]
        code, err = run(argv, box / "cwd")
        assert_clean_outcome(argv, code, err)
        assert not any((box / "cwd").iterdir())
    finally:
        shutil.rmtree(box, ignore_errors=True)
