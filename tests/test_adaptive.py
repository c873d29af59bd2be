"""Exit gate, dense / skip / forced execution, and the adaptive-depth objectives."""

import math

import pytest
import torch
from test_models import ARCHS, tiny

from looplab.config import ConfigError
from looplab.models.looped import LoopedLM
from looplab.policy import ExitPolicy, parse_policies, threshold_exit_steps
from looplab.training.objectives import (
    exit_cdf,
    exit_distribution,
    exit_entropy,
    expected_exit_step,
    stage1_loss,
    stage2_loss,
    stage2_targets,
)


def gated_model(arch="mamba2", seed=0, n_loops=4, gate_std=5.0, **kw) -> LoopedLM:
    """A float64 model whose gate is spread out enough that tokens exit at
    different steps (a fresh gate, bias −2, would send nearly everyone to R)."""
    torch.manual_seed(seed)
    m = LoopedLM(tiny(n_loops=n_loops, **{**ARCHS[arch], **kw})).double().eval()
    with torch.no_grad():
        m.exit_gate.weight.normal_(0, gate_std)
        m.exit_gate.bias.fill_(0.0)
    return m


# ---- exit distribution by hand --------------------------------------------------------


def test_exit_distribution_by_hand():
    lam = torch.tensor([0.5, 0.5]).view(2, 1, 1)  # R = 3
    pi = exit_distribution(lam).flatten()
    assert pi.tolist() == [0.5, 0.25, 0.25]
    assert exit_cdf(exit_distribution(lam)).flatten().tolist() == [0.5, 0.75, 1.0]
    H = -(0.5 * math.log(0.5 + 1e-8) + 2 * 0.25 * math.log(0.25 + 1e-8))
    assert float(exit_entropy(exit_distribution(lam))) == pytest.approx(H)
    assert float(expected_exit_step(exit_distribution(lam))) == pytest.approx(0.5 * 1 + 0.25 * 2 + 0.25 * 3)
    gate_logits = torch.logit(lam)  # the rule reads the gate's logits, λ = σ(a)
    assert [int(threshold_exit_steps(gate_logits, q)) for q in (0.0, 0.5, 0.6, 0.75, 0.8, 1.0)] == [1, 1, 2, 2, 3, 3]


def test_pi_sums_to_one():
    lam = torch.rand(5, 3, 7)
    torch.testing.assert_close(exit_distribution(lam).sum(0), torch.ones(3, 7))


def test_stage1_loss_by_hand():
    lam = torch.tensor([0.5, 0.5]).view(2, 1, 1)
    losses = torch.tensor([3.0, 2.0, 1.0]).view(3, 1, 1)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, diag = stage1_loss(losses, lam, mask, beta=0.25, eps=1e-8)
    H = -(0.5 * math.log(0.5 + 1e-8) + 2 * 0.25 * math.log(0.25 + 1e-8))
    assert float(loss) == pytest.approx(0.5 * 3 + 0.25 * 2 + 0.25 * 1 - 0.25 * H)
    assert float(diag["expected_exit_step"]) == pytest.approx(1.75)


def test_stage2_target_and_loss_by_hand():
    losses = torch.tensor([2.0, 1.0, 0.999]).view(3, 1, 1)
    w = stage2_targets(losses, kappa=50.0, gamma=0.005).flatten()
    expected_w = [1 / (1 + math.exp(-50 * (1.0 - 0.005))), 1 / (1 + math.exp(-50 * (0.001 - 0.005)))]
    assert w.tolist() == pytest.approx(expected_w)
    a = torch.tensor([0.3, -1.2]).view(2, 1, 1)  # gate logits: λ = σ(a)
    lam = [1 / (1 + math.exp(-x)) for x in (0.3, -1.2)]
    bce = [-(wi * math.log(1 - li) + (1 - wi) * math.log(li)) for wi, li in zip(expected_w, lam)]
    loss = stage2_loss(losses, a, torch.ones(1, 1, dtype=torch.bool))
    assert float(loss) == pytest.approx(sum(bce) / 2)


def test_stage2_improvement_is_clamped_at_zero():
    losses = torch.tensor([1.0, 2.0]).view(2, 1, 1)  # the next step is worse
    assert float(stage2_targets(losses, 50.0, 0.005)) == pytest.approx(1 / (1 + math.exp(50 * 0.005)))


