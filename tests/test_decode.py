"""Recurrent inference: the per-(loop, layer) cache, prefill, token-by-token decoding
and generation, checked against the full forward (the definition of every policy)
and against explicit per-sequence references built from the modules."""

import math

import pytest
import torch
from test_adaptive import gated_model

from looplab.checkpoint import save_model
from looplab.config import ConfigError
from looplab.inference.generate import decode_step, generate, prefill, sample
from looplab.models.attention import CausalSelfAttention, apply_rope, rope_angles
from looplab.models.cache import InferenceCache
from looplab.models.ops.reference import ssm_scan_ref
from looplab.models.ops.ssd import ssd_chunked
from looplab.policy import ExitPolicy

pytestmark = pytest.mark.usefixtures("one_thread")

R = 4
ATTENTION = ("transformer", "hybrid")
# (arch, attention_fill): Mamba-2 backbones have no attention to fill.
BACKBONES = [
    ("mamba2", "hole"),
    ("mamba2-2groups", "hole"),
    ("transformer", "hole"),
    ("transformer", "exit_state"),
    ("hybrid", "hole"),
    ("hybrid", "exit_state"),
]


def model_for(arch, seed):
    """gated_model, plus Mamba-2 with two groups of B and C (heads of a group share them)."""
    if arch == "mamba2-2groups":
        return gated_model("mamba2", seed=seed, ngroups=2, mixers_per_layer=2)
    return gated_model(arch, seed=seed)


def policies(bsz, width, seed=0):
    """Every kind of policy; given exits are random steps by absolute position."""
    exit_at = torch.randint(1, R + 1, (bsz, width), generator=torch.Generator().manual_seed(seed))
    return {
        "full": ExitPolicy.full(),
        "forced:2": ExitPolicy.forced(2),
        "dense:0.5": ExitPolicy.dense(0.5),
        "skip:0.5": ExitPolicy.skip(0.5),
        "skip:given": ExitPolicy.given(exit_at),
        "dense:given": ExitPolicy.given(exit_at, "dense"),
    }


def full_forward(m, ids, policy, fill):
    """The full forward over the whole right-padded batch. It is causal and padding
    never changes a real position (tests/test_models.py), so position t of row b
    holds what the forward over that row's tokens 1..t gives."""
    with torch.no_grad():
        return m(ids, policy, attention_fill=fill)


def batch(seed=3, bsz=4, width=23):
    ids = torch.randint(0, 37, (bsz, width), generator=torch.Generator().manual_seed(seed))
    lengths = torch.tensor([width, 17, 9, 14][:bsz])
    return ids, lengths


# ---- the scan's states at chosen positions -------------------------------------------------


def test_ssd_states_after_chosen_positions_match_the_recurrence():
    torch.manual_seed(0)
    b, l, h, p, g, n = 2, 29, 4, 5, 2, 6
    x, dt = torch.randn(b, l, h, p, dtype=torch.float64), torch.rand(b, l, h, dtype=torch.float64)
    A = -torch.rand(h, dtype=torch.float64)
    B, C = torch.randn(b, l, g, n, dtype=torch.float64), torch.randn(b, l, g, n, dtype=torch.float64)
    rows, pos = torch.tensor([0, 1, 1, 0]), torch.tensor([0, 7, 28, 16])
    _, states = ssd_chunked(x, dt, A, B, C, 8, state_at=(rows, pos))
    for k in range(4):
        r, t = int(rows[k]), int(pos[k]) + 1
        _, ref = ssm_scan_ref(x[r : r + 1, :t], dt[r : r + 1, :t], A, B[r : r + 1, :t], C[r : r + 1, :t])
        torch.testing.assert_close(states[k], ref[0], atol=1e-12, rtol=0)
    # Three sequences packed in one row: each state is its own sequence's alone.
    seq_idx = torch.tensor([[0] * 5 + [1] * 11 + [2] * 13])
    starts, ends = [0, 5, 16], [4, 15, 28]
    _, states = ssd_chunked(
        x[:1],
        dt[:1],
        A,
        B[:1],
        C[:1],
        8,
        seq_idx=seq_idx,
        state_at=(torch.zeros(3, dtype=torch.long), torch.tensor(ends)),
    )
    for k, (s, e) in enumerate(zip(starts, ends)):
        _, ref = ssm_scan_ref(x[:1, s : e + 1], dt[:1, s : e + 1], A, B[:1, s : e + 1], C[:1, s : e + 1])
        torch.testing.assert_close(states[k], ref[0], atol=1e-12, rtol=0)


