"""The exit-policy zoo (looplab/policy.py): zero-shot exit rules on each step's
next-token distribution (entropy, KL between consecutive steps, stable argmax), in
dense and skip execution, against references computed by hand from the step API."""

import json
import math

import pytest
import torch
from test_models import ARCHS, tiny

from looplab.config import ConfigError
from looplab.models.looped import LoopedLM
from looplab.policy import (
    DENSE,
    ENTROPY,
    EXIT_RULES,
    GATE,
    GATE_LOGITS,
    KL,
    PREFIX_PATTERN,
    SKIP,
    STABLE,
    ZOO_GRIDS,
    ZOO_RULES,
    ExitPolicy,
    parse_policies,
)
from looplab.tracking import parse_metric

R = 4


def zoo_model(arch="mamba2", seed=0, head_scale=30.0) -> LoopedLM:
    """A float64 model whose LM head is scaled up so that the per-step next-token
    distributions differ in entropy, in KL from the previous step and in argmax (a
    fresh head is nearly uniform: every token would decide alike). Its gate has large
    random weights, so that a rule reading the gate would decide differently."""
    torch.manual_seed(seed)
    m = LoopedLM(tiny(n_loops=R, **ARCHS[arch])).double().eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(head_scale)
        m.exit_gate.weight.normal_(0, 5.0)
    return m


def make_ids(seed=3, shape=(4, 21)) -> torch.Tensor:
    return torch.randint(0, 37, shape, generator=torch.Generator().manual_seed(seed))


# ---- the rules by hand: plain Python over one token's logits at steps 1..r --------------


def probs(logits: list[float]) -> list[float]:
    top = max(logits)
    e = [math.exp(x - top) for x in logits]
    s = sum(e)
    return [x / s for x in e]


def entropy(logits):
    return -sum(p * math.log(p) for p in probs(logits) if p > 0)


def kl(logits, previous):
    return sum(p * (math.log(p) - math.log(q)) for p, q in zip(probs(logits), probs(previous)) if p > 0)


def argmax(logits):
    return max(range(len(logits)), key=lambda i: (logits[i], -i))  # first maximal index


def exits_now(rule, value, history) -> bool:
    """Whether a token whose logits at steps 1..r are `history` exits after step r."""
    if rule == ENTROPY:
        return entropy(history[-1]) < value
    if rule == KL:  # no previous step at r = 1: never
        return len(history) >= 2 and kl(history[-1], history[-2]) < value
    tops = [argmax(v) for v in history]
    run = 1  # steps r, r-1, ... with the same argmax as step r
    while run < len(tops) and tops[-1 - run] == tops[-1]:
        run += 1
    return run >= value


def step_logits(m, ids):
    """Every step's logits (R, B, L, V) of the plain loop, from the step API."""
    h, out = m.embed(ids), []
    for _ in range(R):
        h = m.step(h)
        out.append(m.logits(h))
    return torch.stack(out)


def dense_reference(m, ids, rule, value) -> torch.Tensor:
    logits = step_logits(m, ids)
    exit_step = torch.full(ids.shape, R)
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            history = []
            for r in range(1, R):
                history.append(logits[r - 1, b, t].tolist())
                if exits_now(rule, value, history):
                    exit_step[b, t] = r
                    break
    return exit_step


def skip_reference(m, ids, rule, value):
    """Skip execution one sequence at a time on its survivors alone (no batch, no
    padding), the rule applied token by token to the logits of the token's state
    after each step it ran."""
    logits_out, exits = [], []
    for row in ids:
        L = row.shape[0]
        h = m.embed(row[None])
        active, exit_step, history = list(range(L)), [R] * L, [[] for _ in range(L)]
        for r in range(1, R + 1):
            if not active:
                break
            idx = torch.tensor(active)
            h = h.clone()
            h[0, idx] = m.step(h[:, idx], positions=idx[None])[0]
            if r == R:
                break
            logits = m.logits(h)[0]
            for i in list(active):
                history[i].append(logits[i].tolist())
                if exits_now(rule, value, history[i]):
                    exit_step[i] = r
                    active.remove(i)
        logits_out.append(m.logits(h)[0])
        exits.append(torch.tensor(exit_step))
    return torch.stack(logits_out), torch.stack(exits)