# ---- execution ----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mamba2", "transformer", "hybrid"])
def test_skip_at_q1_equals_dense_readout_at_R_and_q0_equals_depth_1(arch):
    m = gated_model(arch)
    ids = torch.randint(0, 37, (3, 15))
    full = m(ids)  # forced depth R
    skip1 = m(ids, ExitPolicy.skip(1.0))
    assert int(skip1.exit_step.min()) == 4 and skip1.executed_loops == 4.0
    torch.testing.assert_close(skip1.logits, full.logits, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(m(ids, ExitPolicy.dense(1.0)).logits, full.logits, atol=1e-10, rtol=1e-10)
    skip0 = m(ids, ExitPolicy.skip(0.0))
    assert skip0.exit_step.eq(1).all() and skip0.executed_loops == 1.0
    torch.testing.assert_close(skip0.logits, m(ids, ExitPolicy.forced(1)).logits, atol=1e-12, rtol=0)


def skip_reference(m, ids, q):
    """Skip execution one sequence at a time, on its survivors alone (no batch,
    no padding), from the step API: the explicit reference."""
    R = m.cfg.n_loops
    logits, exits = [], []
    for row in ids:
        h = m.embed(row[None])
        L = row.shape[0]
        active = list(range(L))
        survival, cdf = torch.ones(L), torch.zeros(L)
        exit_step = torch.full((L,), R)
        for r in range(1, R + 1):
            if not active:
                break
            idx = torch.tensor(active)
            h = h.clone()
            h[0, idx] = m.step(h[:, idx], positions=idx[None])[0]
            if r == R:
                break
            lam = torch.sigmoid(m.exit_logit(h)[0].float())
            cdf = cdf + survival * lam
            survival = survival * (1 - lam)
            for i in list(active):
                if cdf[i] >= q:
                    exit_step[i] = r
                    active.remove(i)
        logits.append(m.logits(h)[0])
        exits.append(exit_step)
    return torch.stack(logits), torch.stack(exits)


@pytest.mark.parametrize(
    "arch,packing", [("mamba2", "padded"), ("mamba2", "varlen"), ("transformer", "padded"), ("hybrid", "padded")]
)
def test_skip_equals_per_sequence_survivor_reference(arch, packing):
    m = gated_model(arch, seed=1)
    ids = torch.randint(0, 37, (4, 21), generator=torch.Generator().manual_seed(3))
    out = m(ids, ExitPolicy.skip(0.5), packing=packing)
    ref_logits, ref_exit = skip_reference(m, ids, 0.5)
    assert torch.equal(out.exit_step, ref_exit)
    survivors_at_2 = (out.exit_step >= 2).sum(1)
    assert survivors_at_2.max() - survivors_at_2.min() >= 3, "rows should have very different survivor counts"
    torch.testing.assert_close(out.logits, ref_logits, atol=1e-10, rtol=1e-10)
    assert out.executed_loops == pytest.approx(float(ref_exit.double().mean()))


@pytest.mark.parametrize("packing", ["padded", "varlen"])
def test_skip_with_very_different_survivor_counts_per_row(packing):
    """One row keeps everyone, one loses everyone after step 1: packing pads the
    empty row completely (or leaves it out) and must not disturb the full one."""
    m = gated_model("mamba2", seed=2)
    ids = torch.randint(0, 37, (2, 17))
    exit_at = torch.stack([torch.full((17,), 4), torch.ones(17, dtype=torch.long)])
    out = m(ids, ExitPolicy.given(exit_at), packing=packing)
    torch.testing.assert_close(out.logits[0], m(ids[:1]).logits[0], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out.logits[1], m(ids[1:], ExitPolicy.forced(1)).logits[0], atol=1e-12, rtol=0)
    assert out.executed_loops == pytest.approx((4 + 1) / 2)


@pytest.mark.parametrize("arch", ["mamba2", "transformer", "hybrid"])
def test_exited_tokens_are_invisible_to_deeper_steps(arch):
    m = gated_model(arch, seed=4)
    ids = torch.randint(0, 37, (2, 19))
    exit_at = torch.randint(1, 5, ids.shape, generator=torch.Generator().manual_seed(0))
    base = m(ids, ExitPolicy.given(exit_at))
    assert (base.exit_step < 4).any() and (base.exit_step == 4).any()

    def perturb_exited(r, h, active):
        noise = torch.randn_like(h) * 10.0
        return torch.where(active.unsqueeze(-1), h, h + noise)

    poked = m(ids, ExitPolicy.given(exit_at), on_step=perturb_exited)
    survivors = base.exit_step == 4
    torch.testing.assert_close(poked.logits[survivors], base.logits[survivors], atol=1e-10, rtol=1e-10)
    assert not torch.allclose(poked.logits[~survivors], base.logits[~survivors])  # the poke did land


def test_dense_readout_picks_the_threshold_step():
    m = gated_model("mamba2", seed=5)
    ids = torch.randint(0, 37, (2, 13))
    out = m(ids, ExitPolicy.dense(0.5), all_steps=True)
    for b in range(2):
        for t in range(13):
            z = int(out.exit_step[b, t])
            torch.testing.assert_close(out.logits[b, t], out.step_logits[z - 1][b, t])
    assert out.executed_loops == 4.0 and out.backbone_flops == 4 * 2 * 13 * m.step_flops(13)


def test_varlen_and_padded_skip_agree_on_random_exits_with_gradients():
    m = gated_model("mamba2", seed=8)
    ids = torch.randint(0, 37, (5, 33))
    exit_at = torch.randint(1, 5, ids.shape, generator=torch.Generator().manual_seed(1))
    padded = m(ids, ExitPolicy.given(exit_at), packing="padded")
    varlen = m(ids, ExitPolicy.given(exit_at), packing="varlen")
    torch.testing.assert_close(varlen.logits, padded.logits, atol=1e-10, rtol=1e-10)
    w = torch.randn_like(padded.logits)
    g_pad = torch.autograd.grad((padded.logits * w).sum(), list(m.backbone.parameters()))
    g_var = torch.autograd.grad((varlen.logits * w).sum(), list(m.backbone.parameters()))
    for a, b in zip(g_pad, g_var):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)
    assert varlen.backbone_flops < padded.backbone_flops  # ragged rows: no padding work


