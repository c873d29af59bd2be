"""The sweeps' command line: the flags every sweep shares and the parsers of flag
values. A malformed value is a ConfigError whose one line names the flag and what is
allowed; sweeps/launch.py prints it and exits with status 2 before Ray starts.

The flags split into two typed values: `Common` (what a sweep's declaration reads:
the preset and the overrides) and `Launch` (how it runs: search, seeds, resources,
storage, tracking), so sweep factories take typed arguments, never the namespace.
`Store` holds the flags of the commands over an existing sweep's checkpoints.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

from looplab.arguments import Parser, add_flags, flag, flags_of, given, number_in
from looplab.config import invalid, parse_value
from looplab.config.training import MAX_SEED
from looplab.costs.resources import DEFAULT_MEMORY_MARGIN_GIB, DEFAULT_MFU, DEFAULT_PEAK_TFLOPS
from looplab.errors import allowed_names
from looplab.presets import PRESETS
from looplab.stages import STAGE_NAMES

DEFAULT_PRESET = "debug" if "debug" in PRESETS else "phop-debug"
# What the flags that name a place or a default allow (an empty value is refused: looplab/arguments.py given)
TRACKING_URIS = "sqlite:///PATH, http(s)://HOST:PORT or a database URI"
STORAGE_PATHS = "a folder, or an object-store prefix such as s3://BUCKET/PREFIX"
SEEDS = "comma-separated integers >= 0, e.g. 0,1,2"


def fail(name: str, value: Any, allowed: str) -> NoReturn:
    raise invalid(name, value, allowed)


@dataclass(frozen=True)
class Common:
    """What a sweep declaration reads from the command line."""

    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)  # --set: every stage, over its recipe
    stage_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # --stage-set / --stage-steps
    init_from: tuple[str, ...] = ()  # --init-from: Hugging Face checkpoints to compare retrofitting with scratch

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Common":
        check_preset(args.preset)
        stage_overrides: dict[str, dict[str, Any]] = {}
        for stage, steps in parse_stage_steps(args.stage_steps).items():
            stage_overrides.setdefault(stage, {})["train.steps"] = steps
        for stage, values in parse_stage_sets(args.stage_set).items():
            stage_overrides.setdefault(stage, {}).update(values)
        return cls(args.preset, parse_sets(args.set), stage_overrides, parse_checkpoints(args.init_from))

    def stage_overrides_over(self, declared: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """A declaration's own per-stage settings, with the user's per-stage overrides on top."""
        merged = {stage: dict(values) for stage, values in declared.items()}
        for stage, values in self.stage_overrides.items():
            merged.setdefault(stage, {}).update(values)
        return merged


# The dry run's resource plan (--gpu-memory, looplab/costs/memory.py)
GPU_MEMORY = (
    "GiB per GPU: each stage trains with the largest micro-batch that fits (the memory model of "
    "looplab/costs/memory.py), with activation checkpointing only if nothing fits without; a stage that "
    "cannot fit is an error before Ray starts"
)


@dataclass(frozen=True)
class Launch:
    """How a sweep runs: search, seeds, resources, where results go. Each field is its
    flag (looplab/arguments.py flag)."""

    # Where it goes
    storage_path: str = flag("looplab-runs", "stage checkpoints, Ray results, artifacts", type=given(STORAGE_PATHS))
    tracking_uri: str = flag(
        "", "MLflow URI (default sqlite:///STORAGE/mlflow.db)", type=given(TRACKING_URIS), unset=None
    )
    address: str = flag("", "Ray cluster address (default: start a local Ray)")
    resume: bool = flag(
        False,
        "continue an interrupted sweep: the same as running the same command again (finished stages and "
        "trials are found by content key; Tune's saved experiment is never restored)",
    )
    verbose: bool = flag(
        False, "MLflow's, Optuna's and Ray's own INFO lines on the console too (by default: STORAGE/logs/ray.log)"
    )
    # What it runs on
    max_concurrent_trials: int = flag(0, "default: what the CPUs/GPUs fit")
    num_workers: int = flag(
        0,
        "Ray Train workers per stage; 0 (default): Ray Train's local mode, the stage trains in the trial's "
        "own process (no worker group to start); K: K data-parallel worker actors",
    )
    cpus_per_worker: float = flag(
        0.0, "CPUs per worker, > 0 (default: the CPUs left, shared evenly)", type=number_in(0.0, low_open=True)
    )
    gpus_per_worker: float = flag(0.0, "GPUs per worker", type=number_in(0.0))
    # How it searches
    search: Literal["grid", "optuna"] = flag("grid", "grid: every point once; optuna: --num-samples trials")
    num_samples: int = flag(8, "Optuna trials (grid runs each point once)")
    scheduler: Literal["none", "asha"] = flag("none", "asha: stop the worst trials early")
    seeds: tuple[int, ...] = flag(
        (0,),
        "comma-separated training seeds, e.g. 0,1,2 (default: the preset's own, 3407 for the paper's language models)",
        type=given(SEEDS),
        unset=None,
    )
    # The dry run's plan: device memory to fit (0: the configs' own micro-batching), and the
    # utilisation and peak its GPU-hours assume (looplab/costs/resources.py)
    dry_run: bool = flag(False, "print trials, resources and compute; start no Ray")
    doctor: bool = flag(
        False,
        "with --dry-run: run `looplab doctor --quick` on every GPU node of the cluster at --address (or on "
        "this machine) and report each node; a failing node makes the exit status 1",
    )
    gpu_memory: float = flag(0.0, GPU_MEMORY, metavar="GB")
    memory_margin: float = flag(
        DEFAULT_MEMORY_MARGIN_GIB,
        "with --gpu-memory: GiB of each device the plan leaves free for the CUDA context, NCCL's buffers "
        "and fragmentation",
        metavar="GB",
    )
    mfu: float = flag(DEFAULT_MFU, "model FLOP/s utilisation the plan's GPU-hours assume")
    gpu_tflops: float = flag(DEFAULT_PEAK_TFLOPS, "a GPU's dense peak the plan's GPU-hours assume (H100 SXM bf16)")

    def __post_init__(self) -> None:
        from trainables.storage import Storage

        Storage(self.storage_path)  # a path that cannot resolve (a symlink loop) is one line, here

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Launch":
        return flags_of(cls, args, tracking_uri=args.tracking_uri or "", seeds=tuple(seeds_of(args.seeds, args.preset)))


@dataclass(frozen=True)
class Store:
    """Where an existing sweep's results are, for the commands over its checkpoints
    (sweeps/evaluate.py, sweeps/bench.py): which experiment, its store, which Ray. Each
    field is its flag; a command's options extend it with their own --dry-run (its
    help says what that command plans) and the rest."""

    experiment: str = flag(help="the sweep's MLflow experiment, e.g. adaptive_pipeline-debug")
    storage_path: str = flag(
        "looplab-runs",
        "the sweep's storage (default looplab-runs): its MLflow store, and its stages/ when the "
        "checkpoints moved with it",
        type=given(STORAGE_PATHS),
    )
    tracking_uri: str | None = flag(None, "MLflow URI (default sqlite:///STORAGE/mlflow.db)", type=given(TRACKING_URIS))
    address: str = flag("", "Ray cluster address (default: start a local Ray)")

    def located(self):
        """The storage (trainables.storage.Storage) and its tracking URI (by default its
        own mlflow.db); a storage path that cannot resolve is a ConfigError."""
        from trainables.storage import Storage

        storage = Storage(self.storage_path)
        return storage, storage.tracking_uri(self.tracking_uri)


def store_parser(command: str, description: str, options: type, groups: dict[str, type]) -> argparse.ArgumentParser:
    """The command line of a command over an existing sweep (`python -m sweeps.<command>`):
    its options (a Store), then each group's flags under its title."""
    p = Parser(prog=f"python -m sweeps.{command}", description=description)
    add_flags(p, options)
    for title, flags in groups.items():
        add_flags(p.add_argument_group(title), flags)
    return p


