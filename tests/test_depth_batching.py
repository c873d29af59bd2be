"""Depth batching (looplab/inference/depth_batching.py): rows at different loops share backbone
steps, and every token still gets the full forward's logits and exit step."""

import pytest
import torch
from test_adaptive import gated_model
from test_decode import BACKBONES, R, batch, full_forward, model_for, policies

from looplab.config import ConfigError
from looplab.inference.depth_batching import DepthBatch, decode_given_tokens
from looplab.inference.generate import generate, prefill
from looplab.policy import ExitPolicy

pytestmark = pytest.mark.usefixtures("one_thread")


def teacher_forced(m, ids, start, policy, fill="hole", readout=True):
    """Prefill each row's first start[b] tokens, then feed the rest of its row through
    depth batching (decode_given_tokens), each row starting its next token as soon as
    its previous one is done. Returns {(row, position): Done entry} and the batch."""
    pre = prefill(m, ids[:, : int(start.max())], policy, lengths=start, capacity=ids.shape[1], attention_fill=fill)
    pos = start.clone()  # each row's tokens finish in order: the next one done is at pos[b]
    seen = {}

    def record(done):
        for i, b in enumerate(done.rows.tolist()):
            seen[b, int(pos[b])] = (
                None if done.logits is None else done.logits[i],
                int(done.exit_step[i]),
                int(done.loops[i]),
            )
            pos[b] += 1

    db = decode_given_tokens(m, pre.cache, ids, start, policy, readout=readout, on_done=record)
    return seen, db


@pytest.mark.parametrize("arch,fill", BACKBONES)
@pytest.mark.parametrize("spec", ["full", "forced:2", "dense:0.5", "skip:0.5", "skip:given", "dense:given"])
def test_depth_batched_decoding_reproduces_the_full_forward(arch, fill, spec):
    """Rows of different prompt lengths, tokens leaving at different loops, advancing
    at their own pace: every fed position's logits and exit step are the full
    forward's, and the batch ran as many steps as its busiest row's loops."""
    m = model_for(arch, seed=2)
    ids, _ = batch(seed=5, bsz=3, width=16)
    policy = policies(*ids.shape, seed=1)[spec]
    start = torch.tensor([1, 4, 7])
    seen, db = teacher_forced(m, ids, start, policy, fill)
    ref = full_forward(m, ids, policy, fill)
    loops = torch.zeros(3, dtype=torch.long)
    for b in range(3):
        for t in range(int(start[b]), 16):
            logits, exit_step, ran = seen.pop((b, t))
            torch.testing.assert_close(logits, ref.logits[b, t], atol=1e-10, rtol=1e-10)
            assert exit_step == int(ref.exit_step[b, t])
            assert ran == (exit_step if policy.execution in ("skip", "forced") else R if spec != "forced:2" else 2)
            loops[b] += ran
    assert not seen  # nothing decoded twice or out of the rows
    assert db.cache.length.tolist() == [16] * 3  # the cache counts every fed token (on CPU through the host's count)
    # No row ever waits (each restarts at once): the steps are the busiest row's loops.
    assert db.steps == int(loops.max())
    if spec.startswith("skip"):  # rows did run different loops in one step
        assert len(set(loops.tolist())) > 1


@pytest.mark.parametrize("arch,fill", BACKBONES)
@pytest.mark.parametrize("spec", ["skip-entropy:3.605", "dense-entropy:3.605", "skip-kl:0.001", "skip-stable:2"])
def test_zero_shot_rules_keep_each_tokens_own_state(arch, fill, spec):
    """A zoo rule's state (KL's previous distribution, stable's run) belongs to one
    token: with rows at different loops each reads its own, afresh at its first loop."""
    m = model_for(arch, seed=1)
    ids, lengths = batch(bsz=3, width=14)
    policy = ExitPolicy.parse(spec)
    seen, _ = teacher_forced(m, ids, torch.tensor([2, 5, 9]), policy, fill)
    ref = full_forward(m, ids, policy, fill)
    for (b, t), (logits, exit_step, _) in seen.items():
        torch.testing.assert_close(logits, ref.logits[b, t], atol=1e-10, rtol=1e-10)
        assert exit_step == int(ref.exit_step[b, t])


