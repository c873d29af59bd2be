"""The chunked readout loss (models/head.py) against the readout written out by hand:
RMSNorm → logits → log-softmax over the full vocabulary, in float64."""

import pytest
import torch
from test_adaptive import gated_model
from test_models import tiny
from test_stages import stage_cfg
from torch.utils._python_dispatch import TorchDispatchMode

from looplab.models.head import (
    attach_gradient,
    chunk_tokens_for,
    head_token_losses,
    head_weighted_loss,
    linear_cross_entropy,
    step_token_losses,
    token_losses,
    weighted_linear_cross_entropy,
)
from looplab.models.looped import LoopedLM
from looplab.policy import ExitPolicy
from looplab.stages import get_stage
from looplab.tasks.base import IGNORE_INDEX, Batch
from looplab.training.objectives import (
    exit_distribution,
    final_loop_loss,
    final_loop_weights,
    stage1_loss,
    stage1_weights,
    stage2_loss,
)

R, B, L, V, D = 3, 2, 11, 97, 16  # 66 tokens over all steps: most chunk sizes below do not divide it


def readout_model(seed=0) -> LoopedLM:
    torch.manual_seed(seed)
    m = LoopedLM(tiny(vocab_size=V, d_model=D, n_loops=R)).double()
    with torch.no_grad():  # a norm weight away from 1, so its gradient is not trivial
        m.norm_f.weight.uniform_(0.5, 1.5)
        m.lm_head.weight.normal_(0, 0.5)  # spread logits: softmax far from uniform
    return m


def reference_losses(m, hidden, targets):
    """ℓ = logsumexp(z) − z_t with z = W·(g ⊙ h / rms(h)), from the definitions."""
    g, eps, W = m.norm_f.weight, m.norm_f.eps, m.lm_head.weight
    y = hidden / torch.sqrt((hidden**2).mean(-1, keepdim=True) + eps) * g
    z = y @ W.T
    real = targets != IGNORE_INDEX
    zt = z.gather(-1, targets.clamp(min=0).expand(*z.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    return torch.where(real, torch.logsumexp(z, -1) - zt, torch.zeros_like(zt)), z


def case(seed=0, ignore_every=4):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(R, B, L, D, dtype=torch.float64, generator=gen).requires_grad_()
    targets = torch.randint(0, V, (B, L), generator=gen)
    targets.view(-1)[::ignore_every] = IGNORE_INDEX
    return hidden, targets


def grads(m, hidden, loss):
    params = (hidden, m.lm_head.weight, m.norm_f.weight)
    return torch.autograd.grad(loss, params)


def assert_grads_equal(got, want):
    for name, a, b in zip(("hidden", "lm_head.weight", "norm_f.weight"), got, want):
        assert b.abs().max() > 0, name  # a test that compares zeros proves nothing
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=lambda s, n=name: f"{n}: {s}")


@pytest.mark.parametrize("chunk", [1, 4, 7, 64, 65, 66, 1000, None])
def test_losses_and_gradients_match_the_full_readout(chunk):
    m = readout_model()
    hidden, targets = case()
    # Distinct per-token weights: a backward that ignores the incoming gradient's
    # shape (treats it as a mean, drops the scale, mixes up chunks) fails.
    w = torch.rand(R, B, L, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) + 0.1
    got = step_token_losses(m, list(hidden.unbind(0)), targets, chunk_tokens=chunk)
    want, _ = reference_losses(m, hidden, targets)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert got.dtype == torch.float64 and (got[:, targets == IGNORE_INDEX] == 0).all()
    assert_grads_equal(grads(m, hidden, (w * got).sum()), grads(m, hidden, (w * want).sum()))


@pytest.mark.parametrize("chunk", [1, 5, 66, 1000, None])
def test_weighted_sum_and_its_gradient_match_the_full_readout(chunk):
    """The gradient-in-forward path: Σ w ℓ and its gradient for weights given up front."""
    m = readout_model()
    hidden, targets = case(ignore_every=3)
    w = torch.rand(R, B, L, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) - 0.3  # signs mixed
    total, losses = head_weighted_loss(m, list(hidden.unbind(0)), targets, w, chunk_tokens=chunk)
    want, _ = reference_losses(m, hidden, targets)
    torch.testing.assert_close(losses, want.detach(), atol=1e-12, rtol=1e-12)
    assert not losses.requires_grad and (losses[:, targets == IGNORE_INDEX] == 0).all()
    want_total = (w * want).sum()
    torch.testing.assert_close(total, want_total, atol=1e-12, rtol=1e-12)
    # A scaled upstream gradient (3 · total) must scale every stored gradient.
    assert_grads_equal(grads(m, hidden, 3 * total), grads(m, hidden, 3 * want_total))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_target_whose_probability_underflows_keeps_its_exact_loss(dtype):
    """The weighted form reads ℓ = −log p[target] off the softmax its gradient needs;
    where p[target] underflows (ℓ of hundreds of nats), ℓ comes from the logits."""
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=dtype)
    weight = torch.tensor([[0.0, 0.0], [800.0, 0.0], [0.0, 60.0], [5.0, 5.0]], dtype=dtype)
    targets = torch.tensor([0, 0, 3])  # ℓ: 800 (p = e^-800 underflows even in float64), 60, 50
    _, losses = weighted_linear_cross_entropy(x, weight, targets, torch.ones(3, dtype=dtype))
    want = torch.logsumexp(x @ weight.T, 1) - (x @ weight.T).gather(1, targets[:, None])[:, 0]
    assert float(want[0]) == pytest.approx(800.0) and torch.isfinite(losses).all()
    torch.testing.assert_close(losses, want, rtol=1e-6, atol=0)