def parser(description: str) -> argparse.ArgumentParser:
    """Every sweep's command line: what to train (the config flags below), then where it
    goes, what it runs on, how it searches and the dry run's plan (Launch's fields). A
    sweep adds its own flags after these."""
    p = Parser(description=description)
    _config_flags(p)
    add_flags(p, Launch)
    return p


def _config_flags(p: argparse.ArgumentParser) -> None:
    """What to train: text that folds into Common's typed overrides (--set and
    --stage-set and --stage-steps into one dict each), so written by hand, not derived."""
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"base preset (default {DEFAULT_PRESET})")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for every stage, over its recipe, e.g. train.lr=0.001 (repeatable)",
    )
    p.add_argument(
        "--stage-set",
        action="append",
        default=[],
        metavar="STAGE:KEY=VALUE",
        help="config override for one stage, over --set, e.g. stage1:train.lr=0.001 (repeatable)",
    )
    p.add_argument(
        "--stage-steps",
        default="",
        metavar="STAGE=N,...",
        help="steps of some stages, e.g. stage1=2500,chase=800 (others keep theirs)",
    )
    p.add_argument(
        "--init-from",
        default="",
        metavar="HF_DIR,...",
        help="compare initialisations: for each Hugging Face Mamba-2 / Llama checkpoint folder, "
        "pre-training from its weights (retrofit) beside its shape freshly initialised (scratch); "
        "train.init_layers picks the layers (looplab/retrofit.py)",
    )


