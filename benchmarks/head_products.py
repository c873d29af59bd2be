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
from functools import partial

import torch

from looplab.costs.timing import median_seconds
from looplab.models.head import chunk_tokens_for
from looplab.presets import get_preset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="local")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", default="", help="tokens per chunk, comma-separated (default: the head's own)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default="", help="also write the figures (fractions of the peak) here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = get_preset(args.preset).model
    d, V = cfg.d_model, cfg.vocab_size
    chunks = [int(c) for c in args.chunks.split(",") if c] or [chunk_tokens_for(V)]
    torch.manual_seed(0)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    peak = 2 * 2048**3 / median_seconds(lambda: a @ b, args.repeats, warmup=1)
    print(f"{args.preset}: d {d}, vocab {V}, {args.threads} threads; fp32 GEMM 2048³: {peak / 1e9:.1f} GFLOP/s")
    print("chunk  logits x Wᵀ  grad_x P̃ W  grad_W += P̃ᵀ x  softmax (of the three products' time at peak)")
    w = torch.randn(V, d)
    rows = []
    for n in chunks:
        x, p = torch.randn(n, d), torch.randn(n, V)
        z, grad_w = torch.empty(n, V), torch.zeros(V, d)
        ideal = 2 * n * d * V / peak  # one product at the peak
        logits = median_seconds(partial(torch.mm, x, w.t(), out=z), args.repeats, warmup=1)
        grad_x = median_seconds(partial(torch.mm, p, w), args.repeats, warmup=1)
        grad_w_s = median_seconds(partial(grad_w.addmm_, p.t(), x), args.repeats, warmup=1)
        softmax = median_seconds(partial(torch.softmax, z, dim=1, out=p), args.repeats, warmup=1)
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(preset=args.preset, threads=args.threads, gemm_flops=peak, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