def test_weights_at_ignored_positions_do_not_count():
    m = readout_model()
    hidden, targets = case(ignore_every=2)
    w = torch.rand(R, B, L, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    a, _ = head_weighted_loss(m, hidden, targets, w)
    b, _ = head_weighted_loss(m, hidden, targets, torch.where(targets == IGNORE_INDEX, 1e6, w))
    assert torch.equal(a, b)
    assert_grads_equal(grads(m, hidden, a), grads(m, hidden, (w * reference_losses(m, hidden, targets)[0]).sum()))


def test_attach_gradient_keeps_the_value_and_adds_the_heads_gradient():
    m = readout_model()
    hidden, targets = case()
    value = torch.tensor(1.2345678901234567, dtype=torch.float64)
    total, _ = head_weighted_loss(m, hidden, targets, torch.ones(R, B, L, dtype=torch.float64))
    loss = attach_gradient(value, total)
    assert float(loss.detach()) == float(value)
    assert_grads_equal(grads(m, hidden, loss), grads(m, hidden, reference_losses(m, hidden, targets)[0].sum()))


def test_loss_weights_are_the_objectives_derivatives():
    """final_loop_weights and stage1_weights against autograd's ∂loss/∂ℓ of the
    objectives themselves (both are linear in ℓ, so any ℓ will do)."""
    hidden, targets = case()
    losses = torch.rand(R, B, L, dtype=torch.float64, requires_grad=True)
    mask = targets != IGNORE_INDEX
    d_final = torch.autograd.grad(final_loop_loss(losses[-1], targets), losses)[0][-1]
    torch.testing.assert_close(final_loop_weights(targets, torch.float64), d_final, atol=1e-15, rtol=0)
    lam = torch.rand(R - 1, B, L, dtype=torch.float64)
    d_stage1 = torch.autograd.grad(stage1_loss(losses, lam, mask, beta=0.3)[0], losses)[0]
    torch.testing.assert_close(stage1_weights(lam, mask), d_stage1, atol=1e-15, rtol=0)


def test_ignored_positions_get_no_gradient_and_do_not_change_others():
    m = readout_model()
    hidden, targets = case(ignore_every=3)
    losses = head_token_losses(m, hidden, targets, chunk_tokens=5)
    g_hidden = torch.autograd.grad(losses.sum(), hidden)[0]
    ignored = targets == IGNORE_INDEX
    assert (g_hidden[:, ignored] == 0).all() and (g_hidden[:, ~ignored].abs().sum(-1) > 0).all()
    # Every position real: the real ones' losses do not depend on which others are ignored.
    full = head_token_losses(m, hidden, targets.clamp(min=0), chunk_tokens=5)
    torch.testing.assert_close(losses[:, ~ignored], full[:, ~ignored], atol=1e-12, rtol=0)


def test_no_target_at_all_gives_zero_losses_with_a_graph():
    m = readout_model()
    hidden, _ = case()
    targets = torch.full((B, L), IGNORE_INDEX)
    losses = head_token_losses(m, hidden, targets)
    assert losses.shape == (R, B, L) and (losses == 0).all()
    g = torch.autograd.grad(losses.sum(), hidden, allow_unused=True)[0]
    assert g is None or (g == 0).all()
    total, losses = head_weighted_loss(m, hidden, targets, torch.ones(R, B, L))
    assert float(total.detach()) == 0 and (losses == 0).all()
    g = torch.autograd.grad(total, hidden, allow_unused=True)[0]
    assert g is None or (g == 0).all()


def test_stage1_shaped_loss_matches_in_value_and_every_gradient():
    """Σ_r π^(r) ℓ^(r) − β H(π), π from gate logits that carry a graph: the head's
    backward receives π-weighted gradients that differ per step and per token."""
    m = readout_model()
    hidden, targets = case(seed=2)
    gate_logits = torch.randn(R - 1, B, L, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    gate_logits.requires_grad_()
    mask = targets != IGNORE_INDEX

    def loss_of(losses):
        return stage1_loss(losses, torch.sigmoid(gate_logits), mask, beta=0.1)[0]

    got = loss_of(step_token_losses(m, hidden, targets, chunk_tokens=9))
    want = loss_of(reference_losses(m, hidden, targets)[0])
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    params = (hidden, m.lm_head.weight, m.norm_f.weight, gate_logits)
    for a, b in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params)):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    # The weights really differ per step: π is far from uniform here.
    assert exit_distribution(torch.sigmoid(gate_logits)).std() > 0.05


