"""Peak memory of one training step on one device: the documented model behind the
resource plan (sweeps' dry run, `--gpu-memory`).

    peak        = persistent + max(backward, optimizer step)
    persistent  = weights (fp32) + AdamW's two moments (fp32, trainable parameters)
    backward    = gradients (fp32, trainable) + saved activations of one micro-batch
                  + the head's buffers + backward's working set
    optimizer   = gradients + the foreach AdamW temporary (CUDA: one fp32 copy of the
                  trainable parameters; CPU runs the per-tensor loop, no copy)

Saved activations are counted per token, per block, from the tensors autograd keeps
for backward (tests/test_memory.py checks every formula against a count of the saved
tensors of a real forward, and the whole model against the measured peak on CPU):

    path "torch" (CPU, LOOPLAB_FORCE_TORCH): looplab's own chunked SSD, fp32 throughout
    path "cuda"  mamba-ssm's fused scan and causal-conv1d (they save only their inputs
                 and outputs), activations in the autocast dtype (bf16) where autocast
                 casts them and fp32 where looplab upcasts (norms, the residual stream)

A looped model keeps R loops' activations (every loop's blocks run again on the same
tokens). With activation checkpointing (train.activation_checkpointing) it keeps
each loop's input (the fp32 residual stream, d per token) and, during backward, one
loop's activations at a time. A stage that trains the gate alone (Stage-2) runs the
model without a graph, so it keeps only the R states the gate reads. CHASE's peak is
its dense branch (Stage-1's); its hole branches run fewer tokens through the deeper
loops. What differs between stages comes from their facts (looplab/stages.py): what
they train (Stage.trains_model), how many loops' outputs their loss reads
(Stage.loops_read) and whether they use the gate (Stage.gated).

The head (models/head.py) holds one chunk of logits in the compute dtype and one in
fp32, the LM head weight in the compute dtype under autocast, and, in the weighted
form every trained stage uses, the LM head's fp32 gradient from forward to backward.

Notation (ModelConfig): d = d_model, di = expand·d, n = d_state, g = ngroups,
H = di / headdim heads, Q = chunk_size, cd = di + 2gn (the conv's channels),
dp = 2di + 2gn + H (in_proj's width), nc = ⌈L/Q⌉ chunks; attention: nh heads,
rope = rope_dim; MLP: f = d_intermediate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from looplab.config import ExperimentConfig, ModelConfig
from looplab.stages import Stage, get_stage

FP32 = 4
PATHS = ("torch", "cuda")
GiB = 2**30


def activation_bytes(cfg: ExperimentConfig, path: str) -> int:
    """Bytes per element of the activations autocast produces: bf16 on the CUDA path
    under train.precision auto or bf16, and fp32 on the CPU's torch path (bf16
    autocast is opt-in there)."""
    precision = cfg.train.precision
    if precision == "bf16" or (precision == "auto" and path == "cuda"):
        return 2
    return FP32


# ---- saved activations, bytes per token ---------------------------------------------------


def mamba2_block(c: ModelConfig, seq_len: int, path: str, a: int) -> float:
    """One pre-norm residual Mamba-2 block (norm → mixer)."""
    d, n, g, Q = c.d_model, c.d_state, c.ngroups, c.chunk_size
    di = c.expand * d
    H = di // c.headdim
    cd, dp = di + 2 * g * n, 2 * di + 2 * g * n + H
    if path == "torch":
        # fp32. Before the scan, per token: the block's norm (input, normalised, rstd) and
        # in_proj's input; in_proj's output (its z slice is kept); the conv's input copy,
        # its output and the SiLU's output (x, B, C are views of it); dt before softplus.
        before = 3 * d + 1 + dp + 3 * cd + H
        # The chunked scan, per position of the sequence padded to nc·Q: dt in chunk
        # layout, the cumulative decay, the decay to the chunk end and from its start;
        # the intra-chunk decay and its product with C·B (H·Q each) and C·B (g·Q); C and
        # B broadcast over heads (2·H·n); x·dt and its bmm layouts, and C·S_enter (4·di);
        # chunk states and entering states (di·n/Q each); B and C copied for C·Bᵀ when
        # their layout is not already batched (several groups, or padding), and the
        # padded copy of x when L is not a multiple of Q.
        nc = math.ceil(seq_len / Q)
        padded = nc * Q != seq_len
        per_position = (
            4 * H
            + 2 * H * Q
            + g * Q
            + 2 * H * n
            + 4 * di
            + 2 * di * n / Q
            + (2 * g * n if g > 1 or padded else 0)
            + (di if padded else 0)
        )
        scan = per_position * nc * Q / seq_len + H * (nc + 1) * nc / seq_len  # + the chunk-passing matrix
        # After it: y, SiLU(z), their product, its normalised form and out_proj's input
        # (5·di), and the gated norm's rstd per group.
        return FP32 * (before + scan + 5 * di + g)
    # cuda: the norm in fp32 and in_proj's input in the autocast dtype; in_proj's
    # output; causal-conv1d's input (a channel-last copy unless xBC's strides already
    # fit, models/ops/causal_conv1d_layout.py) and output; the fused scan saves its
    # output and dA_cumsum (fp32) beside views of those; the gated norm's SiLU(z),
    # product and normalised output in fp32 (under autocast also its fp32 copies of y
    # and z), and out_proj's input.
    c8 = cd + (-cd) % 8
    conv_in = 0 if (cd % 8 == 0 and dp % 8 == 0 and di % 8 == 0) else c8
    upcasts = 2 * FP32 * di if a != FP32 else 0
    return (
        FP32 * (2 * d + 1)
        + a * d
        + a * dp
        + a * (conv_in + c8)
        + a * di
        + FP32 * H
        + FP32 * (3 * di + g)
        + upcasts
        + a * di
    )


def attention_block(c: ModelConfig, seq_len: int, path: str, a: int) -> float:
    """One pre-norm residual attention block (norm → RoPE attention); flash or
    memory-efficient SDPA keeps O(L) per query (its output and log-sum-exp)."""
    d, nh, rope = c.d_model, c.d_model // c.attn_head_dim, c.rope_dim
    if path == "torch":
        # norm (3), qkv's output (3), rotated q and k, SDPA's output, the MLP-free
        # out_proj input being SDPA's output itself; cos/sin per call; lse per head.
        return FP32 * (9 * d + 1 + 2 * rope + nh)
    # cuda: the norm in fp32; qkv input, output, rotated q and k and SDPA's output in
    # the autocast dtype; RoPE's fp32 angles and upcast rotary halves of q and k.
    return FP32 * (2 * d + 1) + a * (d + 3 * d + 2 * d + d) + FP32 * (rope + 2 * nh * rope + nh)


def mlp_block(c: ModelConfig, path: str, a: int) -> float:
    """One pre-norm residual SwiGLU block: norm, fc1's input and output, SiLU(gate),
    fc2's input."""
    d, f = c.d_model, c.d_intermediate
    assert f is not None  # ModelConfig resolved None (auto) to an int
    if path == "torch":
        return FP32 * (3 * d + 1 + 4 * f)
    return FP32 * (2 * d + 1) + a * (d + 2 * f + 2 * f)