def test_a_step_runs_rows_at_different_loops_on_their_own_states():
    """Given exits 1 and 3 for two rows: the first step runs both at loop 1; then row 0
    starts its next token (loop 1) while row 1 runs loop 2, in one step of 2 rows."""
    m = gated_model("mamba2", seed=0)
    ids = torch.randint(0, 37, (2, 8), generator=torch.Generator().manual_seed(0))
    exit_at = torch.tensor([1, 3])[:, None].expand(2, 8)
    policy = ExitPolicy.given(exit_at)
    pre = prefill(m, ids[:, :4], policy, capacity=8)
    seen, step = [], m.step
    m.step = lambda h, *a, cache=None, **k: (seen.append(cache.layout.rows.tolist()), step(h, *a, cache=cache, **k))[1]
    db = DepthBatch(m, pre.cache, policy)
    db.start(torch.arange(2), ids[:, 4])
    done = db.advance()
    assert done.rows.tolist() == [0] and done.exit_step.tolist() == [1]
    db.start(done.rows, ids[done.rows, 5])
    done = db.advance()
    assert seen == [[0, 1], [0, 2 + 1]]  # slots (loop - 1)·batch + row
    with pytest.raises(ConfigError, match="rows is invalid"):
        db.start(torch.tensor([1]), ids[1:2, 5])  # row 1's token is still running


@pytest.mark.parametrize("started", [False, True])
def test_a_step_with_no_running_token_is_a_one_line_error(started):
    """advance() before any start(), or after every token is done, has nothing to run:
    one ConfigError line (it was a TypeError on the unset states, or a reshape error
    inside the backbone on an empty step)."""
    m = gated_model("mamba2", seed=0)
    ids = torch.randint(0, 37, (2, 6), generator=torch.Generator().manual_seed(0))
    db = DepthBatch(m, prefill(m, ids[:, :4], ExitPolicy.full(), capacity=6).cache, ExitPolicy.full())
    if started:
        db.start(torch.arange(2), ids[:, 4])
        while db.running:
            db.advance()
    with pytest.raises(ConfigError, match=r"^advance is invalid with no running token; allowed: "):
        db.advance()


@pytest.mark.parametrize(
    "arch,spec", [("mamba2", "skip:0.5"), ("hybrid", "skip:0.5"), ("transformer", "dense:0.5"), ("hybrid", "forced:3")]
)
def test_depth_scheduled_generation_equals_the_uncached_loop(arch, spec):
    """Greedy generation of ragged prompts (different lengths and budgets, one row
    stopping at <eos>) under the depth schedule: each row's tokens and exit steps are
    those of re-running the full forward for every new token."""
    from test_decode import greedy_reference

    m = gated_model(arch, seed=7)
    policy = ExitPolicy.parse(spec)
    prompts, budgets = [[3, 9, 4, 1, 30, 2, 8], [5], [11, 12, 13, 14]], [6, 4, 5]
    gen = generate(m, prompts, budgets, policy, schedule="depth")
    for b, prompt in enumerate(prompts):
        tokens, exits = greedy_reference(m, prompt, budgets[b], policy)
        assert gen.tokens[b] == tokens and gen.exit_step[b] == exits
        assert gen.loops[b] == (exits if policy.execution != "dense" else [R] * len(exits))
    eos = gen.tokens[0][2]
    cut = generate(m, prompts, budgets, policy, schedule="depth", eos_id=eos)
    assert cut.tokens[0] == gen.tokens[0][: gen.tokens[0].index(eos)] and cut.finish[0] == "eos"
    assert cut.tokens[1:] == [t[: t.index(eos)] if eos in t else t for t in gen.tokens[1:]]
    # The work done is each row's own, as under lockstep.
    lock = generate(m, prompts, budgets, policy)
    assert (gen.ran_tokens, gen.ran_loops) == (lock.ran_tokens, lock.ran_loops)


def test_depth_scheduled_sampling_is_seeded_and_bad_schedules_are_one_line_errors():
    m = gated_model("mamba2", seed=7)
    prompts = [[3, 9, 4], [5, 6, 1, 2]]
    a = generate(m, prompts, 6, ExitPolicy.skip(0.5), temperature=1.0, seed=3, schedule="depth")
    b = generate(m, prompts, 6, ExitPolicy.skip(0.5), temperature=1.0, seed=3, schedule="depth")
    assert a.tokens == b.tokens
    with pytest.raises(ConfigError, match=r"^schedule='wave' is invalid; allowed: lockstep \| depth$"):
        generate(m, prompts, 6, ExitPolicy.skip(0.5), schedule="wave")
