"""What a protocol pins beyond its declaration, and the check that this checkout and this
machine still are what it was declared on (sweeps/protocol.py, Pins).

A protocol's digest covers its declaration. What else decides a verdict is pinned as
declared values and checked here before anything trains; each departure is named in
one line, and a run with one is exploratory (never the headline):

  stages     every stage's resolved config (the presets' contents, the stage recipes,
             the data stream's start, device, precision, compile; the seed aside), as
             one digest: stages_digest
  analysis   what the claims code computes on a fixed synthetic input (trial measures,
             interpolation at the target loops, paired or Welch, the scales, Holm), as
             one digest of its numbers: analysis_digest
  behaviour  each distinct stage shape's first optimizer steps (their losses), in the
             stage's own mode (compiled where declared), one thread, on the stage's
             first batch from fresh weights of the block's first seed: a change of what
             the model, the losses or the optimizer compute moves them, a refactor that
             keeps every float does not (compared within BEHAVIOUR_RTOL: above another
             kernel's rounding, below what a norm's epsilon moves)
  torch      the installed version
  machine    the machine class (tracking.hardware() without torch): other kernels round
             differently, and speed claims are claims about a machine

The code's commit and whether the checkout was dirty are recorded beside every seed in the ledger
(sweeps/ledger.Ledger), so a later reader can tell which code trained a seed.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from looplab.keys import digest

BEHAVIOUR_STEPS = 3  # optimizer steps a stage shape's fingerprint runs
# Measured on the v5 stage shapes: two runs of the same code on one machine agree bit for
# bit, compiled against eager to 1e-7 (other kernels, other rounding); a norm's epsilon
# divided by ten moves the losses by 1.7e-5 (CHASE) to 1.8e-4 (p-hop). Between the two.
BEHAVIOUR_RTOL = 2e-6
DIGEST_LENGTH = 12


# ---- the stages --------------------------------------------------------------------------------


def sweep_stage_configs(sweeps, seed: int) -> list[tuple[str, dict[str, Any], list]]:
    """(sweep name, trial point, its stage configs in order) of every point of these
    sweeps at one seed: what every check below reads, built once a check."""
    from sweeps.flags import Launch
    from sweeps.sweep import validate
    from trainables.pipeline import stage_configs

    # The storage only names the parents' checkpoints, which seedless() drops.
    launch = Launch(storage_path="/protocol", seeds=(seed,), dry_run=True)
    out = []
    for sweep in sweeps:
        points, _ = validate(sweep, launch)
        out += [(sweep.name, point, stage_configs(sweep.spec, point, launch.storage_path)) for point in points]
    return out


def seedless(cfg) -> dict[str, Any]:
    """A stage config as data without what names its seed or its storage: the seed, the
    parent's keys (they hash the seed) and the parent's checkpoint path."""
    d = cfg.to_dict()
    d["train"].pop("seed")
    if d.get("parent"):
        d["parent"] = {k: v for k, v in d["parent"].items() if k not in ("key", "group", "checkpoint")}
    return d


def resolved_stages(configs) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """sweep -> point (without its seed) -> its stages' resolved configs (seedless), from
    sweep_stage_configs."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name, point, cfgs in configs:
        label = ", ".join(f"{k}={v}" for k, v in sorted(point.items()) if k != "seed")
        out.setdefault(name, {})[label] = [seedless(c) for c in cfgs]
    return out


def stages_digest(configs) -> str:
    return digest(resolved_stages(configs), DIGEST_LENGTH)


def stage_shapes(configs) -> list[tuple[str, Any]]:
    """Every distinct stage config among sweep_stage_configs's, in sweep order: (label,
    config), one per (stage, model, task, batch, context, data start)."""
    seen, out = set(), []
    for name, _, cfgs in configs:
        for cfg in cfgs:
            shape = (cfg.stage, cfg.model, cfg.task, cfg.train.batch_size, cfg.train.seq_len, cfg.train.data_start)
            if shape not in seen:
                seen.add(shape)
                where = f" from sample {cfg.train.data_start}" if cfg.train.data_start else ""
                out.append((f"{name} {cfg.stage} {cfg.model.n_layers}⊗{cfg.model.n_loops}{where}", cfg))
    return out


# ---- behaviour -----------------------------------------------------------------------------------


def behaviour(cfg, steps: int = BEHAVIOUR_STEPS) -> list[float]:
    """The losses of a stage's first `steps` optimizer steps on its first batch, from
    fresh weights of its seed, in its own mode, on one thread."""
    import torch

    from looplab.tasks import make_task
    from looplab.training.steps import optimizer_step

    task = make_task(cfg.task, cfg.train.seq_len)
    batch = task.train_batch(0, cfg.train.batch_size, cfg.train.seq_len, cfg.train.seed, start=cfg.train.data_start)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(cfg.train.seed)
        step, _ = optimizer_step(cfg, "cpu", batch)
        return [float(step()) for _ in range(steps)]
    finally:
        torch.set_num_threads(previous)