def decode_each_rows_last_token(m, ids, lengths, policy, fill):
    """Prefill every row but its last token, decode that token; and the full
    forward over the whole rows to compare both with."""
    pre = prefill(m, ids, policy, lengths=lengths - 1, capacity=ids.shape[1], attention_fill=fill)
    out = decode_step(m, pre.cache, ids[torch.arange(ids.shape[0]), lengths - 1], policy)
    return pre, out, full_forward(m, ids, policy, fill)


# ---- exactness: prefill + decode = the full forward --------------------------------------------


@pytest.mark.parametrize("arch,fill", BACKBONES)
@pytest.mark.parametrize("spec", ["full", "forced:2", "dense:0.5", "skip:0.5", "skip:given"])
def test_prefill_then_decode_equals_the_full_forward(arch, fill, spec):
    """Prefill tokens 1..t−1 of rows of different lengths, decode token t of every row
    at once: its logits and exit step are those of the full forward over 1..t."""
    m = model_for(arch, seed=1)
    ids, lengths = batch()
    policy = policies(*ids.shape)[spec]
    pre, out, ref = decode_each_rows_last_token(m, ids, lengths, policy, fill)
    rows = torch.arange(ids.shape[0])
    torch.testing.assert_close(out.logits, ref.logits[rows, lengths - 1], atol=1e-10, rtol=1e-10)
    assert torch.equal(out.exit_step, ref.exit_step[rows, lengths - 1])
    torch.testing.assert_close(pre.logits, ref.logits[rows, lengths - 2], atol=1e-10, rtol=1e-10)
    assert torch.equal(pre.exit_step, ref.exit_step[rows, lengths - 2])
    if spec.startswith("skip"):  # rows of different lengths, tokens exiting at different steps
        assert len(set(out.exit_step.tolist() + pre.exit_step.tolist())) > 1
        assert (ref.exit_step[rows, : lengths.min()] < R).any() and (ref.exit_step > 1).any()


@pytest.mark.parametrize("arch,fill", BACKBONES)
@pytest.mark.parametrize("spec", ["skip-entropy:3.605", "dense-entropy:3.605", "skip-kl:0.001", "skip-stable:2"])
def test_zero_shot_exit_rules_decode_exactly_too(arch, fill, spec):
    """The zoo's rules read each step's next-token distribution: decoding one token
    applies them to that token's own logits, afresh, as the full forward does."""
    m = model_for(arch, seed=1)
    ids, lengths = batch()
    policy = ExitPolicy.parse(spec)
    pre, out, ref = decode_each_rows_last_token(m, ids, lengths, policy, fill)
    rows = torch.arange(ids.shape[0])
    torch.testing.assert_close(out.logits, ref.logits[rows, lengths - 1], atol=1e-10, rtol=1e-10)
    assert torch.equal(out.exit_step, ref.exit_step[rows, lengths - 1])
    if "entropy" in spec or "stable" in spec:  # thresholds chosen so that tokens leave at different steps
        assert len(set(ref.exit_step[rows, : lengths.min()].flatten().tolist())) > 1


