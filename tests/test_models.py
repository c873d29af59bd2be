"""LoopedLM: causality, padding, parameter sharing, RoPE positions, accounting."""

import copy

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from looplab.config import ModelConfig
from looplab.models.looped import LoopedLM

ARCHS = {
    "mamba2": dict(arch="mamba2"),
    "mamba2-2mixers": dict(arch="mamba2", mixers_per_layer=2),
    "transformer": dict(arch="transformer", d_intermediate=48),
    "hybrid": dict(arch="hybrid", attn_layer_idx=(1,)),
}


def tiny(n_layers=2, n_loops=3, **kw) -> ModelConfig:
    base = dict(
        vocab_size=37,
        d_model=32,
        n_layers=n_layers,
        n_loops=n_loops,
        d_state=8,
        headdim=16,
        chunk_size=8,
        attn_head_dim=16,
        rope_dim=16,
    )
    return ModelConfig(**{**base, **kw})


def model(cfg, seed=0) -> LoopedLM:
    torch.manual_seed(seed)
    return LoopedLM(cfg).double().eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_changing_token_t_changes_no_earlier_output(arch):
    m = model(tiny(**ARCHS[arch]))
    ids = torch.randint(0, 37, (2, 19))
    t = 11
    changed = ids.clone()
    changed[:, t] = (ids[:, t] + 5) % 37
    a, b = m(ids).logits, m(changed).logits
    assert torch.equal(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t:], b[:, t:])  # and the change is seen from t on