def test_argmax_correctness_matches_the_full_logits():
    m = readout_model()
    hidden, targets = case()
    with torch.no_grad():
        z = reference_losses(m, hidden, targets)[1]
        targets = torch.where(targets == IGNORE_INDEX, targets, z[1].argmax(-1))  # step 2 right everywhere
        targets[0, 1] = (targets[0, 1] + 1) % V if targets[0, 1] >= 0 else 5  # one miss at step 2
        losses, correct = step_token_losses(m, hidden, targets, chunk_tokens=7, correct=True)
    real = targets != IGNORE_INDEX
    want = (z.argmax(-1) == targets) & real
    assert torch.equal(correct, want) and int(want[1].sum()) == int(real.sum()) - 1
    torch.testing.assert_close(losses, reference_losses(m, hidden, targets)[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("weighted", [False, True])
def test_no_tensor_as_large_as_the_full_logits_is_created(weighted):
    """The point of the head: forward and backward hold one chunk of logits, never
    (tokens × vocabulary). Every tensor any op returns is recorded."""
    m = readout_model()
    hidden, targets = case()
    chunk = 8

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    with Largest():
        if weighted:
            head_weighted_loss(m, hidden, targets, torch.ones(R, B, L), chunk_tokens=chunk)[0].backward()
        else:
            step_token_losses(m, hidden, targets, chunk_tokens=chunk).sum().backward()
    assert Largest.numel == max(chunk * V, V * D)  # the chunk's logits, or the head's weight (gradient)
    assert Largest.numel < R * B * L * V / 4


@pytest.mark.parametrize("weighted", [False, True])
def test_bf16_autocast_is_as_accurate_as_the_plain_head_under_autocast(weighted):
    """Under autocast both multiply in bf16 (the same bf16 logits, so the same
    losses) and reduce in float32; their gradients round differently, so each is
    held to the float64 truth: the chunked head may be no less accurate."""
    m64 = readout_model()
    hidden64, targets = case()
    truth = grads(m64, hidden64, reference_losses(m64, hidden64, targets)[0].sum())
    m = readout_model().float()
    hidden = hidden64.detach().float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if weighted:
            total, got = head_weighted_loss(m, hidden, targets, torch.ones(R, B, L), chunk_tokens=7)
        else:
            got = step_token_losses(m, hidden, targets, chunk_tokens=7)
            total = got.sum()
        plain = torch.stack([token_losses(m.logits(h), targets) for h in hidden.unbind(0)])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)
    for a, b, t in zip(grads(m, hidden, total), grads(m, hidden, plain.sum()), truth):
        assert a.dtype == torch.float32
        err, plain_err = (a.double() - t).abs().max(), (b.double() - t).abs().max()
        assert err <= 1.1 * plain_err + 1e-6 and err < 0.01 * t.abs().max()


def test_mismatched_shapes_fail_in_one_line():
    for fn, extra in ((linear_cross_entropy, ()), (weighted_linear_cross_entropy, (torch.ones(3),))):
        with pytest.raises(ValueError, match="must be"):
            fn(torch.zeros(4, 3), torch.zeros(5, 3), torch.zeros(3, dtype=torch.long), *extra)


def test_default_chunk_bounds_the_logits_bytes():
    assert chunk_tokens_for(32000, 8 * 2**20) == 65
    assert chunk_tokens_for(10**9, 8 * 2**20) == 1


def full_ce(logits, targets):
    """The replaced code's per-token CE (head.token_losses) without its
    float32 cast, so that a float64 model is compared in float64."""
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten().clamp(min=0), reduction="none")
    return ce.view(targets.shape) * (targets != IGNORE_INDEX)