def middle_threshold(m, ids, rule):
    """A threshold that splits the tokens: the median of the rule's statistic over the
    dense steps 1..R-1, to 4 decimals (policy names keep 4); stable: k = 2."""
    if rule == STABLE:
        return 2
    logits = step_logits(m, ids)
    lp = torch.log_softmax(logits, -1)
    if rule == ENTROPY:
        stat = -(lp.exp() * lp).sum(-1)[: R - 1]
    else:
        stat = (lp[1 : R - 1].exp() * (lp[1 : R - 1] - lp[: R - 2])).sum(-1)
    return round(float(stat.median()), 4)


# ---- dense and skip against the references -------------------------------------------------


@pytest.mark.parametrize("rule", ZOO_RULES)
@pytest.mark.parametrize("arch", ["mamba2", "transformer", "hybrid"])
@torch.no_grad()
def test_dense_exit_steps_equal_the_hand_computed_rule(arch, rule):
    m = zoo_model(arch)
    ids = make_ids()
    value = middle_threshold(m, ids, rule)
    out = m(ids, ExitPolicy.zoo(rule, value, DENSE), all_steps=True)
    expected = dense_reference(m, ids, rule, value)
    assert torch.equal(out.exit_step, expected)
    assert len(expected.unique()) > 1, "the threshold should split the tokens"
    if rule == KL:
        assert int(expected.min()) >= 2  # KL never exits at step 1
    # dense runs every step; the readout is each token's state at its exit step
    picked = torch.stack(out.step_logits).gather(0, (expected - 1)[None, :, :, None].expand(1, -1, -1, 37))[0]
    torch.testing.assert_close(out.logits, picked, atol=0, rtol=0)
    assert out.executed_loops == float(R)


@pytest.mark.parametrize("rule", ZOO_RULES)
@pytest.mark.parametrize(
    "arch,packing", [("mamba2", "padded"), ("mamba2", "varlen"), ("transformer", "padded"), ("hybrid", "padded")]
)
@torch.no_grad()
def test_skip_equals_the_per_sequence_reference(arch, packing, rule):
    m = zoo_model(arch, seed=1)
    ids = make_ids()
    value = middle_threshold(m, ids, rule)
    out = m(ids, ExitPolicy.zoo(rule, value, SKIP), packing=packing)
    ref_logits, ref_exit = skip_reference(m, ids, rule, value)
    assert torch.equal(out.exit_step, ref_exit)
    assert len(ref_exit.unique()) > 1 and (ref_exit < R).any()
    torch.testing.assert_close(out.logits, ref_logits, atol=1e-10, rtol=1e-10)
    assert out.executed_loops == pytest.approx(float(ref_exit.double().mean()))


@pytest.mark.parametrize("arch", ["mamba2", "transformer"])
@torch.no_grad()
def test_skip_runs_fewer_loops_as_the_threshold_loosens(arch):
    """Over each rule's grid, tightest first, the mean executed loops never grow. The
    ends are known by hand: τ = 0 never exits (strict <), so every token runs R; a
    huge entropy τ sends everyone out after step 1, a huge KL τ after step 2 (never
    at step 1); a window k >= R never closes before R."""
    m = zoo_model(arch, seed=2)
    ids = make_ids(seed=5)
    grids = {
        ENTROPY: (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 1000.0),
        KL: (0.0, 0.005, 0.05, 0.2, 1.0, 1000.0),
        STABLE: (R, 3, 2),
    }
    ends = {ENTROPY: (R, 1.0), KL: (R, 2.0), STABLE: (R, None)}
    for rule, grid in grids.items():
        loops = [m(ids, ExitPolicy.zoo(rule, v, SKIP)).executed_loops for v in grid]
        assert all(a >= b for a, b in zip(loops, loops[1:])), (rule, loops)
        assert loops[0] > loops[-1], (rule, loops)
        first, last = ends[rule]
        assert loops[0] == first and (last is None or loops[-1] == last), (rule, loops)
        assert len(set(loops)) >= 3, (rule, loops)  # the grid really moves the exits