def loop_activations(c: ModelConfig, seq_len: int, path: str, a: int) -> float:
    """Bytes per token that one application of the N-layer backbone saves."""
    total = 0.0
    for kind in c.layer_kinds():
        if kind == "mamba2":
            total += c.mixers_per_layer * mamba2_block(c, seq_len, path, a)
        else:
            total += attention_block(c, seq_len, path, a)
            if c.arch == "transformer" and c.d_intermediate:  # resolved: an int, 0 = no MLP
                total += mlp_block(c, path, a)
    return total


def largest_block(c: ModelConfig, seq_len: int, path: str, a: int) -> float:
    kinds = set(c.layer_kinds())
    sizes = [mamba2_block(c, seq_len, path, a)] if "mamba2" in kinds else []
    if "attention" in kinds:
        sizes.append(attention_block(c, seq_len, path, a))
        if c.arch == "transformer" and c.d_intermediate:  # resolved: an int, 0 = no MLP
            sizes.append(mlp_block(c, path, a))
    return max(sizes)


def readout_activations(c: ModelConfig, stage: Stage) -> float:
    """Bytes per token outside the loops, all fp32 (the residual stream): the final
    norm's input and rstd and the weighted head's gradient to its input, for every
    step the loss reads (R for Stage-1 and CHASE, one for pre-training), and, for a
    stage that uses the gate, its logit, λ and π per step (counted on the CPU)."""
    per_step = 3 * c.d_model + 3 + (6 if stage.gated else 0)
    return FP32 * stage.loops_read(c.n_loops) * per_step


