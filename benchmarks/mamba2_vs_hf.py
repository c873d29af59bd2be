"""fwd+bwd tokens/s of a Mamba-2 mixer stack: looplab's torch SSD vs HuggingFace
transformers' Mamba2 torch path, same sizes, measured side by side in one process.

    pip install -e '.[bench]'
    python benchmarks/mamba2_vs_hf.py [--json out.json]

Both stacks are N pre-norm residual blocks (RMSNorm → Mamba-2 mixer) plus a final
RMSNorm, fed the same random embeddings, fp32 on CPU. The two are timed in
alternation (warm-up first, then the median of repeats) so that background load
hits both alike.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn as nn


def looplab_stack(args) -> nn.Module:
    from looplab.models.layers import Residual, RMSNorm
    from looplab.models.mamba2 import Mamba2

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(
                Residual(
                    args.d_model,
                    Mamba2(args.d_model, args.d_state, 4, args.expand, args.headdim, 1, args.chunk_size),
                    1e-5,
                )
                for _ in range(args.layers)
            )
            self.norm_f = RMSNorm(args.d_model)

        def forward(self, x):
            for b in self.blocks:
                x = b(x, None)
            return self.norm_f(x)

    return Stack()


def hf_config(args, vocab_size: int = 16, use_cache: bool = False):
    """transformers' Mamba2Config at looplab's shape (one group, conv width 4)."""
    from transformers import Mamba2Config

    return Mamba2Config(
        hidden_size=args.d_model,
        num_hidden_layers=args.layers,
        expand=args.expand,
        head_dim=args.headdim,
        num_heads=args.expand * args.d_model // args.headdim,
        state_size=args.d_state,
        n_groups=1,
        chunk_size=args.chunk_size,
        conv_kernel=4,
        vocab_size=vocab_size,
        use_cache=use_cache,
    )


def hf_stack(args) -> nn.Module:
    from transformers import Mamba2Model

    model = Mamba2Model(hf_config(args))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(inputs_embeds=x, use_cache=False).last_hidden_state

    return Stack()


def time_fwd_bwd(model: nn.Module, x: torch.Tensor) -> float:
    model.zero_grad(set_to_none=True)
    t = time.perf_counter()
    out = model(x)
    out.float().pow(2).mean().backward()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--expand", type=int, default=2)
    p.add_argument("--headdim", type=int, default=64)
    p.add_argument("--d-state", type=int, default=64)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", help="write the record here")
    args = p.parse_args()

    torch.manual_seed(0)
    x = torch.randn(args.batch, args.seq_len, args.d_model)
    stacks = {"looplab": looplab_stack(args), "hf": hf_stack(args)}
    for m in stacks.values():
        m.train()
    # The two stacks must have the same parameter count, or the comparison is off.
    n_params = {k: sum(p.numel() for p in m.parameters() if p.requires_grad) for k, m in stacks.items()}
    n_params["hf"] -= stacks["hf"].model.embeddings.weight.numel()  # unused: fed embeddings directly

    times = {k: [] for k in stacks}
    for i in range(args.warmup + args.repeats):
        for k, m in stacks.items():
            dt = time_fwd_bwd(m, x)
            if i >= args.warmup:
                times[k].append(dt)
    tokens = args.batch * args.seq_len
    record = {
        "config": vars(args),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "params": n_params,
    }
    for k in stacks:
        med = statistics.median(times[k])
        record[k] = {"median_s": med, "tokens_per_s": tokens / med, "all_s": times[k]}
    record["speedup"] = record["looplab"]["tokens_per_s"] / record["hf"]["tokens_per_s"]
    for k in stacks:
        print(
            f"{k:8s} {record[k]['tokens_per_s']:9,.0f} tok/s fwd+bwd  (median {record[k]['median_s']:.3f} s, "
            f"{n_params[k]:,} params)"
        )
    print(f"speedup looplab / hf: {record['speedup']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
