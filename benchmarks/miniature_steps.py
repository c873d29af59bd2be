"""Where the miniature's training time goes, stage by stage: every distinct stage shape
that `python sweeps/paper_mini.py` trains (its three sweeps, one seed: the seeds of a
shape cost alike), its step eager and compiled (train.compile=on), side by side in one
process, as a sweep's reused trial process would run them.

    python benchmarks/miniature_steps.py [--threads 1] [--repeats 8] [--cold] [--markdown out.md]

Per shape: the median step time eager and compiled (after a warm-up step each, on the
task's own batches), their ratio, the compiled arm's first step (its compilation, from
Inductor's on-disk cache unless --cold gives it an empty one; a later shape reuses what
an earlier one compiled in this process), the steps the protocol gives the stage, and
the training seconds per seed either way. The totals are one seed's: the miniature
trains each shape once per seed, on `--threads` threads per trial slot.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from looplab.arguments import Parser, add_flags, at_least, flag, flags_of  # torch-free: --cold comes first

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def stage_shapes(seed: int) -> list:
    """Every distinct stage config of the protocol's sweeps at one seed, in sweep order:
    (sweep, config)."""
    from sweeps.fingerprint import stage_shapes as shapes
    from sweeps.fingerprint import sweep_stage_configs
    from sweeps.paper_mini import sweeps_of

    seen, out = set(), []
    for label, cfg in shapes(sweep_stage_configs(list(sweeps_of().values()), seed)):
        shape = (cfg.stage, cfg.model, cfg.task, cfg.train.batch_size, cfg.train.seq_len)  # its data start aside:
        if shape not in seen:  # a step costs the same wherever in the stream its batch lies
            seen.add(shape)
            out.append((label.split()[0], cfg))
    return out


def timed_steps(cfg, repeats: int) -> tuple[float, float]:
    """(first step's seconds, median seconds of `repeats` steps after it and a warm-up)."""
    from looplab.costs.timing import median_seconds
    from looplab.tasks import make_task
    from looplab.training.steps import optimizer_step

    task = make_task(cfg.task, cfg.train.seq_len)
    batch = task.train_batch(0, cfg.train.batch_size, cfg.train.seq_len, cfg.train.seed, start=cfg.train.data_start)
    step, _ = optimizer_step(cfg, "cpu", batch)
    t = time.perf_counter()
    step()
    first = time.perf_counter() - t
    return first, median_seconds(step, repeats, warmup=1)


@dataclass(frozen=True)
class Options:
    """The benchmark's flags (looplab/arguments.py flag)."""

    threads: int = flag(1, "torch threads (a trial slot's; default 1)", type=at_least(1))
    repeats: int = flag(8, "timed steps of each arm, after one warm-up", type=at_least(1))
    seed: int = flag(0, "the protocol's seed whose stage shapes are timed", type=at_least(0))
    cold: bool = flag(False, "compile into an empty Inductor cache (a new machine's)")
    markdown: str | None = flag(None, "write the table here (default: print it)")


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0])
    add_flags(p, Options)
    opts = flags_of(Options, p.parse_args(argv))
    if opts.cold:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")
    import torch

    from looplab.config import apply_overrides

    torch.set_num_threads(opts.threads)
    rows, eager_total, compiled_total, first_total = [], 0.0, 0.0, 0.0
    for sweep, cfg in stage_shapes(opts.seed):
        _, eager = timed_steps(apply_overrides(cfg, {"train.compile": "off"}), opts.repeats)
        first, compiled = timed_steps(apply_overrides(cfg, {"train.compile": "on"}), opts.repeats)
        steps = cfg.train.steps
        eager_total, compiled_total, first_total = (
            eager_total + steps * eager,
            compiled_total + steps * compiled,
            first_total + first,
        )
        m = cfg.model
        rows.append(
            f"| {sweep} | {cfg.stage} | {m.n_layers}⊗{m.n_loops} d {m.d_model} | {eager * 1e3:.1f} | "
            f"{compiled * 1e3:.1f} | {compiled / eager:.2f} | {first:.1f} | {steps} | {steps * eager:.0f} | "
            f"{steps * compiled:.0f} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    cache = "an empty Inductor cache" if opts.cold else "the machine's Inductor cache"
    lines = [
        f"{opts.threads} thread(s), median of {opts.repeats} steps, torch {torch.__version__}, "
        f"{cache}; one seed's stages",
        "",
        "| sweep | stage | model | eager ms | compiled ms | ratio | compiled first step s | steps | "
        "eager s | compiled s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        f"| total | | | | | {compiled_total / eager_total:.2f} | {first_total:.0f} | | {eager_total:.0f} | "
        f"{compiled_total:.0f} |",
    ]
    text = "\n".join(lines) + "\n"
    if opts.markdown:
        Path(opts.markdown).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