@pytest.mark.parametrize("arch,fill", BACKBONES)
@pytest.mark.parametrize("spec", ["skip:0.5", "dense:0.5", "skip:given"])
def test_token_by_token_decoding_reproduces_the_full_forward_at_every_position(arch, fill, spec):
    """Prefill each row's first tokens (different counts), then feed the rest one by
    one: every position's logits and exit step are the full forward's."""
    m = model_for(arch, seed=2)
    ids, _ = batch(seed=5, bsz=3, width=16)
    exits = decode_token_by_token_against_the_full_forward(m, ids, policies(*ids.shape, seed=1)[spec], fill)
    assert len(set(exits)) >= 3  # the gate (or the given steps) spread the exits


def decode_token_by_token_against_the_full_forward(m, ids, policy, fill="hole", start=(1, 4, 7)):
    """Prefill each row's first start[b] tokens, feed the rest one by one (rows join as
    their prompts end), and check every position's logits and exit step against the
    full forward. Returns the decoded tokens' exit steps."""
    start = torch.tensor(start)
    # Attention buffers sized for the prompts alone: decoding grows them.
    pre = prefill(m, ids[:, : int(start.max())], policy, lengths=start, attention_fill=fill)
    ref = full_forward(m, ids, policy, fill)
    torch.testing.assert_close(pre.logits, ref.logits[torch.arange(ids.shape[0]), start - 1], atol=1e-10, rtol=1e-10)
    exits = []
    for t in range(int(start.min()), ids.shape[1]):
        rows = (start <= t).nonzero()[:, 0]  # rows whose prompt ended before t
        out = decode_step(m, pre.cache, ids[rows, t], policy, rows=rows)
        torch.testing.assert_close(out.logits, ref.logits[rows, t], atol=1e-10, rtol=1e-10)
        assert torch.equal(out.exit_step, ref.exit_step[rows, t])
        exits += out.exit_step.tolist()
    return exits


class EagerFusedCalls:
    """A model's compiled decoding whose calls run eager: decode_step then takes its
    fused token step under skip or forced (generate._fused_token_step), so its
    arithmetic and bookkeeping are checked here apart from any compiler."""

    whole_steps, cuda_graphs = True, False

    def __init__(self, backbone):
        self.backbone, self.calls = backbone, 0

    def storage_steps(self, fn, model, constants, cache, inputs, every_row=True):
        self.calls += 1
        return fn(model, *constants, cache.storage, *inputs)

    def loop_flops(self, model):
        return model.step_flops(1)

    def __call__(self, h, positions=None, seq_idx=None, cache=None):
        return self.backbone(h, positions, seq_idx, cache)


@pytest.mark.parametrize("arch", ["mamba2", "mamba2-2groups"])
@pytest.mark.parametrize("spec", ["skip:0.5", "dense:0.5", "forced:2"])
def test_the_fused_token_step_reproduces_the_full_forward_and_a_planted_write_is_caught(arch, spec, monkeypatch):
    """decode_step's token as one call of fixed shapes (every row runs every loop; under
    skip an exited token's later loops pointed at the scratch slot, under dense read out
    at its exit): token by token, every position's logits and exit step are the full
    forward's. With the scratch slot
    planted away (exited tokens write their rows' deeper states), the later
    positions' logits differ: the holes are what the comparison checks."""
    import looplab.inference.generate as generate_module
    from looplab.models.cache import loop_slots

    m = model_for(arch, seed=2)
    ids, _ = batch(seed=5, bsz=3, width=16)
    policy = policies(*ids.shape, seed=1)[spec]
    m.compiled_decode = calls = EagerFusedCalls(m.backbone)
    exits = decode_token_by_token_against_the_full_forward(m, ids, policy)
    assert calls.calls == ids.shape[1] - 1  # every token step (positions 1..15) was one fused call
    pre = prefill(m, ids[:, :5], policy)
    out = decode_step(m, pre.cache, ids[:, 5], policy)
    assert out.batch_loops() == (2 if spec == "forced:2" else R)  # the call ran them all, whoever exited
    # Without the readout (benchmarks time the loops alone): the same call, exits and states.
    quiet = prefill(m, ids[:, :5], policy)
    loops_alone = decode_step(m, quiet.cache, ids[:, 5], policy, readout=False)
    assert loops_alone.logits is None and torch.equal(loops_alone.exit_step, out.exit_step)
    for a, b in zip(pre.cache.storage, quiet.cache.storage):  # every loop's rows; not the scratch slot
        assert a is None or (torch.equal(a.ssm[:-1], b.ssm[:-1]) and torch.equal(a.conv[:-1], b.conv[:-1]))
    # A batch whose loop costs more than FUSED_LOOP_FLOPS packs skip's running rows (a
    # fused call would waste the exited rows' loops); dense and forced waste none and fuse.
    monkeypatch.setattr(generate_module, "FUSED_LOOP_FLOPS", 3 * m.step_flops(1) - 1)
    calls.calls = 0
    decode_step(m, prefill(m, ids[:, :5], policy).cache, ids[:, 5], policy)
    assert calls.calls == (0 if spec == "skip:0.5" else 1)
    monkeypatch.undo()
    if spec == "forced:2":
        assert set(exits) == {2}
        return
    assert len(set(exits)) >= 3  # exits at different loops
    if spec == "dense:0.5":  # every row writes every loop: no holes to plant away
        return
    monkeypatch.setattr(generate_module, "loop_slots", lambda rows, r, R, b, running=None: loop_slots(rows, r, R, b))
    with pytest.raises(AssertionError):
        decode_token_by_token_against_the_full_forward(m, ids, policy)


