"""How close the chunked head's products run to the GEMM peak (models/head.py).

    python benchmarks/head_products.py [--preset local] [--threads 2] [--chunks 256,524,2048] [--json out.json]

The head's weighted form runs three products per chunk of n tokens (d_model d, vocab
V): the logits x Wᵀ (n×d · d×V), grad_x = P̃ W (n×V · V×d) and grad_W += P̃ᵀ x
(V×n · n×d), each 2·n·d·V FLOPs, plus a softmax over the n × V logits. Each is timed
here (median of repeats) against a 2048³ matmul of the same run, so the head's time
at the GEMM peak can be set beside the stage steps of benchmarks/lean_head.py: the
Stage-1 ÷ pre-training step ratio is (rest + R·head) / (rest + head), and the head is
the only part that differs.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from functools import partial

import torch

from looplab.arguments import Parser, add_flags, at_least, flag, flags_of, ints_at_least, one_of
from looplab.costs.timing import median_seconds
from looplab.models.head import chunk_tokens_for
from looplab.presets import PRESETS, get_preset


@dataclass(frozen=True)
class Options:
    """The benchmark's flags (looplab/arguments.py flag)."""

    preset: str = flag("local", "the model's shape (d_model, vocab)", type=one_of(*sorted(PRESETS)), metavar="PRESET")
    threads: int = flag(2, "torch threads", type=at_least(1))
    chunks: list[int] | None = flag(
        None, "tokens per chunk, comma-separated (default: the head's own)", type=ints_at_least(1)
    )
    repeats: int = flag(5, "timed runs of each product, after one warm-up", type=at_least(1))
    json: str = flag("", "also write the figures (fractions of the peak) here")


def main() -> None:
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(ap, Options)
    opts = flags_of(Options, ap.parse_args())
    torch.set_num_threads(opts.threads)
    cfg = get_preset(opts.preset).model
    d, V = cfg.d_model, cfg.vocab_size
    chunks = opts.chunks or [chunk_tokens_for(V)]
    torch.manual_seed(0)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    peak = 2 * 2048**3 / median_seconds(lambda: a @ b, opts.repeats, warmup=1)
    print(f"{opts.preset}: d {d}, vocab {V}, {opts.threads} threads; fp32 GEMM 2048³: {peak / 1e9:.1f} GFLOP/s")
    print("chunk  logits x Wᵀ  grad_x P̃ W  grad_W += P̃ᵀ x  softmax (of the three products' time at peak)")
    w = torch.randn(V, d)
    rows = []
    for n in chunks:
        x, p = torch.randn(n, d), torch.randn(n, V)
        z, grad_w = torch.empty(n, V), torch.zeros(V, d)
        ideal = 2 * n * d * V / peak  # one product at the peak
        logits = median_seconds(partial(torch.mm, x, w.t(), out=z), opts.repeats, warmup=1)
        grad_x = median_seconds(partial(torch.mm, p, w), opts.repeats, warmup=1)
        grad_w_s = median_seconds(partial(grad_w.addmm_, p.t(), x), opts.repeats, warmup=1)
        softmax = median_seconds(partial(torch.softmax, z, dim=1, out=p), opts.repeats, warmup=1)
        rows.append(
            dict(
                chunk=n,
                logits=ideal / logits,
                grad_x=ideal / grad_x,
                grad_w=ideal / grad_w_s,
                softmax=softmax / (3 * ideal),
            )
        )
        r = rows[-1]
        print(f"{n:5d}  {r['logits']:11.0%}  {r['grad_x']:11.0%}  {r['grad_w']:15.0%}  {r['softmax']:7.0%}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(dict(preset=opts.preset, threads=opts.threads, gemm_flops=peak, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