def test_varlen_packing_is_refused_for_attention_backbones():
    m = gated_model("hybrid")
    with pytest.raises(ValueError, match="varlen needs arch='mamba2'"):
        m(torch.randint(0, 37, (1, 5)), ExitPolicy.skip(0.5), packing="varlen")


def test_skip_flops_follow_the_packed_work():
    m = gated_model("mamba2", seed=6)
    ids = torch.randint(0, 37, (2, 16))
    exit_at = torch.tensor([[1] * 8 + [4] * 8, [2] * 16])
    out = m(ids, ExitPolicy.given(exit_at), packing="padded")
    # step 1: 2×16 tokens; step 2: row widths 8 and 16 → padded to 16; steps 3-4: 8 (row 0 only, row 1 padded)
    expected = 2 * 16 * m.step_flops(16) * 2 + 2 * 8 * m.step_flops(8) * 2
    assert out.backbone_flops == expected
    assert out.executed_loops == pytest.approx((8 * 1 + 8 * 4 + 16 * 2) / 32)


def test_bad_policies_are_one_line_errors():
    m = gated_model("mamba2")
    ids = torch.randint(0, 37, (1, 5))
    with pytest.raises(ConfigError, match="policy execution='fast' is invalid"):
        ExitPolicy("fast")
    with pytest.raises(ConfigError, match="policy q=1.5 is invalid"):
        ExitPolicy.skip(1.5)
    with pytest.raises(ConfigError, match=r"policy depth=9 is invalid; allowed: an integer in \[1, R=4\]"):
        m(ids, ExitPolicy.forced(9))
    with pytest.raises(ConfigError, match="policy 'skip' is invalid"):
        ExitPolicy.parse("skip")
    with pytest.raises(ConfigError, match="exit_at must be"):
        m(ids, ExitPolicy.given(torch.full((1, 5), 7)))
    with pytest.raises(ConfigError, match="policy=.* is invalid"):
        m(ids, "skip:0.4")


@pytest.mark.parametrize(
    "spec,label,prefix",
    [
        ("full", "full depth", "val_"),
        ("forced:2", "forced d=2", "forced_d2_"),
        ("dense:0.4", "dense q=0.4", "dense_q0.4_"),
        ("skip:0.25", "skip q=0.25", "skip_q0.25_"),
        ("skip:1", "skip q=1.0", "skip_q1.0_"),
    ],
)
def test_policy_names_round_trip(spec, label, prefix):
    policy = ExitPolicy.parse(spec)
    assert (policy.label, policy.metric_prefix) == (label, prefix)
    assert ExitPolicy.parse(policy.spec) == policy == ExitPolicy.from_prefix(prefix)


def test_policy_grid_parses_groups_and_ranges():
    got = parse_policies("full; dense:0.2,0.4; skip:0.4; forced:1-3")
    assert [p.spec for p in got] == ["full", "dense:0.2", "dense:0.4", "skip:0.4", "forced:1", "forced:2", "forced:3"]


@pytest.mark.parametrize("arch", ["mamba2", "transformer"])
def test_readouts_of_one_dense_pass_match_each_policy_run_on_its_own(arch):
    """evaluate_readouts (one dense pass, every step kept) against evaluate_policy,
    which runs dense at each q and forced at each depth through its own forward."""
    from looplab.evaluation.validation import evaluate_policy, evaluate_readouts
    from looplab.tasks.base import Batch

    model = gated_model(arch)  # its gate sends tokens out at different steps
    torch.manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (5, 24))
    targets = torch.roll(ids, -1, dims=1)
    targets[:, ::3] = -100  # some positions carry no target
    batch = Batch(ids, targets)
    qs = (0.3, 0.6, 0.9)
    policies = (
        [ExitPolicy.dense(q) for q in qs]
        + [ExitPolicy.forced(d) for d in range(1, model.cfg.n_loops)]
        + [ExitPolicy.full()]
    )
    fast = evaluate_readouts(model, batch, policies, batch_size=2)
    slow = [evaluate_policy(model, batch, p, batch_size=2) for p in policies]
    assert len({r["mean_exit_step"] for r in fast if r["policy"].startswith("dense")}) > 1  # q matters here
    assert len(fast) == len(slow)
    for f, s in zip(fast, slow):
        assert f["policy"] == s["policy"]
        for key in ("accuracy", "loss", "ppl", "mean_exit_step", "executed_loops", "backbone_flops_per_token", "n"):
            assert f[key] == pytest.approx(s[key], rel=1e-5, abs=1e-6), (f["policy"], key)