def exit_state_reference(m, row: torch.Tensor, q: float) -> torch.Tensor:
    """Skip execution of one sequence with attention_fill="exit_state", from the
    modules, block by block: survivors run every block; an attention block's keys are
    the survivors' (from the block's input) and those of every token that exited
    earlier, computed by the block from its frozen state; causal by position."""
    h = m.embed(row[None])[0].clone()
    L = row.shape[0]
    active, exited = list(range(L)), []
    survival, cdf = torch.ones(L), torch.zeros(L)
    for r in range(1, R + 1):
        idx = torch.tensor(active)
        x = h[idx]
        for block in m.backbone.residual_blocks():
            att = block.inner
            if not isinstance(att, CausalSelfAttention):
                x = block(x[None], positions=idx[None])[0]
                continue
            H, hd = att.n_heads, att.head_dim

            def qkv(states, pos, att=att, block=block, H=H, hd=hd):
                q_, k_, v_ = att.qkv(block.norm(states)).view(-1, 3, H, hd).unbind(1)
                cos, sin = rope_angles(pos[None], att.rope_dim, att.rope_theta)
                return apply_rope(q_[None], cos, sin)[0], apply_rope(k_[None], cos, sin)[0], v_

            qs, ks, vs = qkv(x, idx)
            key_pos = idx
            if exited:
                gone = torch.tensor(sorted(exited))
                _, ke, ve = qkv(h[gone], gone)
                ks, vs, key_pos = torch.cat([ks, ke]), torch.cat([vs, ve]), torch.cat([idx, gone])
            scores = torch.einsum("qhd,khd->hqk", qs, ks) / math.sqrt(hd)
            scores = scores.masked_fill(key_pos[None, None, :] > idx[None, :, None], float("-inf"))
            y = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), vs).reshape(len(active), -1)
            x = x + att.out_proj(y)
        h[idx] = x
        if r == R:
            break
        lam = torch.sigmoid(m.exit_logit(h).float())
        cdf, survival = cdf + survival * lam, survival * (1 - lam)
        for i in list(active):
            if cdf[i] >= q:
                active.remove(i)
                exited.append(i)
        if not active:
            break
    return m.logits(h)


@pytest.mark.parametrize("arch", ATTENTION)
def test_exit_state_fill_matches_a_per_sequence_reference_and_differs_from_holes(arch):
    m = gated_model(arch, seed=6)
    ids, _ = batch(seed=8, bsz=3, width=19)
    with torch.no_grad():
        filled = m(ids, ExitPolicy.skip(0.5), attention_fill="exit_state")
        holes = m(ids, ExitPolicy.skip(0.5))
        for b in range(3):
            torch.testing.assert_close(filled.logits[b], exit_state_reference(m, ids[b], 0.5), atol=1e-10, rtol=1e-10)
    assert (filled.exit_step < R).any() and (filled.exit_step > 1).any()
    assert not torch.allclose(filled.logits, holes.logits)  # the fill is seen by later survivors


