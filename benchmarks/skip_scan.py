"""Where skipping pays at decode: a scan of model width × cache slots at R loops, each
point the realised share of the FLOP ratio of skip (looplab/costs/arrival_bench.py:
decode tokens/s over the fastest full schedule's, over the FLOP ratio), drawn as a
grid with the points where skip overtakes the best full marked.

    PYTHONPATH=$PWD python benchmarks/skip_scan.py [--widths 64,128,256] [--slots 8,32]
        [--loops 4] [--policy skip:0.4] [--requests 32] [--repeats 3] [--compile on]
        [--threads 1] [--png scan.png] [--json scan.json]

Each width is the `debug` preset (bytes, 1⊗R) at that d_model, fresh weights with the
gate spread (arrival_bench.spread_gate, as `looplab bench-arrivals --gate-spread`), so
tokens exit at varied loops; both schedules (lockstep, depth) under full and the skip
policy, compiled by default (what bench-arrivals decodes with). A point's figure is the
better of the two skip schedules against the better of the two fulls. The last stdout
line is the JSON record.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

import torch

from looplab import tracking
from looplab.arguments import Parser, add_flags, at_least, flag, flags_of, ints_at_least
from looplab.costs.arrival_bench import ArrivalBench, bench_arrivals, spread_gate
from looplab.inference.arrivals import RequestStream
from looplab.models.compiled import compile_decoding
from looplab.models.looped import LoopedLM
from looplab.policy import FULL, ExitPolicy
from looplab.presets import get_preset


@dataclass(frozen=True)
class Options:
    """Where skipping pays at decode: model width × cache slots (module docstring)."""

    widths: str = flag("64,128,256", "comma-separated d_model values")
    slots: Any = flag((8, 32), "comma-separated cache rows served at once", type=ints_at_least(1))
    loops: int = flag(4, "R, the loops of every model", type=at_least(2))
    policy: str = flag("skip:0.4", "the skip policy")
    requests: int = flag(32, "requests in the stream", type=at_least(1))
    repeats: int = flag(3, "timed runs of each point", type=at_least(1))
    compile: Literal["on", "off"] = flag("on", "decode compiled (bench-arrivals' default) or eager")
    threads: int = flag(1, "torch threads", type=at_least(1))
    gate_spread: float = flag(5.0, "the fresh gate's weight spread (arrival_bench.spread_gate)")
    png: str = flag("", "draw the grid here")
    json: str = flag("", "write the record here")


def point(width: int, slots: int, o: Options) -> dict[str, Any]:
    """One width × slots point: the best skip schedule against the best full one."""
    cfg = get_preset("debug").model
    torch.manual_seed(0)  # the fresh weights, the same every run
    model = LoopedLM(dataclasses.replace(cfg, d_model=width, n_loops=o.loops)).eval()
    spread_gate(model, o.gate_spread, seed=0)
    torch._dynamo.reset()  # each width's graphs afresh: the recompile limit would leave later ones eager
    compile_decoding(model, o.compile == "on")
    policy = ExitPolicy.parse(o.policy)
    settings = ArrivalBench(
        RequestStream(requests=o.requests, prompt_len=(16, 64), new_tokens=(8, 32), seed=0),
        slots=(slots,),
        policies=(policy,),
        warmup=1,
        repeats=o.repeats,
    )
    records = bench_arrivals(model, None, settings)
    full = max((r for r in records if r.policy == FULL), key=lambda r: r.decode_tokens_per_s)
    skip = max((r for r in records if r.policy == policy.spec), key=lambda r: r.decode_tokens_per_s)
    return {
        "width": width,
        "slots": slots,
        "best_full": full.schedule,
        "best_skip": skip.schedule,
        tracking.MEAN_LOOPS: skip.mean_executed_loops,
        tracking.FLOP_RATIO: skip.flop_ratio,
        "vs_best_full": skip.vs_best_full,
        "realised": skip.realised,
        "pays": skip.vs_best_full > 1.0,
    }


def draw(points: list[dict[str, Any]], path: str, title: str) -> None:
    """The realised share per width × slots; a star where skip beats the best full."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = sorted({p["width"] for p in points})
    slots = sorted({p["slots"] for p in points})
    grid = [[next(p for p in points if p["width"] == w and p["slots"] == s)["realised"] for s in slots] for w in widths]
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(slots), 1.2 + 0.9 * len(widths)))
    image = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=max(1.0, max(max(row) for row in grid)), aspect="auto")
    for i, w in enumerate(widths):
        for j, s in enumerate(slots):
            p = next(p for p in points if p["width"] == w and p["slots"] == s)
            mark = " ★" if p["pays"] else ""
            ax.text(j, i, f"{p['realised']:.0%}{mark}\n{p['vs_best_full']:.2f}×", ha="center", va="center", color="w")
    ax.set_xticks(range(len(slots)), [str(s) for s in slots])
    ax.set_yticks(range(len(widths)), [str(w) for w in widths])
    ax.set_xlabel("cache slots")
    ax.set_ylabel("d_model")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="realised share of the FLOP ratio")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=Options.__doc__)
    add_flags(p, Options)
    o = flags_of(Options, p.parse_args(argv))
    widths = [int(w) for w in o.widths.split(",") if w.strip()]
    if not widths or any(w < 8 or w % 8 for w in widths):
        p.error(f"argument --widths: {o.widths!r} is invalid; allowed: comma-separated multiples of 8")
    torch.set_num_threads(o.threads)
    points = []
    for width in widths:
        for slots in o.slots:
            points.append(point(width, slots, o))
            q = points[-1]
            print(
                f"d_model {width:4d}  slots {slots:3d}  d̄ {q[tracking.MEAN_LOOPS]:.2f}  FLOP ratio "
                f"{q[tracking.FLOP_RATIO]:.2f}  {q['best_skip']} skip ÷ {q['best_full']} full {q['vs_best_full']:.2f}×  "
                f"realised {q['realised']:.0%}" + ("  (skip pays)" if q["pays"] else ""),
                flush=True,
            )
    title = f"{o.policy} at R={o.loops}, {o.compile == 'on' and 'compiled' or 'eager'}, {o.threads} thread(s)"
    if o.png:
        draw(points, o.png, title)
    record = {"policy": o.policy, "loops": o.loops, "compile": o.compile, "threads": o.threads, "points": points}
    if o.json:
        with open(o.json, "w") as f:
            json.dump(record, f, indent=2)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