@pytest.mark.parametrize("arch", ["mamba2", "transformer"])
def test_one_dense_pass_serves_zoo_policies_like_their_own_runs(arch):
    """evaluate_readouts (one dense pass; each zoo statistic once per step, one
    decision per threshold) against evaluate_policy (each policy's own dense run)."""
    from looplab.evaluation.validation import evaluate_policy, evaluate_readouts
    from looplab.tasks.base import Batch

    model = zoo_model(arch)
    ids = make_ids(seed=0, shape=(5, 24))
    targets = torch.roll(ids, -1, dims=1)
    targets[:, ::3] = -100  # some positions carry no target
    batch = Batch(ids, targets)
    policies = parse_policies(
        "dense-entropy:0.8,1.4,2.0;dense-kl:0.005,0.05,0.3;dense-stable:2,3;dense:0.5;forced:2;full"
    )
    fast = evaluate_readouts(model, batch, policies, batch_size=2)
    slow = [evaluate_policy(model, batch, p, batch_size=2) for p in policies]
    for rule in ZOO_RULES:  # the thresholds matter here
        assert len({r["mean_exit_step"] for r in fast if r["policy"].startswith(f"dense-{rule}")}) > 1, rule
    assert [f["policy"] for f in fast] == [s["policy"] for s in slow] == [p.spec for p in policies]
    for f, s in zip(fast, slow):
        # the same exit steps, hence the same picks; losses differ only by float32 summation
        for key in ("accuracy", "mean_exit_step", "executed_loops", "backbone_flops_per_token", "n"):
            assert f[key] == s[key], (f["policy"], key)
        for key in ("loss", "ppl"):
            assert f[key] == pytest.approx(s[key], rel=1e-6), (f["policy"], key)


def test_evaluate_policies_runs_skip_zoo_policies_on_their_own():
    from looplab.evaluation.validation import evaluate_policies, evaluate_policy
    from looplab.tasks.base import Batch

    model = zoo_model("mamba2")
    ids = make_ids(seed=0, shape=(3, 16))
    batch = Batch(ids, torch.roll(ids, -1, dims=1))
    policies = parse_policies("skip-entropy:1.4;dense-entropy:1.4;skip-kl:1000")
    records = evaluate_policies(model, batch, policies, batch_size=2)
    assert records[0] == evaluate_policy(model, batch, policies[0], batch_size=2)
    assert records[0]["executed_loops"] < R == records[1]["executed_loops"]
    assert records[2]["executed_loops"] == 2.0 and records[2]["mean_exit_step"] == 2.0


# ---- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,label,prefix",
    [
        ("dense-entropy:2.5", "dense entropy<2.5", "dense_entropy2.5_"),
        ("skip-entropy:2.5", "skip entropy<2.5", "skip_entropy2.5_"),
        ("skip-entropy:2", "skip entropy<2.0", "skip_entropy2.0_"),
        ("dense-kl:0.01", "dense KL<0.01", "dense_kl0.01_"),
        ("skip-kl:0.01", "skip KL<0.01", "skip_kl0.01_"),
        ("skip-kl:0.0005", "skip KL<0.0005", "skip_kl0.0005_"),
        ("dense-stable:2", "dense stable k=2", "dense_stable2_"),
        ("skip-stable:2", "skip stable k=2", "skip_stable2_"),
    ],
)
def test_zoo_names_round_trip(spec, label, prefix):
    policy = ExitPolicy.parse(spec)
    assert (policy.label, policy.metric_prefix) == (label, prefix)
    assert ExitPolicy.parse(policy.spec) == policy == ExitPolicy.from_prefix(prefix)
    assert parse_metric(prefix + "ppl") == (policy, "ppl")
    assert parse_metric(prefix + "lm_eval.piqa") == (policy, "lm_eval.piqa")
    groups = PREFIX_PATTERN.fullmatch(prefix).groupdict()
    execution, rule = policy.kind.split("-")
    assert (groups["execution"], groups["rule"], groups["val"], groups["depth"]) == (execution, rule, None, None)
    assert float(groups["q"]) == policy.threshold


def test_gate_prefixes_keep_their_groups():
    groups = PREFIX_PATTERN.fullmatch("skip_q0.4_").groupdict()
    assert (groups["execution"], groups["q"], groups["rule"]) == ("skip", "0.4", None)
    assert PREFIX_PATTERN.fullmatch("forced_d2_")["depth"] == "2" and PREFIX_PATTERN.fullmatch("val_")["val"]
    assert PREFIX_PATTERN.fullmatch("skip_median2_") is None and parse_metric("skip_entropy2.5_bogus") is None


def test_policy_grids_parse_zoo_groups_and_ranges():
    got = parse_policies("skip-entropy:1.0,2.0; dense-kl:0.01; skip-stable:2-4; skip:0.4; full")
    assert [p.spec for p in got] == [
        "skip-entropy:1.0",
        "skip-entropy:2.0",
        "dense-kl:0.01",
        "skip-stable:2",
        "skip-stable:3",
        "skip-stable:4",
        "skip:0.4",
        "full",
    ]
    for rule, grid in ZOO_GRIDS.items():  # the default grids are valid policies in both executions
        for execution in (DENSE, SKIP):
            specs = [ExitPolicy.zoo(rule, v, execution).spec for v in grid]
            assert parse_policies(f"{execution}-{rule}:" + ",".join(s.partition(":")[2] for s in specs)) == [
                ExitPolicy.parse(s) for s in specs
            ]


