"""The chunked readout loss (models/head.py) against the readout written out by hand:
RMSNorm → logits → log-softmax over the full vocabulary, in float64."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from looplab.models.head import chunk_tokens_for, head_token_losses, linear_cross_entropy, step_token_losses
from looplab.models.looped import LoopedLM
from looplab.objectives import exit_distribution, stage1_loss, token_losses
from looplab.presets import get_preset
from looplab.stages import minibatch_loss
from looplab.tasks.base import IGNORE_INDEX, Batch
from test_adaptive import gated_model
from test_models import tiny

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
    y = hidden / torch.sqrt((hidden ** 2).mean(-1, keepdim=True) + eps) * g
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


def test_no_tensor_as_large_as_the_full_logits_is_created():
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
        losses = step_token_losses(m, hidden, targets, chunk_tokens=chunk)
        losses.sum().backward()
    assert Largest.numel == max(chunk * V, V * D)  # the chunk's logits, or the head's weight (gradient)
    assert Largest.numel < R * B * L * V / 4


def test_bf16_autocast_is_as_accurate_as_the_plain_head_under_autocast():
    """Under autocast both multiply in bf16 (the same bf16 logits, so the same
    losses) and reduce in float32; their gradients round differently, so each is
    held to the float64 truth: the chunked head may be no less accurate."""
    m64 = readout_model()
    hidden64, targets = case()
    truth = grads(m64, hidden64, reference_losses(m64, hidden64, targets)[0].sum())
    m = readout_model().float()
    hidden = hidden64.detach().float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = step_token_losses(m, hidden, targets, chunk_tokens=7)
        plain = torch.stack([token_losses(m.logits(h), targets) for h in hidden.unbind(0)])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)
    for a, b, t in zip(grads(m, hidden, got.sum()), grads(m, hidden, plain.sum()), truth):
        assert a.dtype == torch.float32
        err, plain_err = (a.double() - t).abs().max(), (b.double() - t).abs().max()
        assert err <= 1.1 * plain_err + 1e-6 and err < 0.01 * t.abs().max()


def test_linear_cross_entropy_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="must be"):
        linear_cross_entropy(torch.zeros(4, 3), torch.zeros(5, 3), torch.zeros(3, dtype=torch.long))


def test_default_chunk_bounds_the_logits_bytes():
    assert chunk_tokens_for(32000, 8 * 2**20) == 65
    assert chunk_tokens_for(10**9, 8 * 2**20) == 1


@pytest.mark.parametrize("stage", ["pretrain", "stage1", "stage2"])
def test_stage_losses_equal_the_full_logits_computation(stage):
    """The wired stages give the loss (and, where trained, the gradients) of the
    full-logits code they replaced: CE of every step read out through lm_head."""
    overrides = {"stage": stage, "init_from": "" if stage == "pretrain" else "/unused"}
    from looplab.config import apply_overrides

    cfg = apply_overrides(get_preset("phop-debug"), {"model.n_loops": 4, **overrides})
    m = gated_model("mamba2", vocab_size=cfg.model.vocab_size)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.model.vocab_size, (3, 10), generator=gen)
    targets = torch.randint(0, cfg.model.vocab_size, (3, 10), generator=gen)
    targets[:, ::3] = IGNORE_INDEX
    batch, mask = Batch(ids, targets), targets != IGNORE_INDEX

    def full_logits_loss():
        if stage == "pretrain":
            return token_losses(m(ids).logits, targets).double()[mask].mean()
        out = m(ids, mode="dense", all_steps=True)
        losses = torch.stack([token_losses(z, targets) for z in out.step_logits]).double()
        if stage == "stage1":
            return stage1_loss(losses, torch.sigmoid(out.gate_logits), mask, cfg.exit.beta, cfg.exit.entropy_eps)[0]
        return losses  # stage2 trains the gate on these, detached

    params = [p for p in m.parameters() if p.requires_grad]
    got = minibatch_loss(m, batch, cfg, 0)[0]
    want = full_logits_loss()
    if stage == "stage2":  # compare the step losses it is built from, then the loss
        from looplab.objectives import stage2_loss

        with torch.no_grad():
            hidden = m(ids, mode="dense", all_steps=True).step_hidden[:-1]
        gate = torch.stack([m.exit_logit(h) for h in hidden])
        want = stage2_loss(want.detach(), gate, mask, cfg.exit.kappa, cfg.exit.gamma)
    # token_losses reduces in float32 even for a float64 model; the head keeps float64.
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    for a, b in zip(torch.autograd.grad(got, params, allow_unused=True),
                    torch.autograd.grad(want, params, allow_unused=True)):
        if b is None:
            assert a is None or (a == 0).all()
        else:
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