def training_fingerprint(configs) -> dict[str, list[float]]:
    """label -> behaviour() of every distinct stage shape among sweep_stage_configs's."""
    return {label: behaviour(cfg) for label, cfg in stage_shapes(configs)}


def behaviour_departures(declared: dict[str, list[float]], found: dict[str, list[float]]) -> list[str]:
    """One line per stage shape whose first steps differ from the declared ones."""
    lines = []
    for label in sorted(set(declared) | set(found)):
        want, got = declared.get(label), found.get(label)
        if want is None or got is None:
            lines.append(
                f"stage shape {label!r} is {'new' if want is None else 'gone'} since the protocol was declared"
            )
            continue
        worst = max((abs(g - w) / max(abs(w), 1e-12) for w, g in zip(want, got)), default=0.0)
        if len(want) != len(got) or worst > BEHAVIOUR_RTOL:
            lines.append(
                f"{label}: its first steps' losses are {_floats(got)}, declared {_floats(want)} "
                f"(relative difference {worst:.1e} > {BEHAVIOUR_RTOL:g}): the code computes something else"
            )
    return lines


def _floats(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


# ---- the analysis ----------------------------------------------------------------------------------


def _synthetic_points():
    """Evaluation points of a small gated sweep whose curves are closed forms of the
    seed: the trials paper_mini's claims read (Ouro, CHASE, Ouro continued, the fixed
    arm continued at 1⊗4; the pre-trained 1⊗1, 1⊗4, 4⊗1), three seeds, R = 4."""
    import polars as pl

    from looplab import tracking

    rows = []
    qs = (0.2, 0.4, 0.6, 0.8, 1.0)

    def point(trial, seed, method, stage, final, policy, loops, ppl, depth=None, q=None, layers=1, n_loops=4):  # noqa: PLR0913 - one row's columns
        rows.append(
            {
                "experiment": "fingerprint",
                "trial_run_id": trial,
                "trial_key": trial,
                "seed": seed,
                "method": method,
                "stage": stage,
                "is_final_stage": final,
                "policy": policy,
                tracking.EXECUTED_LOOPS: float(loops),
                "loss": math.log(ppl),
                tracking.PPL: ppl,
                tracking.ACCURACY: min(0.99, 2.0 / ppl),
                "depth": depth,
                "q": q,
                "params.model.n_layers": layers,
                "params.model.n_loops": n_loops,
                "params.search.arm": trial.split("/")[0],
            }
        )

    def forced(trial, seed, method, stage, final, scale, layers=1, n_loops=4):
        for d in range(1, n_loops):
            point(trial, seed, method, stage, final, "forced", d, scale * (10 + 40 / d**2), depth=d, layers=layers)
        point(
            trial,
            seed,
            method,
            stage,
            final,
            "full",
            n_loops,
            scale * (10 + 40 / n_loops**2),
            layers=layers,
            n_loops=n_loops,
        )

    for seed in (0, 1, 2):
        s = 1 + 0.013 * seed
        for arm, method, penalty in (("ouro", "Ouro", 6.0), ("chase", "CHASE", 1.2), ("ouro-matched", "Ouro", 4.5)):
            trial = f"{arm}/{seed}"
            forced(trial, seed, "fixed", "pretrain", False, s * _jitter(trial, "pretrain"))
            own = 0.97 * s * _jitter(trial, "stage2")
            forced(trial, seed, method, "stage2", True, own)
            for q in qs:
                loops = 1.5 + 2.5 * q
                skip = own * (12.5 + penalty * _jitter(trial, "holes") * (1 - q))
                point(trial, seed, method, "stage2", True, "skip", loops, skip, q=q)
                point(trial, seed, method, "stage2", True, "dense", 4, own * (12.6 - q), q=q)
        trial = f"fixed-matched/{seed}"
        forced(trial, seed, "fixed", "pretrain_more", True, 0.99 * s * _jitter(trial, "more"))
        for (layers, n_loops), scale in (((1, 4), 1.0), ((1, 1), 1.06), ((4, 1), 0.9)):
            trial = f"fixed/{layers}x{n_loops}/{seed}"
            forced(trial, seed, "fixed", "pretrain", True, scale * s * _jitter(trial, "pretrain"), layers, n_loops)
    return pl.DataFrame(rows, infer_schema_length=None)


def _jitter(*names: object) -> float:
    """A fixed factor within ±2 % per name (CRC-32, the same in every process): seeds
    that differ unevenly between arms, so every claim has a spread to test."""
    import zlib

    return 1 + 0.04 * (zlib.crc32("/".join(map(str, names)).encode()) % 1000 / 1000 - 0.5)


def analysis_fingerprint() -> dict[str, list[float | None]]:
    """claim -> (mean, low, high, p) on the tested scale, from the claims code applied to
    _synthetic_points and a fixed set of prefill records, then Holm over every claim."""
    import polars as pl

    from analysis.claims import CLAIMS, SEARCHED, correct, hole_claims, loop_claims, speed_claims, trial_measures
    from looplab.tracking import LOOP_BOUND, PPL, SPEEDUP

    trials = trial_measures(_synthetic_points())
    arm = pl.col(SEARCHED + "arm")
    fixed = trials.filter(arm == "fixed").with_columns(
        pl.col("n_layers").cast(pl.Int64), pl.col("n_loops").cast(pl.Int64)
    )
    results = loop_claims(fixed, quality=PPL, looped=(1, 4), base=(1, 1), deep=(4, 1))
    results += hole_claims(
        trials.filter(arm.is_in(["ouro", "chase"])),
        matched_ouro=trials.filter(arm == "ouro-matched"),
        matched_fixed=trials.filter(arm == "fixed-matched"),
    )
    records = [
        {
            "batch": b,
            "seq_len": 128,
            "policy": "skip:0.2",
            SPEEDUP: v,
            LOOP_BOUND: 2.4,
            "seed": seed,
            "packing": packing,
        }
        for seed in (0, 1, 2)
        for b, packing, v in (
            (1, "auto", 1.6 + 0.05 * seed),
            (64, "auto", 2.0 + 0.03 * seed**2),
            (64, "padded", 1.7 - 0.02 * seed),
        )
    ]
    results += speed_claims(records)
    out: dict[str, list[float | None]] = {}
    for r in correct(results, tuple(c for c in CLAIMS if c in {x.claim.id for x in results})):
        t = r.tested
        out[r.claim.id] = [_round(v) for v in (t.mean, t.low, t.high, r.p, r.p_adjusted)]
    return out


def _round(v: float | None) -> float | None:
    """Ten significant digits: far beyond what any change of definition leaves alone,
    far above the last bits libm may round differently on another machine."""
    return None if v is None else float(f"{v:.10g}")


def analysis_digest() -> str:
    return digest(analysis_fingerprint(), DIGEST_LENGTH)


# ---- the machine ------------------------------------------------------------------------------------


def machine_class() -> str:
    """This machine as its kernels see it: tracking.hardware() without the torch part."""
    from looplab.tracking import hardware

    return " · ".join(part for part in hardware().split(" · ") if not part.startswith("torch "))


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def current_pins(pins, sweeps, seed: int, *, behaviour_too: bool = True):
    """The Pins this checkout and machine would declare now (the declared ones with every
    checked field recomputed, the sweeps' stage configs built once): what `departures`
    compares, and what a new protocol pastes into its declaration (python
    sweeps/paper_mini.py --pins)."""
    configs = sweep_stage_configs(sweeps, seed)
    return replace(
        pins,
        torch=torch_version(),
        machine=machine_class(),
        stages=stages_digest(configs),
        analysis=analysis_digest(),
        behaviour=training_fingerprint(configs) if behaviour_too else pins.behaviour,
    )


def departures(pins, sweeps, seed: int, *, behaviour_too: bool = True) -> list[str]:
    """One line per way this checkout and machine depart from the declared pins (empty:
    none). behaviour_too=False leaves out the stage shapes' first steps (a quick look)."""
    now = current_pins(pins, sweeps, seed, behaviour_too=behaviour_too)
    lines = []
    if now.torch != pins.torch:
        lines.append(f"torch {now.torch} is installed; the protocol was declared under torch {pins.torch}")
    if now.machine != pins.machine:
        lines.append(f"this machine is {now.machine!r}; the protocol's machine class is {pins.machine!r}")
    if now.stages != pins.stages:
        lines.append(
            f"the stages' resolved configs hash to {now.stages}, declared {pins.stages}: a preset, a recipe, "
            "an override or the data stream moved"
        )
    if now.analysis != pins.analysis:
        lines.append(
            f"the claims code computes {now.analysis} on its fixed input, declared {pins.analysis}: a measure's "
            "definition, a test or the correction moved"
        )
    if behaviour_too:
        lines += behaviour_departures(pins.behaviour, now.behaviour)
    return lines
