"""The readout's per-token cross-entropy without full logits (a fused linear +
cross-entropy, chunked over tokens).

A looped model reads every step through the same final norm and LM head, and the
continued-training objectives need the CE of every step: R full (B, L, V) logits
tensors (and their softmax in backward) would be alive at once. Here the logits of
one chunk of n tokens exist at a time, z = x Wᵀ (n × V), and the gradient of a
token's CE ℓ is (P − onehot(t)) =: P̃ on the logits, P the softmax. For a
per-token gradient s (n,) the chunk contributes

    grad_x = s ⊙ (P̃ W),    grad_W += P̃ᵀ (s ⊙ x),

the scale applied to the thin (n × d) side of each product, never to the wide
(n × V) buffer (a full pass over it saved). Two ways to get s:

per-token  (linear_cross_entropy, head_token_losses, step_token_losses): any
           use of ℓ. Forward keeps only its inputs; backward recomputes each
           chunk's logits and softmax once s is known (four products per chunk).
weighted   (weighted_linear_cross_entropy, head_weighted_loss): a loss linear
           in ℓ whose coefficients w are known before the head runs
           (pre-training's 1/M, Stage-1's π^(r)/M). The gradient of Σ w ℓ is
           formed in forward while each chunk's softmax exists (three products
           per chunk); backward only scales it. ℓ comes back as values without a
           gradient, for the rest of the loss (attach_gradient joins the two).

Positions whose target is IGNORE_INDEX get loss 0 and no gradient; their logits
are never computed (tasks with one answer position per sequence skip almost the
whole head). The norm runs before the fused part under ordinary autograd: its
output (N × d) is small, and one RMSNorm implementation stays the only one. The
steps' states go through in one call: they share the norm and the head.

Precision: the products run in the autocast dtype when autocast is on (bf16 logits,
as the plain `lm_head` would give), in the inputs' dtype otherwise; the
(log-)softmax, P − onehot and grad_W's accumulation over chunks run in at least
float32.

This module is the home of "readout → per-token loss"; objectives.py combines the
per-token losses of the steps into each stage's objective (and states its
coefficients for the weighted form).
"""

from __future__ import annotations

from typing import Literal, overload

import torch

from looplab.tasks.base import IGNORE_INDEX

# Bytes of float32 logits per chunk (the head holds two such buffers). Bounds the
# head's transient memory at any batch size while keeping the chunk's products
# large enough to run near the GEMM peak (512 tokens of a 32k vocabulary).
DEFAULT_CHUNK_BYTES = 64 * 2**20