# ---- what the cache holds ---------------------------------------------------------------------


def test_mamba2_cache_size_does_not_grow_with_the_context():
    m = gated_model("mamba2", seed=0)
    sizes = {}
    for context in (128, 2048):
        ids = torch.randint(0, 37, (2, context), generator=torch.Generator().manual_seed(context))
        pre = prefill(m, ids, ExitPolicy.skip(0.5))
        decode_step(m, pre.cache, ids[:, 0], ExitPolicy.skip(0.5))
        sizes[context] = pre.cache.nbytes()
    assert sizes[128] == sizes[2048]


@pytest.mark.parametrize("arch", ["mamba2", "hybrid"])
def test_an_exited_token_reaches_no_deeper_loop_when_decoding(arch):
    """Under skip, perturb every exited token's frozen state: no later token's logits
    change (nothing of it entered a deeper loop's state); its own readout does. With
    attention_fill="exit_state" the perturbation reaches later tokens through the
    deeper attention layers' keys, as it should."""
    m = gated_model(arch, seed=3)
    ids, lengths = batch(seed=4, bsz=3, width=20)
    policy = ExitPolicy.skip(0.5)

    def poke(r, h, active):
        return torch.where(active[:, None], h, h + 10.0 * torch.randn_like(h))

    def run(fill, hook_at):
        pre = prefill(m, ids[:, :8], policy, capacity=20, attention_fill=fill)
        out = []
        for t in range(8, 20):
            out.append(decode_step(m, pre.cache, ids[:, t], policy, on_step=poke if t == hook_at else None))
        return out

    plain = run("hole", None)
    # The first new token where some rows exit early and others run on.
    i = next(i for i, o in enumerate(plain) if (o.exit_step < R).any() and (o.exit_step == R).any())
    poked = run("hole", 8 + i)
    exited = plain[i].exit_step < R
    assert not torch.allclose(poked[i].logits[exited], plain[i].logits[exited])  # the poke landed
    torch.testing.assert_close(poked[i].logits[~exited], plain[i].logits[~exited], atol=0, rtol=0)
    for a, b in zip(plain[i + 1 :], poked[i + 1 :]):
        torch.testing.assert_close(b.logits, a.logits, atol=0, rtol=0)
    if arch == "hybrid":
        plain, poked = run("exit_state", None), run("exit_state", 8 + i)
        assert not torch.allclose(
            torch.stack([o.logits for o in poked[i + 1 :]]), torch.stack([o.logits for o in plain[i + 1 :]])
        )


def test_decoding_leaves_deeper_loop_states_of_exited_rows_untouched():
    m = gated_model("mamba2", seed=3)
    ids = torch.randint(0, 37, (4, 12), generator=torch.Generator().manual_seed(0))
    exit_at = torch.tensor([[4] * 12, [1] * 12, [2] * 12, [3] * 12])
    policy = ExitPolicy.given(exit_at)
    pre = prefill(m, ids[:, :11], policy, capacity=12)
    before = [[s.ssm.clone() if s is not None else None for s in loop] for loop in pre.cache.states]
    decode_step(m, pre.cache, ids[:, 11], policy)
    for r in range(R):
        for old, new in zip(before[r], pre.cache.states[r]):
            ran = exit_at[:, 11] > r  # rows whose token ran loop r + 1
            assert torch.equal(new.ssm[~ran], old[~ran]) and not torch.equal(new.ssm[ran], old[ran])


