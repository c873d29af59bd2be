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

import dataclasses
import json
import platform
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from looplab.arguments import Parser, add_flags, at_least, flag, flags_of


@dataclass(frozen=True)
class Shape:
    """The stacks' shape, the same for both (flags: looplab/arguments.py flag)."""

    d_model: int = flag(256, "model width", type=at_least(1))
    layers: int = flag(4, "residual blocks", type=at_least(1))
    expand: int = flag(2, "the mixer's inner width ÷ d_model", type=at_least(1))
    headdim: int = flag(64, "channels per head", type=at_least(1))
    d_state: int = flag(64, "SSM state size", type=at_least(1))
    chunk_size: int = flag(64, "the SSD scan's chunk length", type=at_least(1))


@dataclass(frozen=True)
class Options:
    """What is timed, and where the record goes."""

    batch: int = flag(8, "sequences per step", type=at_least(1))
    seq_len: int = flag(512, "tokens per sequence", type=at_least(1))
    warmup: int = flag(2, "untimed steps first", type=at_least(0))
    repeats: int = flag(7, "timed steps of each stack", type=at_least(1))
    json: str | None = flag(None, "write the record here")


def looplab_stack(shape: Shape) -> nn.Module:
    from looplab.models.layers import Residual, RMSNorm
    from looplab.models.mamba2 import Mamba2

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(
                Residual(
                    shape.d_model,
                    Mamba2(shape.d_model, shape.d_state, 4, shape.expand, shape.headdim, 1, shape.chunk_size),
                    1e-5,
                )
                for _ in range(shape.layers)
            )
            self.norm_f = RMSNorm(shape.d_model)

        def forward(self, x):
            for b in self.blocks:
                x = b(x, None)
            return self.norm_f(x)

    return Stack()


def hf_config(shape: Shape, vocab_size: int = 16, use_cache: bool = False):
    """transformers' Mamba2Config at looplab's shape (one group, conv width 4)."""
    from transformers import Mamba2Config

    return Mamba2Config(
        hidden_size=shape.d_model,
        num_hidden_layers=shape.layers,
        expand=shape.expand,
        head_dim=shape.headdim,
        num_heads=shape.expand * shape.d_model // shape.headdim,
        state_size=shape.d_state,
        n_groups=1,
        chunk_size=shape.chunk_size,
        conv_kernel=4,
        vocab_size=vocab_size,
        use_cache=use_cache,
    )


def hf_stack(shape: Shape) -> nn.Module:
    from transformers import Mamba2Model

    model = Mamba2Model(hf_config(shape))

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
    p = Parser(description=__doc__.splitlines()[0])
    add_flags(p, Shape, Options)
    args = p.parse_args()
    shape, opts = flags_of(Shape, args), flags_of(Options, args)

    torch.manual_seed(0)
    x = torch.randn(opts.batch, opts.seq_len, shape.d_model)
    stacks = {"looplab": looplab_stack(shape), "hf": hf_stack(shape)}
    for m in stacks.values():
        m.train()
    # The two stacks must have the same parameter count, or the comparison is off.
    n_params = {k: sum(p.numel() for p in m.parameters() if p.requires_grad) for k, m in stacks.items()}
    n_params["hf"] -= stacks["hf"].model.embeddings.weight.numel()  # unused: fed embeddings directly

    times = {k: [] for k in stacks}
    for i in range(opts.warmup + opts.repeats):
        for k, m in stacks.items():
            dt = time_fwd_bwd(m, x)
            if i >= opts.warmup:
                times[k].append(dt)
    tokens = opts.batch * opts.seq_len
    record = {
        "config": dataclasses.asdict(shape) | dataclasses.asdict(opts),
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
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