def chunk_tokens_for(vocab_size: int, chunk_bytes: int | None = None) -> int:
    """Tokens per chunk so that one chunk's float32 logits take about chunk_bytes
    (default DEFAULT_CHUNK_BYTES, read at call time so a benchmark can vary it)."""
    return max(1, (chunk_bytes or DEFAULT_CHUNK_BYTES) // (4 * vocab_size))


def _compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the plain `lm_head(x)` would multiply in."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return torch.promote_types(x.dtype, weight.dtype)


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
        self.rows = torch.arange(rows, device=weight.device)

    def logits(self, xc: torch.Tensor) -> torch.Tensor:
        """xc wᵀ in the compute dtype (what lm_head would give)."""
        return torch.mm(xc.to(self.compute_dtype), self.w.t(), out=self.raw[: xc.shape[0]])

    def log_softmax(self, z: torch.Tensor) -> torch.Tensor:
        # The fused kernel (one read for the max, one for the sum, one write) is
        # about twice as fast on CPU as amax / sub / exp / sum.
        return torch.log_softmax(z, dim=1, dtype=self.acc, out=self.out[: z.shape[0]])

    def softmax(self, z: torch.Tensor) -> torch.Tensor:
        return torch.softmax(z, dim=1, dtype=self.acc, out=self.out[: z.shape[0]])

    # Below this probability −log p loses precision (subnormal floats): such a
    # token's CE (above ~69 nats) is recomputed from its logits.
    SMALLEST_EXACT_P = 1e-30

    @classmethod
    def losses_from_softmax(cls, p: torch.Tensor, z: torch.Tensor, tc: torch.Tensor) -> torch.Tensor:
        """−log p[target] per token from the chunk's softmax p, and for a token
        whose p[target] is below SMALLEST_EXACT_P, logsumexp(z) − z[target]."""
        p_t = p.gather(1, tc[:, None])[:, 0]
        losses = p_t.log().neg_()
        tiny = (p_t < cls.SMALLEST_EXACT_P).nonzero()[:, 0]
        if tiny.numel():
            zt = z[tiny].to(p.dtype)
            losses[tiny] = torch.logsumexp(zt, dim=1) - zt.gather(1, tc[tiny, None])[:, 0]
        return losses

    def zero_grad_w(self) -> torch.Tensor:
        """A zero (V × d) gradient for the weight, laid out as its transpose (d × V) in
        memory: accumulating P̃ᵀ (s ⊙ x) into that layout multiplies the wide (n × V)
        buffer untransposed, 1.45x faster on CPU at 512 tokens of a 32k vocabulary (the
        same floats); autograd lays it out as the weight when it accumulates it."""
        v, d = self.w.shape
        return torch.zeros(d, v, dtype=self.acc, device=self.w.device).t()

    def add_grads(
        self,
        p: torch.Tensor,
        xc: torch.Tensor,
        tc: torch.Tensor,
        scale: torch.Tensor,
        grad_x: torch.Tensor | None,
        grad_w: torch.Tensor | None,
    ) -> None:
        """For one chunk's softmax p (n × V, overwritten) and per-token scale s (n, 1):
        grad_x (this chunk's rows) = s ⊙ (P̃ W), grad_w += P̃ᵀ (s ⊙ x), P̃ = P − onehot."""
        n = p.shape[0]
        p[self.rows[:n], tc] -= 1  # before any rounding to the compute dtype
        if self.compute_dtype != self.acc:
            p = self.raw[:n].copy_(p)  # `raw` is free again
        if grad_x is not None:
            grad_x.copy_((p @ self.w).to(self.acc).mul_(scale))
        if grad_w is not None:
            xs = (xc.to(self.acc) * scale).to(self.compute_dtype)
            if self.compute_dtype == self.acc:
                grad_w.addmm_(p.t(), xs)
            else:  # the low-precision product, accumulated over chunks in acc
                grad_w.add_((xs.t() @ p).t())  # the product in grad_w's memory layout


def _spans(n: int, chunk: int):
    for s in range(0, n, chunk):
        yield s, min(s + chunk, n)


class _TokenCE(torch.autograd.Function):
    """Per-token CE of the logits x Wᵀ against targets, chunked over tokens.
    x (N, d) real positions only (no IGNORE_INDEX targets), weight (V, d),
    targets (N,). Returns losses (N,) and, when asked, argmax == target (N,).
    Saves only its inputs: backward recomputes each chunk's softmax, since the
    incoming per-token gradient is known only then."""

    @staticmethod
    def forward(ctx, x, weight, targets, chunk, compute_dtype, want_correct):
        n_tok = x.shape[0]
        bufs = _ChunkBuffers(min(chunk, n_tok), weight, compute_dtype)
        losses = torch.empty(n_tok, dtype=bufs.acc, device=x.device)
        correct = torch.zeros(n_tok, dtype=torch.bool, device=x.device) if want_correct else None
        with torch.autocast(x.device.type, enabled=False):  # dtypes are chosen here, explicitly
            for s, e in _spans(n_tok, chunk):
                z = bufs.logits(x[s:e])
                if correct is not None:
                    correct[s:e] = z.argmax(dim=1) == targets[s:e]
                logp = bufs.log_softmax(z)
                losses[s:e] = logp.gather(1, targets[s:e, None])[:, 0].neg_()
        ctx.save_for_backward(x, weight, targets)
        ctx.chunk, ctx.compute_dtype = chunk, compute_dtype
        if correct is not None:
            ctx.mark_non_differentiable(correct)
        return losses, correct

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_losses, _grad_correct):
        x, weight, targets = ctx.saved_tensors
        chunk, n_tok = ctx.chunk, x.shape[0]
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        bufs = _ChunkBuffers(min(chunk, n_tok), weight, ctx.compute_dtype)
        scale = grad_losses.to(bufs.acc)[:, None]
        grad_x = torch.empty(x.shape, dtype=bufs.acc, device=x.device) if need_x else None
        grad_w = bufs.zero_grad_w() if need_w else None
        with torch.autocast(x.device.type, enabled=False):
            for s, e in _spans(n_tok, chunk):
                bufs.add_grads(
                    bufs.softmax(bufs.logits(x[s:e])),
                    x[s:e],
                    targets[s:e],
                    scale[s:e],
                    None if grad_x is None else grad_x[s:e],
                    grad_w,
                )
        return (
            None if grad_x is None else grad_x.to(x.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None,
            None,
            None,
            None,
        )


class _WeightedCE(torch.autograd.Function):
    """Σ_n w_n ℓ_n for weights w (N,) known before the head runs (a loss linear in
    the per-token CE), with its gradient computed in forward from each chunk's
    softmax while it exists: three products per chunk instead of _TokenCE's four.
    Returns the sum (differentiable; backward only scales the stored gradients)
    and the per-token losses (N,) as values without a gradient."""

    @staticmethod
    def forward(ctx, x, weight, targets, weights, chunk, compute_dtype):
        n_tok = x.shape[0]
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        bufs = _ChunkBuffers(min(chunk, n_tok), weight, compute_dtype)
        losses = torch.empty(n_tok, dtype=bufs.acc, device=x.device)
        scale = weights.to(bufs.acc)[:, None]
        grad_x = torch.empty(x.shape, dtype=bufs.acc, device=x.device) if need_x else None
        grad_w = bufs.zero_grad_w() if need_w else None
        with torch.autocast(x.device.type, enabled=False):
            for s, e in _spans(n_tok, chunk):
                z = bufs.logits(x[s:e])
                p = bufs.softmax(z)  # the gradient needs P: one pass fewer than log_softmax, then exp
                losses[s:e] = bufs.losses_from_softmax(p, z, targets[s:e])
                if need_x or need_w:
                    bufs.add_grads(p, x[s:e], targets[s:e], scale[s:e], None if grad_x is None else grad_x[s:e], grad_w)
        ctx.save_for_backward(grad_x if need_x else None, grad_w if need_w else None)
        ctx.dtypes = x.dtype, weight.dtype
        ctx.mark_non_differentiable(losses)
        return (losses * scale[:, 0]).sum(), losses

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_sum, _grad_losses):
        grad_x, grad_w = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        return (
            None if grad_x is None else (grad_x * grad_sum).to(x_dtype),
            None if grad_w is None else (grad_w * grad_sum).to(w_dtype),
            None,
            None,
            None,
            None,
        )