GENERIC = (
    "allowed: full | forced:D | dense:Q | skip:Q | dense-entropy:T | skip-entropy:T | dense-kl:T | "
    "skip-kl:T | dense-stable:K | skip-stable:K"
)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: ExitPolicy.parse("skip-stable:1"), "policy stable k=1 is invalid; allowed: an integer >= 2"),
        (lambda: ExitPolicy.parse("skip-stable:2.5"), "policy 'skip-stable:2.5' is invalid; " + GENERIC),
        (
            lambda: ExitPolicy.parse("dense-entropy:-1"),
            "policy entropy threshold=-1.0 is invalid; allowed: a number >= 0 (nats) with at most 4 decimals",
        ),
        (
            lambda: ExitPolicy.parse("skip-kl:0.00001"),
            "policy kl threshold=1e-05 is invalid; allowed: a number >= 0 (nats) with at most 4 decimals",
        ),
        (lambda: ExitPolicy.parse("skip-kl:nan"), "policy kl threshold=nan is invalid"),
        (lambda: ExitPolicy.parse("skip-entropy"), "policy 'skip-entropy' is invalid; " + GENERIC),
        (lambda: ExitPolicy.parse("forced-entropy:1"), "policy 'forced-entropy:1' is invalid; " + GENERIC),
        (lambda: ExitPolicy.parse("skip-median:1"), "policy 'skip-median:1' is invalid; " + GENERIC),
        (
            lambda: ExitPolicy.zoo(ENTROPY, 1.0, "forced"),
            "policy execution='forced' is invalid for rule 'entropy'; allowed: dense | skip",
        ),
        (
            lambda: ExitPolicy(SKIP, "median", threshold=1.0),
            "policy rule='median' is invalid; allowed: gate | given | entropy | kl | stable",
        ),
        (lambda: ExitPolicy.zoo(STABLE, True), "policy stable k=True is invalid; allowed: an integer >= 2"),
        (
            lambda: ExitPolicy(SKIP, ENTROPY, q=0.4, threshold=2.0),
            "policy q=0.4 is invalid for rule 'entropy'; allowed: q with rule gate",
        ),
        (
            lambda: ExitPolicy(SKIP, "gate", q=0.4, threshold=2.0),
            "policy threshold=2.0 is invalid for rule 'gate'; allowed: threshold with rules entropy | kl | stable",
        ),
        (lambda: parse_policies("skip-stable:1-3"), "policy stable k=1 is invalid"),
    ],
)
def test_bad_zoo_policies_are_one_line_errors(make, message):
    with pytest.raises(ConfigError) as caught:
        make()
    assert message in str(caught.value) and "\n" not in str(caught.value)


# ---- the tools that take a policy ------------------------------------------------------------


def test_bench_times_a_zoo_rule_against_its_dense_twin():
    from test_bench import UNMEASURED

    import looplab
    from looplab.costs.timing import bench_point
    from looplab.tracking import bench_point_name

    model = zoo_model("mamba2")
    ids = make_ids(shape=(2, 16))
    policy = ExitPolicy.parse("skip-entropy:1.4")
    r = bench_point(model, ids, policy, warmup=0, repeats=1, peaks=UNMEASURED)
    with torch.no_grad():
        expected = float(model(ids, policy).exit_step.double().mean())
    assert r.policy == "skip-entropy:1.4" and r.mean_executed_loops == pytest.approx(expected) and expected < R
    assert bench_point_name({"batch": 2, "seq_len": 16, "policy": r.policy}) == "b2_L16_skip_entropy1.4"
    with pytest.raises(ConfigError, match="allowed: skip policies .*skip-entropy:T"):
        bench_point(looplab.load_model("phop-debug", n_loops=R), ids, ExitPolicy.parse("dense-entropy:1.4"))


