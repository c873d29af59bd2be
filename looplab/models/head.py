"""The readout's per-token cross-entropy without full logits (a fused linear +
cross-entropy, chunked over tokens).

A looped model reads every step through the same final norm and LM head, and the
continued-training objectives need the CE of every step: R full (B, L, V) logits
tensors (and their softmax in backward) would be alive at once. Here the logits of
one chunk of tokens exist at a time:

forward   per chunk: z = x Wᵀ (n × V), its log-softmax, the target's entry;
          keeps only the inputs (x, W, targets);
backward  per chunk: z again (recomputed: the price of not storing N × V), the
          softmax P, P̃ = P − onehot(t), then grad_x = s ⊙ (P̃ W) and
          grad_W += P̃ᵀ (s ⊙ x), s the incoming per-token gradient. The scale is
          applied to the thin (n × d) side of each product, never to the wide
          (n × V) buffer, which saves a full pass over it.

Positions whose target is IGNORE_INDEX get loss 0 and no gradient; their logits
are never computed (tasks with one answer position per sequence skip almost the
whole head). The norm runs before the fused part under ordinary autograd: its
output (N × d) is small, and one RMSNorm implementation stays the only one.

Precision: the products run in the autocast dtype when autocast is on (bf16 logits,
as the plain `lm_head` would give), in the inputs' dtype otherwise; the
(log-)softmax and grad_W's accumulation over chunks run in at least float32.

This module is the home of "readout → per-token loss"; objectives.py combines the
per-token losses of the steps into each stage's objective.
"""

from __future__ import annotations

import torch

from looplab.tasks.base import IGNORE_INDEX

# Bytes of float32 logits per chunk (the head holds two such buffers). Bounds the
# head's transient memory at any batch size while keeping the chunk's products
# large enough to run near the GEMM peak (512 tokens of a 32k vocabulary).
DEFAULT_CHUNK_BYTES = 64 * 2**20


def chunk_tokens_for(vocab_size: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Tokens per chunk so that one chunk's float32 logits take about chunk_bytes."""
    return max(1, chunk_bytes // (4 * vocab_size))


def _compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the plain `lm_head(x)` would multiply in."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return torch.promote_types(x.dtype, weight.dtype)


class _LinearCrossEntropy(torch.autograd.Function):
    """Per-token CE of the logits x Wᵀ against targets, chunked over tokens.
    x (N, d) real positions only (no IGNORE_INDEX targets), weight (V, d),
    targets (N,). Returns losses (N,) and, when asked, argmax == target (N,).
    Saves only its inputs: backward recomputes each chunk's softmax from x and W."""

    @staticmethod
    def forward(ctx, x, weight, targets, chunk, compute_dtype, want_correct):
        n_tok = x.shape[0]
        bufs = _ChunkBuffers(min(chunk, n_tok), weight, compute_dtype)
        losses = torch.empty(n_tok, dtype=bufs.acc, device=x.device)
        correct = torch.zeros(n_tok, dtype=torch.bool, device=x.device) if want_correct else None
        with torch.autocast(x.device.type, enabled=False):  # dtypes are chosen here, explicitly
            for s, e in _spans(n_tok, chunk):
                z = bufs.logits(x[s:e])
                if want_correct:
                    correct[s:e] = z.argmax(dim=1) == targets[s:e]
                # The fused log-softmax kernel (one read for the max, one for the sum,
                # one write) is about twice as fast on CPU as max / sub / exp / sum.
                logp = torch.log_softmax(z, dim=1, dtype=bufs.acc, out=bufs.out[:e - s])
                losses[s:e] = logp.gather(1, targets[s:e, None])[:, 0].neg_()
        ctx.save_for_backward(x, weight, targets)
        ctx.chunk, ctx.compute_dtype = chunk, compute_dtype
        if want_correct:
            ctx.mark_non_differentiable(correct)
        return losses, correct

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_losses, _grad_correct):
        x, weight, targets = ctx.saved_tensors
        chunk, compute_dtype = ctx.chunk, ctx.compute_dtype
        n_tok = x.shape[0]
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        bufs = _ChunkBuffers(min(chunk, n_tok), weight, compute_dtype)
        acc = bufs.acc
        scale = grad_losses.to(acc)[:, None]
        grad_x = torch.empty(x.shape, dtype=acc, device=x.device) if need_x else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=x.device) if need_w else None
        rows = torch.arange(min(chunk, n_tok), device=x.device)
        with torch.autocast(x.device.type, enabled=False):
            for s, e in _spans(n_tok, chunk):
                z = bufs.logits(x[s:e])
                p = torch.softmax(z, dim=1, dtype=acc, out=bufs.out[:e - s])
                p[rows[:e - s], targets[s:e]] -= 1  # P − onehot, before any rounding to compute_dtype
                p = bufs.low_copy(p)
                sc = scale[s:e]
                if need_x:
                    grad_x[s:e] = (p @ bufs.w).to(acc).mul_(sc)
                if need_w:
                    xs = (x[s:e].to(acc) * sc).to(compute_dtype)
                    if compute_dtype == acc:
                        grad_w.addmm_(p.t(), xs)
                    else:  # the low-precision product, accumulated over chunks in acc
                        grad_w.add_(p.t() @ xs)
        return (grad_x.to(x.dtype) if need_x else None, grad_w.to(weight.dtype) if need_w else None,
                None, None, None, None)