@pytest.mark.parametrize("arch", ARCHS)
def test_right_padding_does_not_change_real_positions(arch):
    m = model(tiny(**ARCHS[arch]))
    ids = torch.randint(0, 37, (2, 13))
    ref = m(ids).logits
    for seed in range(3):
        garbage = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(seed))
        padded = m(torch.cat([ids, garbage], dim=1)).logits[:, :13]
        torch.testing.assert_close(padded, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_looping_shares_parameters(arch):
    kw = ARCHS[arch]
    assert LoopedLM(tiny(n_loops=4, **kw)).num_parameters() == LoopedLM(tiny(n_loops=1, **kw)).num_parameters()


@pytest.mark.parametrize("arch", ["mamba2", "transformer", "hybrid"])
def test_n_by_r_equals_the_unrolled_nr_by_1_model(arch):
    """N⊗R is N⊗1's backbone applied R times: an NR⊗1 model whose layers are R
    copies of those N layers computes the same function."""
    kw = dict(ARCHS[arch])
    looped = model(tiny(n_layers=2, n_loops=3, **kw))
    if arch == "hybrid":
        kw["attn_layer_idx"] = (1, 3, 5)
    unrolled = model(tiny(n_layers=6, n_loops=1, **kw), seed=1)
    unrolled.embedding.load_state_dict(looped.embedding.state_dict())
    unrolled.norm_f.load_state_dict(looped.norm_f.state_dict())
    unrolled.lm_head.load_state_dict(looped.lm_head.state_dict())
    for i in range(6):
        unrolled.backbone.layers[i] = copy.deepcopy(looped.backbone.layers[i % 2])
    ids = torch.randint(0, 37, (2, 17))
    torch.testing.assert_close(looped(ids).logits, unrolled(ids).logits, atol=1e-10, rtol=1e-10)


def test_all_steps_returns_every_step_readout():
    m = model(tiny(n_loops=3))
    ids = torch.randint(0, 37, (2, 10))
    out = m(ids, all_steps=True)
    assert len(out.step_logits) == len(out.step_hidden) == 3
    torch.testing.assert_close(out.step_logits[-1], out.logits, atol=0, rtol=0)
    h = m.embed(ids)
    for r in range(3):
        h = m.step(h)
        torch.testing.assert_close(out.step_logits[r], m.logits(h))
    assert not torch.allclose(out.step_logits[0], out.step_logits[2])


@pytest.mark.parametrize("arch", ["transformer", "hybrid"])
def test_attention_sees_relative_positions_only(arch):
    """RoPE on explicit positions: shifting every position by a constant changes
    nothing (only distances matter), while changing one distance does."""
    m = model(tiny(**ARCHS[arch]))
    ids = torch.randint(0, 37, (2, 12))
    pos = torch.arange(12).expand(2, 12)
    base = m(ids, positions=pos).logits
    torch.testing.assert_close(m(ids, positions=pos + 1000).logits, base, atol=1e-9, rtol=1e-9)
    gapped = pos + (pos >= 6) * 5  # a hole of 5 positions in the middle
    assert not torch.allclose(m(ids, positions=gapped).logits[:, 6:], base[:, 6:])
    torch.testing.assert_close(m(ids, positions=gapped).logits[:, :6], base[:, :6], atol=1e-12, rtol=0)


def test_mamba2_flops_match_counted_matmul_flops():
    cfg = tiny(n_loops=3, d_model=64, chunk_size=16)
    m = LoopedLM(cfg)
    ids = torch.randint(0, 37, (2, 64))
    with FlopCounterMode(display=False) as counter:
        m(ids)
    counted = counter.get_total_flops() / ids.numel()
    # The counter sees matrix products only; the depthwise conv runs as shifted
    # multiply-adds: 2 · conv_dim · d_conv per token, layer and step.
    conv_dim = cfg.expand * cfg.d_model + 2 * cfg.ngroups * cfg.d_state
    conv = 2 * conv_dim * cfg.d_conv * cfg.n_layers * cfg.n_loops
    assert counted == m.flops_per_token(64)["total"] - conv


def test_transformer_linear_flops_match_counted_flops():
    cfg = tiny(arch="transformer", d_intermediate=48, n_loops=2)
    m = LoopedLM(cfg)
    L = 24
    with FlopCounterMode(display=False) as counter:
        m(torch.randint(0, 37, (2, L)))
    counted = counter.get_total_flops() / (2 * L)
    mine = m.flops_per_token(L)
    # Everything but the attention-score products (2·2·context·d per layer and step,
    # context = (L+1)/2), which the counter does not see inside CPU SDPA.
    scores = 4 * (L + 1) / 2 * cfg.d_model * cfg.n_layers * cfg.n_loops
    assert counted == pytest.approx(mine["total"] - scores, rel=1e-9)


@pytest.mark.parametrize("arch", ARCHS)
def test_looped_backbone_flops_equal_unlooped_at_same_effective_depth(arch):
    kw = dict(ARCHS[arch])
    looped = LoopedLM(tiny(n_layers=2, n_loops=3, **kw)).flops_per_token(64)
    if arch == "hybrid":
        kw["attn_layer_idx"] = (1, 3, 5)
    flat = LoopedLM(tiny(n_layers=6, n_loops=1, **kw)).flops_per_token(64)
    assert looped["backbone"] == flat["backbone"] == 3 * looped["backbone_step"]


@pytest.mark.parametrize(
    "name,low,high",
    [
        ("paper-140m", 125e6, 155e6),
        ("paper-370m", 350e6, 400e6),
        ("paper-140m-transformer", 100e6, 160e6),
        ("paper-140m-hybrid", 110e6, 155e6),
    ],
)
def test_paper_presets_have_the_papers_sizes(name, low, high):
    from looplab.presets import get_preset

    with torch.device("meta"):
        m = LoopedLM(get_preset(name).model)
    assert low <= m.num_parameters() <= high


def test_hybrid_places_attention_at_the_given_indices():
    from looplab.models.attention import CausalSelfAttention

    m = LoopedLM(tiny(arch="hybrid", n_layers=4, attn_layer_idx=(0, 2)))
    kinds = [isinstance(layer[0].inner, CausalSelfAttention) for layer in m.backbone.layers]
    assert kinds == [True, False, True, False]
    assert all(len(layer) == 1 for layer in m.backbone.layers)  # no MLP in the hybrid


def test_the_package_saves_what_it_loads(tmp_path):
    """looplab.save_model and looplab.load_model are a pair: the same weights and
    architecture come back, and a changed weight would not."""
    import looplab

    model = looplab.load_model("debug", arch="hybrid", n_layers=2, attn_layer_idx=[1], seed=3)
    looplab.save_model(model, tmp_path / "ckpt")
    back = looplab.load_model(tmp_path / "ckpt")
    assert back.cfg == model.cfg
    saved, loaded = model.state_dict(), back.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    other = looplab.load_model("debug", arch="hybrid", n_layers=2, attn_layer_idx=[1], seed=4)
    assert not all(torch.equal(saved[k], other.state_dict()[k]) for k in saved)