# ---- value parsers --------------------------------------------------------------------


def check_preset(name: str) -> None:
    if name not in PRESETS:
        fail("--preset", name, allowed_names(name, sorted(PRESETS)))


def seeds_of(text: str | None, preset: str) -> list[int]:
    """--seeds, or by default (None: not given) the preset's own seed (train.seed: 3407
    for the paper's language models, as App. D trains them)."""
    if text is None:
        from looplab.presets import get_preset

        return [get_preset(preset).train.seed]
    return parse_seeds(text)


def parse_checkpoints(text: str) -> tuple[str, ...]:
    """--init-from: comma-separated Hugging Face checkpoint folders (config.json inside)."""
    folders = tuple(part.strip() for part in text.split(",") if part.strip())
    for folder in folders:
        if not (Path(folder).expanduser() / "config.json").is_file():
            fail("--init-from", folder, "Hugging Face checkpoint folders holding config.json, comma-separated")
    return tuple(str(Path(folder).expanduser().resolve()) for folder in folders)


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or any(not 0 <= s <= MAX_SEED for s in seeds):
        fail("--seeds", text, f"{SEEDS}, each at most 2**63 - 1")
    return distinct("--seeds", text, seeds)


def distinct(flag: str, text: str, values: list) -> list:
    """A list flag's values, each once: a repeated one would plan the same trial (or the
    same point) twice, and is more likely a typo than a wish."""
    pieces = [p.strip() for p in text.split(",") if p.strip()]  # as typed, for the line
    for i, value in enumerate(values):
        if value in values[:i]:
            fail(flag, text, f"distinct values ({pieces[i] if len(pieces) == len(values) else value} is given twice)")
    return values


def parse_list(flag: str, text: str, kind: type = float, example: str = "0.1,0.5") -> list[Any]:
    """A comma-separated flag value: one-line error naming the flag when malformed."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        fail(flag, text, f"comma-separated {kind.__name__}s, e.g. {example}")
    return distinct(flag, text, values)


def parse_pairs(flag: str, text: str) -> tuple[dict[str, int], ...]:
    """N⊗R pairs written NxR, e.g. "4x1,4x6" -> ({"n_layers": 4, "n_loops": 1}, ...)."""
    pairs = []
    for item in text.split(","):
        n, x, r = item.strip().lower().partition("x")
        if not (x and n.isdigit() and r.isdigit() and int(n) >= 1 and int(r) >= 1):
            fail(flag, text, "comma-separated NxR pairs with N, R >= 1, e.g. 4x1,4x6,24x1")
        pairs.append({"n_layers": int(n), "n_loops": int(r)})
    return tuple(distinct(flag, text, pairs))


def parse_ranges(flag: str, text: str, low: str, high: str) -> tuple[dict[str, float], ...]:
    """Comma-separated LO-HI ranges with LO <= HI, e.g. "1.85-3.45,1.0-4.0"."""
    out = []
    for item in text.split(","):
        a, dash, b = item.strip().partition("-")
        try:
            lo, hi = float(a), float(b)
        except ValueError:
            lo = hi = math.nan
        if not dash or math.isnan(lo) or math.isnan(hi):
            fail(flag, text, "comma-separated LO-HI ranges, e.g. 1.85-3.45,1.0-4.0")
        if lo > hi:
            fail(flag, text, f"ranges LO-HI with LO <= HI ({item.strip()} is reversed)")
        out.append({low: lo, high: hi})
    return tuple(distinct(flag, text, out))


def parse_sets(items: list[str], flag: str = "--set") -> dict[str, Any]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            fail(flag, item, "KEY=VALUE, e.g. train.steps=50")
        out[key] = parse_value(value)
    return out


def parse_stage_sets(items: list[str]) -> dict[str, dict[str, Any]]:
    """--stage-set STAGE:KEY=VALUE items, grouped by stage."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        stage, colon, rest = item.partition(":")
        if not colon or stage not in STAGE_NAMES:
            fail(
                "--stage-set",
                item,
                f"STAGE:KEY=VALUE with STAGE one of {' | '.join(STAGE_NAMES)}, e.g. stage1:train.lr=0.001",
            )
        out.setdefault(stage, {}).update(parse_sets([rest], "--stage-set"))
    return out


def parse_stage_steps(text: str) -> dict[str, int]:
    """--stage-steps stage1=2500,chase=800."""
    out = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        stage, eq, steps = item.partition("=")
        if not eq or stage not in STAGE_NAMES or not steps.isdigit() or int(steps) < 1:
            fail(
                "--stage-steps",
                text,
                f"STAGE=N,... with STAGE one of {' | '.join(STAGE_NAMES)} and N >= 1, e.g. stage1=2500,chase=800",
            )
        out[stage] = int(steps)
    return out