def test_decode_runs_each_loop_on_the_running_rows_only():
    m = gated_model("hybrid", seed=0)
    ids = torch.randint(0, 37, (5, 7), generator=torch.Generator().manual_seed(0))
    exit_at = torch.tensor([4, 1, 2, 1, 3])[:, None].expand(5, 7)
    pre = prefill(m, ids[:, :6], ExitPolicy.given(exit_at))
    seen, step = [], m.step
    m.step = lambda h, *a, **k: (seen.append(h.shape[0]), step(h, *a, **k))[1]
    decode_step(m, pre.cache, ids[:, 6], ExitPolicy.given(exit_at))
    assert seen == [5, 3, 2, 1]  # tokens with exit step >= r


# ---- generation -------------------------------------------------------------------------------


def greedy_reference(m, prompt: list[int], n: int, policy) -> tuple[list[int], list[int]]:
    """Greedy decoding by re-running the full forward over the whole sequence for
    every new token (no cache): the new tokens and the exit step that predicted each."""
    seq, exits = list(prompt), []
    for _ in range(n):
        out = m(torch.tensor([seq]), policy)
        seq.append(int(out.logits[0, -1].argmax()))
        exits.append(int(out.exit_step[0, -1]))
    return seq[len(prompt) :], exits


@pytest.mark.parametrize(
    "arch,spec", [("mamba2", "skip:0.5"), ("hybrid", "skip:0.5"), ("transformer", "dense:0.5"), ("hybrid", "forced:3")]
)
def test_greedy_generation_of_ragged_prompts_equals_the_uncached_loop(arch, spec):
    m = gated_model(arch, seed=7)
    policy = ExitPolicy.parse(spec)
    prompts = [[3, 9, 4, 1, 30, 2, 8], [5], [11, 12, 13, 14]]
    gen = generate(m, prompts, [6, 4, 5], policy)
    for b, prompt in enumerate(prompts):
        tokens, exits = greedy_reference(m, prompt, [6, 4, 5][b], policy)
        assert gen.tokens[b] == tokens and gen.exit_step[b] == exits
        assert gen.loops[b] == (exits if policy.execution != "dense" else [R] * len(exits))
    assert gen.finish == ["length"] * 3


def test_generation_stops_at_eos_and_stop_strings():
    m = gated_model("mamba2", seed=7)
    prompts = [[3, 9, 4], [5, 6]]
    free = generate(m, prompts, 8, ExitPolicy.skip(0.5))
    eos = free.tokens[0][2]
    cut = generate(m, prompts, 8, ExitPolicy.skip(0.5), eos_id=eos)
    assert cut.tokens[0] == free.tokens[0][: free.tokens[0].index(eos)] and cut.finish[0] == "eos"
    decode = lambda ids: "".join(chr(97 + t % 26) for t in ids)  # noqa: E731
    text = decode(free.tokens[1])
    stop = text[3:5]
    stopped = generate(m, prompts, 8, ExitPolicy.skip(0.5), stop=[[], [stop, "never"]], decode=decode)
    assert stopped.texts[1] == text[: text.index(stop)] and stopped.finish[1] == "stop"
    assert stopped.texts[0] == decode(free.tokens[0]) and stopped.finish[0] == "length"


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    m = gated_model("mamba2", seed=7)
    prompts = [[3, 9, 4], [5, 6, 1, 2]]
    greedy = generate(m, prompts, 6, ExitPolicy.skip(0.5))
    a = generate(m, prompts, 6, ExitPolicy.skip(0.5), temperature=1.0, seed=3)
    b = generate(m, prompts, 6, ExitPolicy.skip(0.5), temperature=1.0, seed=3)
    assert a.tokens == b.tokens and a.tokens != greedy.tokens
    assert generate(m, prompts, 6, ExitPolicy.skip(0.5), temperature=0.7, top_k=1, seed=1).tokens == greedy.tokens
    assert generate(m, prompts, 6, ExitPolicy.skip(0.5), temperature=0.7, top_p=1e-6, seed=1).tokens == greedy.tokens