def _real_rows(targets: torch.Tensor) -> torch.Tensor | None:
    """Indices of the positions with a target, or None when every position has one.
    Only these enter the fused part (index_select's backward scatters their
    gradient back; the others get none)."""
    real = targets != IGNORE_INDEX
    return None if bool(real.all()) else real.nonzero().squeeze(1)


def _scatter(values: torch.Tensor, rows: torch.Tensor | None, n: int) -> torch.Tensor:
    return values if rows is None else values.new_zeros(n).index_put((rows,), values)


def _check(x: torch.Tensor, targets: torch.Tensor, name: str) -> None:
    if x.dim() != 2 or targets.shape != x.shape[:1]:
        raise ValueError(f"{name}: x {tuple(x.shape)} must be (N, d) and targets {tuple(targets.shape)} (N,)")


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int | None = None,
    correct: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-token CE of the logits x Wᵀ: x (N, d), weight (V, d), targets (N,) with
    IGNORE_INDEX where no loss applies. Returns losses (N,) in at least float32
    (0 and no gradient at ignored positions) and, with correct=True, also
    argmax(logits) == target (N,) bool (False at ignored positions)."""
    _check(x, targets, "linear_cross_entropy")
    compute_dtype = _compute_dtype(x, weight)
    chunk = chunk_tokens or chunk_tokens_for(weight.shape[0])
    rows = _real_rows(targets)
    xr, tr = (x, targets) if rows is None else (x.index_select(0, rows), targets.index_select(0, rows))
    if xr.shape[0] == 0:
        losses = (x.sum(1) * 0).to(torch.promote_types(compute_dtype, torch.float32))  # zeros, with a graph
        return (losses, torch.zeros_like(targets, dtype=torch.bool)) if correct else losses
    losses, hits = _TokenCE.apply(xr, weight, tr, chunk, compute_dtype, correct)
    losses = _scatter(losses, rows, x.shape[0])
    return (losses, _scatter(hits, rows, x.shape[0])) if correct else losses


def weighted_linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    *,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ_n weights_n ℓ_n over the positions with a target, and the per-token losses
    ℓ (N,) (0 at ignored positions) as values without a gradient. weights (N,) are
    constants (detached): the sum's gradient is Σ_n weights_n ∂ℓ_n, computed in
    forward. For a loss that is linear in ℓ with coefficients known before the head
    (pre-training's mean, Stage-1's π-weights); anything else takes
    linear_cross_entropy."""
    _check(x, targets, "weighted_linear_cross_entropy")
    compute_dtype = _compute_dtype(x, weight)
    chunk = chunk_tokens or chunk_tokens_for(weight.shape[0])
    rows, n = _real_rows(targets), x.shape[0]
    if rows is not None:
        x, targets, weights = x.index_select(0, rows), targets.index_select(0, rows), weights[rows]
    if x.shape[0] == 0:
        acc = torch.promote_types(compute_dtype, torch.float32)
        return (x.sum() * 0).to(acc), torch.zeros(n, dtype=acc, device=x.device)
    total, losses = _WeightedCE.apply(x, weight, targets, weights.detach(), chunk, compute_dtype)
    return total, (losses if rows is None else _scatter(losses, rows, n))


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token CE (B, L) from logits already made; 0 where there is no target. The
    reference the chunked head below is held to (head_token_losses)."""
    ce = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten().clamp(min=0), reduction="none"
    )
    return ce.view(targets.shape) * (targets != IGNORE_INDEX)


def _readout_input(model, hidden: torch.Tensor, targets: torch.Tensor):
    """norm_f(hidden) flattened to (N, d) and the targets repeated over hidden's
    leading dims (every step predicts the same tokens)."""
    lead = hidden.shape[:-3]
    y = model.norm_f(hidden)
    return y.reshape(-1, y.shape[-1]), targets.expand(*lead, *targets.shape).reshape(-1)


@overload
def head_token_losses(
    model,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int | None = None,
    correct: Literal[False] = False,
) -> torch.Tensor: ...
@overload
def head_token_losses(
    model, hidden: torch.Tensor, targets: torch.Tensor, *, chunk_tokens: int | None = None, correct: Literal[True]
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def head_token_losses(
    model, hidden: torch.Tensor, targets: torch.Tensor, *, chunk_tokens: int | None = None, correct: bool
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
def head_token_losses(
    model, hidden: torch.Tensor, targets: torch.Tensor, *, chunk_tokens: int | None = None, correct: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """CE of model's readout (norm_f → lm_head) per token: hidden (..., B, L, d),
    targets (B, L) (shared by the leading dims) → losses (..., B, L), 0 where there
    is no target; with correct=True also argmax == target (..., B, L). Numerically
    token_losses(model.logits(hidden), targets) up to float summation order."""
    y, flat_targets = _readout_input(model, hidden, targets)
    out = linear_cross_entropy(y, model.lm_head.weight, flat_targets, chunk_tokens=chunk_tokens, correct=correct)
    shape = hidden.shape[:-1]
    return (out[0].view(shape), out[1].view(shape)) if isinstance(out, tuple) else out.view(shape)


@overload
def step_token_losses(
    model,
    hidden_steps: list[torch.Tensor] | torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int | None = None,
    correct: Literal[False] = False,
) -> torch.Tensor: ...
@overload
def step_token_losses(
    model,
    hidden_steps: list[torch.Tensor] | torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int | None = None,
    correct: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def step_token_losses(
    model,
    hidden_steps: list[torch.Tensor] | torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int | None = None,
    correct: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
def step_token_losses(
    model,
    hidden_steps: list[torch.Tensor] | torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int | None = None,
    correct: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """ℓ^(r) (R, B, L) for the hidden states h^(1..R) of every step, through the
    shared readout in one chunked call (the steps share the norm and the head)."""
    return head_token_losses(model, _stacked(hidden_steps), targets, chunk_tokens=chunk_tokens, correct=correct)


def head_weighted_loss(
    model,
    hidden: torch.Tensor | list[torch.Tensor],
    targets: torch.Tensor,
    weights: torch.Tensor,
    *,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ weights · ℓ over the readout's per-token CE, with its gradient (to hidden,
    norm_f and lm_head) computed in forward, and ℓ (..., B, L) as values without a
    gradient: hidden (..., B, L, d) or the list of steps' states, weights (..., B, L)
    constants. See weighted_linear_cross_entropy."""
    hidden = _stacked(hidden)
    y, flat_targets = _readout_input(model, hidden, targets)
    total, losses = weighted_linear_cross_entropy(
        y, model.lm_head.weight, flat_targets, weights.expand(hidden.shape[:-1]).reshape(-1), chunk_tokens=chunk_tokens
    )
    return total, losses.view(hidden.shape[:-1])


def attach_gradient(value: torch.Tensor, weighted: torch.Tensor) -> torch.Tensor:
    """`value`, a loss computed from the detached per-token losses of
    head_weighted_loss, plus the gradient of `weighted`: value + (weighted −
    weighted.detach()) is the same number (x − x = 0 exactly) whose gradient adds
    Σ w ∂ℓ, the part of the loss's gradient that flows through ℓ."""
    return value + (weighted - weighted.detach())


def _stacked(hidden: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(list(hidden)) if isinstance(hidden, (list, tuple)) else hidden