# ---- the step --------------------------------------------------------------------------


@dataclass(frozen=True)
class StepMemory:
    """Bytes on one device for one optimizer step (module docstring), by phase."""

    weights: int
    optimizer_state: int
    gradients: int
    activations: int  # saved for backward: every loop's, or with checkpointing every loop's input
    head_buffers: int  # one chunk's logits and softmax, the LM head cast for autocast (forward only)
    head_gradient: int  # the weighted head's LM-head gradient, formed in forward, held into backward
    recompute: int  # checkpointing: one loop's activations, recomputed during backward
    working: int  # backward's transient: one block's gradients in flight (without checkpointing)
    optimizer_step: int
    embedding_gradient: int = 0  # part of `gradients`
    accumulating: bool = False  # more than one micro-batch per rank and step

    @property
    def persistent(self) -> int:
        return self.weights + self.optimizer_state

    @property
    def forward(self) -> int:
        """At the end of forward, inside the head: everything saved, the chunk buffers,
        and with accumulation the gradients of the micro-batches before."""
        return self.activations + self.head_buffers + self.head_gradient + (self.gradients if self.accumulating else 0)

    @property
    def backward(self) -> int:
        """Early in backward (bounded above): the saved activations, a recomputed loop
        and one block's working set, beside the gradients made so far: all but the
        embedding's, which is the last to come (the head's own gradient, held from
        forward, has become the LM head's by then)."""
        return self.activations + self.gradients - self.embedding_gradient + self.recompute + self.working

    @property
    def peak(self) -> int:
        return self.persistent + max(self.forward, self.backward, self.gradients + self.optimizer_step)

    def breakdown(self) -> str:
        parts = [
            ("weights", self.weights),
            ("AdamW", self.optimizer_state),
            ("grads", self.gradients),
            ("activations", self.activations),
            ("head", self.head_buffers + self.head_gradient),
            ("recompute", self.recompute),
            ("working", self.working),
        ]
        return ", ".join(f"{name} {gib(b)}" for name, b in parts if b)


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= 0.1 * GiB else f"{n / 2**20:.0f} MiB"


def parameter_counts(c: ModelConfig) -> tuple[int, int, int, int]:
    """(all parameters, the LM head's, the embedding's, the gate's), from the model
    built on the meta device: exact for every architecture, and costs no memory."""
    import torch

    from looplab.models.looped import LoopedLM

    with torch.device("meta"):
        model = LoopedLM(c)
    return (
        model.num_parameters(),
        model.lm_head.weight.numel(),
        model.embedding.weight.numel(),
        sum(p.numel() for p in model.exit_gate.parameters()),
    )


def training_state_bytes(c: ModelConfig) -> int:
    """A training checkpoint's size on disk, near enough to plan room for: the weights and
    AdamW's two moments, float32 each (the JSON beside them is a few KB)."""
    return 3 * 4 * parameter_counts(c)[0]


