"""Where the time goes: torch profiler tables (top operations by self CPU time) of one
`debug` training step and of decoding on a d 256, 4-layer Mamba-2 at batch 1, each eager
and compiled, as markdown (docs/benchmarks.md keeps them).

    python benchmarks/profile_steps.py [--threads 1] [--rows 12] [--markdown profiles.md]

Each profile covers `--steps` calls after warm-ups (the compiled ones warm up through
their compilation), so per-call figures are the table's totals over that count.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from looplab.arguments import Parser, add_flags, at_least, flag, flags_of

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def training_step(compiled: bool):
    from looplab.config import apply_overrides
    from looplab.presets import get_preset
    from looplab.training.steps import optimizer_step

    cfg = apply_overrides(get_preset("debug"), {"train.compile": "on" if compiled else "off"})
    step, _ = optimizer_step(cfg, "cpu")
    return step


def decoding(compiled: bool):
    from suite import looplab_decoder

    (setup, run), _ = looplab_decoder(1, compiled)

    def decode():
        with torch.no_grad():
            run(setup())

    return decode


def table(fn, steps: int, rows: int) -> tuple[str, float]:
    """The top `rows` operations by self CPU time over `steps` calls, and ms per call."""
    for _ in range(2):
        fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    averages = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in averages)  # µs
    lines = ["| operation | self ms per call | share | calls per call |", "|---|---|---|---|"]
    for e in averages[:rows]:
        lines.append(
            f"| `{e.key}` | {e.self_cpu_time_total / steps / 1e3:.2f} | "
            f"{e.self_cpu_time_total / total:.0%} | {e.count / steps:g} |"
        )
    return "\n".join(lines), total / steps / 1e3


@dataclass(frozen=True)
class Options:
    """The benchmark's flags (looplab/arguments.py flag)."""

    threads: int = flag(1, "torch threads", type=at_least(1))
    steps: int = flag(3, "profiled calls of each, after two warm-ups", type=at_least(1))
    rows: int = flag(12, "operations per table", type=at_least(1))
    markdown: str | None = flag(None, "write the tables here (default: print them)")


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0])
    add_flags(p, Options)
    opts = flags_of(Options, p.parse_args(argv))
    torch.set_num_threads(opts.threads)
    parts = [
        f"Profiles with {opts.threads} thread(s), {opts.steps} calls each (torch {torch.__version__}); "
        "the profiler's own overhead inflates small operations alike in both."
    ]
    for title, make, unit in (
        ("`debug` training step (batch 16 × 128, pretrain)", training_step, "step"),
        ("decoding 32 tokens, d 256 4-layer Mamba-2, batch 1", decoding, "32 tokens"),
    ):
        for compiled in (False, True):
            text, ms = table(make(compiled), opts.steps, opts.rows)
            parts.append(
                f"#### {title}, {'compiled' if compiled else 'eager'}: {ms:.1f} ms of self CPU time "
                f"per {unit}\n\n{text}"
            )
            print(parts[-1].split("\n")[0], file=sys.stderr, flush=True)
    out = "\n\n".join(parts) + "\n"
    if opts.markdown:
        Path(opts.markdown).write_text(out)
    else:
        print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