@pytest.mark.parametrize("stage", ["pretrain", "stage1", "stage2", "chase-threshold"])
def test_stage_losses_equal_the_full_logits_computation(stage):
    """The wired stages give the loss and the gradients of the full-logits code
    they replaced: CE of each step's logits, read out through model.logits."""
    extra = {"hole.sampler": "threshold", "hole.rho": 1.0} if stage == "chase-threshold" else {}
    name = stage.split("-")[0]
    cfg = stage_cfg(name, **extra)
    m = gated_model("mamba2", vocab_size=cfg.model.vocab_size)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.model.vocab_size, (3, 10), generator=gen)
    targets = torch.randint(0, cfg.model.vocab_size, (3, 10), generator=gen)
    targets[:, ::3] = IGNORE_INDEX
    mask = targets != IGNORE_INDEX

    got, diag = get_stage(name).minibatch_loss(m, Batch(ids, targets), cfg, 0)
    if stage == "pretrain":
        want = full_ce(m(ids).logits, targets)[mask].mean()
    elif stage == "chase-threshold":
        want = full_ce(m(ids, ExitPolicy.skip(diag["hole_q"]), gate_grad=False).logits, targets)[mask].mean()
    elif stage == "stage1":
        out = m(ids, ExitPolicy.full(), all_steps=True)
        losses = torch.stack([full_ce(z, targets) for z in out.step_logits])
        want = stage1_loss(losses, torch.sigmoid(out.gate_logits), mask, cfg.exit.beta, cfg.exit.entropy_eps)[0]
    else:  # stage2: the gate trains on the frozen model's step losses
        with torch.no_grad():
            out = m(ids, ExitPolicy.full(), all_steps=True)
            losses = torch.stack([full_ce(z, targets) for z in out.step_logits])
        gate = torch.stack([m.exit_logit(h) for h in out.step_hidden[:-1]])
        want = stage2_loss(losses, gate, mask, cfg.exit.kappa, cfg.exit.gamma)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    params = [p for p in m.parameters()]
    for a, b in zip(
        torch.autograd.grad(got, params, allow_unused=True), torch.autograd.grad(want, params, allow_unused=True)
    ):
        if b is None:
            assert a is None or (a == 0).all()
        else:
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