def step_memory(
    cfg: ExperimentConfig, micro_batch: int, *, ranks: int = 1, path: str = "cuda", checkpointing: bool | None = None
) -> StepMemory:
    """The model's estimate for cfg's stage with micro_batch rows per forward (each of
    the task's row length: train.seq_len, or a whole p-hop sample), the global batch
    split over `ranks` devices (checkpointing: default cfg.train.activation_checkpointing)."""
    from looplab.models.head import chunk_tokens_for

    if path not in PATHS:
        raise ValueError(f"path={path!r} is invalid; allowed: {' | '.join(PATHS)}")
    c, L, stage = cfg.model, cfg.task.row_length(cfg.train.seq_len), get_stage(cfg.stage)
    ckpt = cfg.train.activation_checkpointing if checkpointing is None else checkpointing
    a = activation_bytes(cfg, path)
    tokens = micro_batch * L
    params, head_params, embedding_params, gate_params = parameter_counts(c)
    frozen = not stage.trains_model  # only the gate trains: the model's forward builds no graph
    trainable = gate_params if frozen else params
    loop, block = loop_activations(c, L, path, a), largest_block(c, L, path, a)
    R, recompute = c.n_loops, 0.0
    working, activations = 0.0, 0.0
    if frozen:  # no graph through the backbone: the R states the gate reads, stacked and
        activations = 3 * FP32 * R * c.d_model  # normalised again for the head
    elif ckpt:  # every loop's input (the fp32 residual stream); one loop at a time in backward, its
        # recomputed tensors released as backward uses them (that bounds the working set too)
        activations, recompute = FP32 * R * c.d_model + readout_activations(c, stage), loop
    else:
        activations, working = R * loop + readout_activations(c, stage), block
    chunk = min(chunk_tokens_for(c.vocab_size), tokens * stage.loops_read(R))
    head_buffers: float = chunk * c.vocab_size * (a + FP32) + (head_params * a if a != FP32 else 0)
    if frozen:  # the backbone's forward without a graph: one block's tensors at a time
        head_buffers = max(head_buffers, tokens * block)
    return StepMemory(
        weights=FP32 * params,
        optimizer_state=2 * FP32 * trainable,
        gradients=FP32 * trainable,
        activations=int(tokens * activations),
        head_buffers=int(head_buffers),
        head_gradient=0 if frozen else FP32 * head_params,
        recompute=int(tokens * recompute),
        working=int(tokens * working),
        optimizer_step=FP32 * trainable if path == "cuda" else 0,
        embedding_gradient=0 if frozen else FP32 * embedding_params,
        accumulating=micro_batch < cfg.train.batch_size // ranks,
    )


# ---- inference ---------------------------------------------------------------------------


def forward_memory(c: ModelConfig, rows: int, tokens: int, path: str = "torch") -> int:
    """Bytes of a forward without a graph (inference: a prefill, an evaluation batch) over
    rows × tokens, beside the weights: the int64 ids, the fp32 residual stream into and
    out of a block, and one block's tensors at a time, counted as the largest block's
    saved activations (the figure step_memory gives a frozen model's forward). Measured
    on CPU (fp32, the torch path, debug and local shapes): a Mamba-2 forward's peak was
    0.51-0.53 of it, a transformer's 0.95; an estimate that leans high, for refusing what
    cannot fit (costs/machine.py)."""
    block = largest_block(c, tokens, path, FP32)
    return int(rows * tokens * (8 + 2 * FP32 * c.d_model + block))


def decode_cache_bytes(c: ModelConfig, rows: int, capacity: int) -> int:
    """The decoding cache of `rows` rows (models/cache.py, fp32): every loop's state of
    every stateful block and the scratch slot, as the blocks allocate it (built on the
    meta device: exact, no memory). Attention keeps keys and values for `capacity` positions, growing with the
    tokens; a Mamba-2 block's conv and SSM states do not depend on it."""
    import torch

    from looplab.models.cache import storage_slots
    from looplab.models.layers import GatedMLP
    from looplab.models.looped import LoopedLM

    meta = torch.device("meta")
    with meta:
        model = LoopedLM(c)
    total = 0
    for block in model.backbone.residual_blocks():
        if not isinstance(block.inner, GatedMLP):  # the stateful mixers (a cache_kind, new_state)
            state = block.inner.new_state(storage_slots(c.n_loops, rows), capacity, meta, torch.float32)
            total += sum(t.numel() * t.element_size() for t in vars(state).values())
    return total