def _spans(n: int, chunk: int):
    for s in range(0, n, chunk):
        yield s, min(s + chunk, n)


class _ChunkBuffers:
    """The weight in the compute dtype and one chunk's buffers, reused across
    chunks: a fresh (n × V) tensor per chunk would cost an allocation (and, for
    large blocks on CPU, page faults) each time. `raw` takes the product, `out`
    the (log-)softmax in the accumulation dtype: distinct, so no kernel has to
    write over its own input."""

    def __init__(self, rows: int, weight: torch.Tensor, compute_dtype: torch.dtype):
        self.acc = torch.promote_types(compute_dtype, torch.float32)
        self.compute_dtype = compute_dtype
        self.w = weight.to(compute_dtype)
        shape = (rows, weight.shape[0])
        self.raw = torch.empty(shape, dtype=compute_dtype, device=weight.device)
        self.out = torch.empty(shape, dtype=self.acc, device=weight.device)

    def logits(self, xc: torch.Tensor) -> torch.Tensor:
        """xc wᵀ in the compute dtype (what lm_head would give)."""
        return torch.mm(xc.to(self.compute_dtype), self.w.t(), out=self.raw[:xc.shape[0]])

    def low_copy(self, p: torch.Tensor) -> torch.Tensor:
        """p rounded to the compute dtype (into `raw`, free again), or p itself."""
        if self.compute_dtype == self.acc:
            return p
        return self.raw[:p.shape[0]].copy_(p)


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         chunk_tokens: int | None = None, correct: bool = False
                         ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-token CE of the logits x Wᵀ: x (N, d), weight (V, d), targets (N,) with
    IGNORE_INDEX where no loss applies. Returns losses (N,) in at least float32
    (0 and no gradient at ignored positions) and, with correct=True, also
    argmax(logits) == target (N,) bool (False at ignored positions)."""
    if x.dim() != 2 or targets.shape != x.shape[:1]:
        raise ValueError(f"linear_cross_entropy: x {tuple(x.shape)} must be (N, d) and targets "
                         f"{tuple(targets.shape)} (N,)")
    compute_dtype = _compute_dtype(x, weight)
    chunk = chunk_tokens or chunk_tokens_for(weight.shape[0])
    acc = torch.promote_types(compute_dtype, torch.float32)
    real = targets != IGNORE_INDEX
    every = bool(real.all())
    # Only real positions enter the fused part (index_select's backward scatters
    # their gradient back; the others get none).
    rows = None if every else real.nonzero().squeeze(1)
    xr, tr = (x, targets) if every else (x.index_select(0, rows), targets.index_select(0, rows))
    if xr.shape[0] == 0:
        losses_r = (xr.sum(1) * 0).to(acc)  # empty, with a graph
        correct_r = torch.zeros(0, dtype=torch.bool, device=x.device)
    else:
        losses_r, correct_r = _LinearCrossEntropy.apply(xr, weight, tr, chunk, compute_dtype, correct)
    if every:
        losses, hits = losses_r, correct_r
    else:
        losses = losses_r.new_zeros(x.shape[0]).index_put((rows,), losses_r)
        hits = (torch.zeros(x.shape[0], dtype=torch.bool, device=x.device).index_put_((rows,), correct_r)
                if correct else None)
    return (losses, hits) if correct else losses


def head_token_losses(model, hidden: torch.Tensor, targets: torch.Tensor, *, chunk_tokens: int | None = None,
                      correct: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """CE of model's readout (norm_f → lm_head) per token: hidden (..., B, L, d),
    targets (B, L) (shared by the leading dims: every step predicts the same
    tokens) → losses (..., B, L), 0 where there is no target; with correct=True
    also argmax == target (..., B, L). Numerically the same as
    token_losses(model.logits(hidden), targets) up to float summation order."""
    lead = hidden.shape[:-3]
    y = model.norm_f(hidden)
    flat_targets = targets.expand(*lead, *targets.shape).reshape(-1)
    out = linear_cross_entropy(y.reshape(-1, y.shape[-1]), model.lm_head.weight, flat_targets,
                               chunk_tokens=chunk_tokens, correct=correct)
    shape = hidden.shape[:-1]
    return (out[0].view(shape), out[1].view(shape)) if correct else out.view(shape)


def step_token_losses(model, hidden_steps: list[torch.Tensor] | torch.Tensor, targets: torch.Tensor, *,
                      chunk_tokens: int | None = None, correct: bool = False
                      ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """ℓ^(r) (R, B, L) for the hidden states h^(1..R) of every step, through the
    shared readout in one chunked call (the steps share the norm and the head)."""
    hidden = torch.stack(list(hidden_steps)) if isinstance(hidden_steps, (list, tuple)) else hidden_steps
    return head_token_losses(model, hidden, targets, chunk_tokens=chunk_tokens, correct=correct)