def test_bench_command_accepts_zoo_policies(tmp_path, capsys):
    from looplab.cli import main

    # A fresh model's next-token entropy is at most log V, far below 1000 nats: every
    # token leaves after step 1. KL never exits at step 1: everyone leaves after step 2.
    assert (
        main(
            [
                "bench",
                "--preset",
                "phop-debug",
                "--batch",
                "2",
                "--seq-len",
                "32",
                "--policies",
                "skip-entropy:1000;skip-kl:1000",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--json",
                str(tmp_path / "b.json"),
                "n_loops=4",
            ]
        )
        == 0
    )
    records = json.loads((tmp_path / "b.json").read_text())
    assert [(r["policy"], r["mean_executed_loops"]) for r in records] == [
        ("skip-entropy:1000.0", 1.0),
        ("skip-kl:1000.0", 2.0),
    ]
    assert "skip-entropy:1000.0" in capsys.readouterr().err


def test_eval_command_evaluates_zoo_policies(tmp_path, capsys):
    from looplab.cli import main

    assert (
        main(
            [
                "train",
                "--preset",
                "phop-debug",
                "--out",
                str(tmp_path / "pre"),
                "train.steps=2",
                "train.batch_size=4",
                "task.eval_count=20",
                "train.eval_every=0",
                "model.n_loops=4",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(tmp_path / "pre" / "checkpoint"),
                "--policies",
                "dense-entropy:1000;skip-entropy:1000;skip-kl:1000;skip-stable:4;forced:1",
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    got = [(r["policy"], r["mean_exit_step"], r["executed_loops"]) for r in records]
    # by hand: entropy < 1000 at step 1 for every token; KL exits at step 2 at the
    # earliest; a window of k = R steps never closes before R
    assert got == [
        ("dense-entropy:1000.0", 1.0, 4.0),
        ("skip-entropy:1000.0", 1.0, 1.0),
        ("skip-kl:1000.0", 2.0, 2.0),
        ("skip-stable:4", 4.0, 4.0),
        ("forced:1", 1.0, 1.0),
    ]
    # reading every token out at step 1 is forced depth 1, whatever runs after it: the
    # same numbers through three code paths, equal up to float rounding (which kernels
    # round how depends on the CPU: exact equality held on some machines, not on others)
    assert records[0]["ppl"] == pytest.approx(records[1]["ppl"], rel=1e-6)
    assert records[4]["ppl"] == pytest.approx(records[1]["ppl"], rel=1e-6)


def test_lm_eval_adapter_takes_a_zoo_policy():
    pytest.importorskip("lm_eval")
    import looplab
    from looplab.evaluation.harness import LoopLabLM

    model = looplab.load_model("phop-debug", vocab_size=259, n_loops=R, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # per-token entropies spread out (see zoo_model)
    lm = LoopLabLM(checkpoint=model, tokenizer="bytes", device="cpu", batch_size=3, policy="skip-entropy:2.0")
    assert lm.policy == ExitPolicy.zoo(ENTROPY, 2.0) and lm.get_model_info()["policy"] == "skip-entropy:2.0"
    texts = [b"The cat", b"sat on the mat", b"looped"]
    requests = [((None, None), [256] + list(t), list(b" end")) for t in texts]
    results = lm._loglikelihood_tokens(requests)
    for (_, context, continuation), (logprob, _) in zip(requests, results):
        ids = context + continuation
        with torch.no_grad():
            logits = model(torch.tensor([ids]), lm.policy).logits[0].float()
        direct = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        assert logprob == pytest.approx(float(direct[-len(continuation) :].sum()), abs=1e-4)
    assert 1.0 <= lm.executed_loops < R


@pytest.mark.parametrize("rule", [GATE, ENTROPY, KL, STABLE])
def test_a_rules_initial_state_reads_as_a_first_step(rule):
    # Depth batching updates first and later steps in one call when a rule has an
    # initial state: it must give a first step's statistic and next state bit for bit.
    cls = EXIT_RULES[rule]
    torch.manual_seed(0)
    x = torch.randn(7) * 6 if cls.reads == GATE_LOGITS else torch.randn(7, 11) * 3
    initial = cls.initial_state(7, x.device)
    if rule in (KL, STABLE):  # their first step differs from any state: no initial state
        assert initial is NotImplemented
        return
    first, first_next = cls.statistic(x, None)
    mine, mine_next = cls.statistic(x, initial)
    assert torch.equal(first, mine)
    if first_next is None:
        assert mine_next is None
    else:
        for a, b in zip(first_next, mine_next):
            assert torch.equal(a, b)
        # and the step after reads the two next states alike
        y = torch.randn(7) * 6
        assert torch.equal(cls.statistic(y, first_next)[0], cls.statistic(y, mine_next)[0])