def test_top_k_and_top_p_restrict_the_draw():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(2000, 4)
    gen = torch.Generator().manual_seed(0)
    assert set(sample(logits, temperature=1.0, top_k=2, generator=gen).tolist()) == {0, 1}
    assert set(sample(logits, temperature=1.0, top_p=0.7, generator=gen).tolist()) == {0, 1}  # 0.5 < 0.7 ≤ 0.8
    assert set(sample(logits, temperature=1.0, generator=gen).tolist()) == {0, 1, 2, 3}


def test_bad_generation_arguments_are_one_line_errors():
    m = gated_model("mamba2")
    with pytest.raises(ConfigError, match="temperature=-1 is invalid"):
        generate(m, [[1, 2]], 3, temperature=-1)
    with pytest.raises(ConfigError, match="stop strings need decode="):
        generate(m, [[1, 2]], 3, stop=["x"])
    with pytest.raises(ConfigError, match="top_p=0 is invalid"):
        generate(m, [[1, 2]], 3, top_p=0)
    with pytest.raises(ConfigError, match="attention_fill='fill' is invalid"):
        generate(m, [[1, 2]], 3, attention_fill="fill")
    with pytest.raises(ConfigError, match="ids is invalid"):
        generate(m, [[1, 2], []], 3)
    with pytest.raises(ConfigError, match="mask is invalid with a cache"):
        m(torch.zeros(1, 3, dtype=torch.long), cache=InferenceCache(m, 1, 3), mask=torch.tensor([[False, True, True]]))


def test_generate_command_prints_the_continuation_and_its_loops(tmp_path, capsys):
    import json

    import looplab
    from looplab.cli import main

    model = looplab.load_model("phop-debug", vocab_size=259, n_loops=R, seed=0)
    model.metadata["tokenizer"] = "bytes"
    with torch.no_grad():  # a gate that sends tokens out at different loops
        model.exit_gate.weight.normal_(0, 5.0, generator=torch.Generator().manual_seed(0))
        model.exit_gate.bias.fill_(0.0)
    save_model(model, tmp_path / "ckpt")
    args = [
        "generate",
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--prompt",
        "Once upon",
        "--policy",
        "skip:0.5",
        "--max-new-tokens",
        "12",
        "--device",
        "cpu",
    ]
    assert main(args + ["--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["tokens"]) == len(record["loops"]) == 12 and record["finish"] == "length"
    assert all(1 <= n <= R for n in record["loops"]) and len(set(record["loops"])) > 1
    greedy = generate(model, [[256] + list(b"Once upon")], 12, ExitPolicy.skip(0.5))  # <bos> + the bytes
    assert record["tokens"] == greedy.tokens[0] and record["loops"] == greedy.loops[0]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("Once upon" + record["text"])
    assert "loops per new token (skip q=0.5, R=4" in captured.err
    superscripts = "".join("⁰¹²³⁴⁵⁶⁷⁸⁹"[n] for n in record["loops"])
    assert "".join(c for c in captured.err.splitlines()[-1] if c in "¹²³⁴") == superscripts
    with pytest.raises(SystemExit) as bad:  # a malformed flag value: argparse's one line, exit 2
        main(["generate", "--checkpoint", str(tmp_path / "ckpt"), "--prompt", "x", "--policy", "skip"])
    assert bad.value.code == 2


def test_generation_says_when_the_gate_it_reads_was_never_trained():
    import looplab
    from looplab.cli import untrained_gate_note

    model = looplab.load_model("phop-debug", n_loops=R, seed=0)  # a preset's model: lineage pretrain
    note = untrained_gate_note(model, ExitPolicy.skip(0.35))
    assert note is not None and "no stage of this checkpoint trained the gate (lineage: pretrain)" in note
    assert untrained_gate_note(model, ExitPolicy.parse("forced:2")) is None  # reads no gate
    assert untrained_gate_note(model, ExitPolicy.parse("skip-entropy:1.0")) is None  # reads the logits
    model.metadata["lineage"] = ["pretrain", "stage1"]
    assert untrained_gate_note(model, ExitPolicy.skip(0.35)) is None
