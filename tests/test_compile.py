"""Compiled backbones (looplab/models/compiled.py) against eager ones.

train.compile: training follows eager's trajectory (losses and weights to float
rounding) for every backbone, on the dense forward and on skip's packed survivors
(CHASE's depth holes), and the compiled function really ran.
compile_decoding: generation gives eager's tokens and loops for every backbone, every
kind of policy, both schedules, at batch 1 and batched."""

import re

import pytest
import torch
from test_hf_export import tiny_model
from test_stages import stage_cfg

from looplab.config import ConfigError, TrainConfig, apply_overrides
from looplab.inference.depth_batching import gate_loop
from looplab.inference.generate import decode_step, generate, prefill
from looplab.models import compiled
from looplab.models.compiled import compile_decoding, compiles
from looplab.models.cpu import cpu_sequence
from looplab.policy import ExitPolicy, exit_rule
from looplab.training.steps import optimizer_step

STEPS = 3
ATTENTION = {"model.attn_head_dim": 16, "model.rope_dim": 16}
ARCHS = {
    "mamba2": {},
    "transformer": {"model.arch": "transformer", **ATTENTION},
    "hybrid": {"model.arch": "hybrid", "model.n_layers": 2, "model.attn_layer_idx": (1,), **ATTENTION},
}
CASES = {  # dense: Stage-1's full forward; skip: every minibatch packs its survivors
    "dense": ("stage1", {}),
    "skip": ("chase", {"hole.rho": 1.0, "hole.sampler": "depth", "hole.hp": 0.6}),
}


def trajectory(cfg):
    step, model = optimizer_step(cfg, "cpu")
    losses = [step() for _ in range(STEPS)]
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}, model


# Inductor builds C++ for 1-2 minutes a case on 2 cores (from a cold cache): the suite
# traces one case with the aot_eager backend (dynamo's graph and AOT autograd, which is
# where this code's own mistakes would show) and the slow tier (.ci/run) builds them all.
QUICK = "aot_eager"
MATRIX = [pytest.param("mamba2", "skip", QUICK, id="mamba2-skip-traced")] + [
    pytest.param(arch, case, "inductor", id=f"{arch}-{case}", marks=pytest.mark.slow)
    for arch in ARCHS
    for case in CASES
]


@pytest.fixture
def backend(monkeypatch, request):
    monkeypatch.setattr(compiled, "BACKEND", request.param)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # the graphs counted below are this test's
    return request.param


@pytest.fixture
def scans(monkeypatch):
    """Every call of the C++ scan (models/cpu/cpu_sequence.py) at run time: whether its rows
    were packed (seq_idx), for the test to see that it ran."""
    built, calls = cpu_sequence.kernel(), []

    class Counting:
        def scan_forward(self, *args):
            calls.append(args[5] is not None)
            return built.scan_forward(*args)

        def __getattr__(self, name):  # the scan's backward and the conv
            return getattr(built, name)

    monkeypatch.setattr(cpu_sequence, "kernel", lambda: Counting())
    return calls


@pytest.mark.parametrize("arch,case,backend", MATRIX, indirect=["backend"])
def test_compiled_training_follows_eager(arch, case, backend, scans):
    stage, overrides = CASES[case]
    cfg = stage_cfg(stage, **ARCHS[arch], **overrides, **{"train.batch_size": 4})
    eager_losses, eager_weights, _ = trajectory(apply_overrides(cfg, {"train.compile": "off"}))
    torch._dynamo.reset()
    assert not scans  # eager training keeps the torch ops
    compiled_losses, compiled_weights, model = trajectory(apply_overrides(cfg, {"train.compile": "on"}))
    if arch != "transformer":  # on a CPU a compiled run scans with the C++ kernels, packed rows too
        varlen = case == "skip" and arch == "mamba2"  # (the hybrid pads its survivors: no seq_idx)
        assert set(scans) == ({False, True} if varlen else {False})
    assert model.compiled_backbone.shapes  # the dense first loop's shape (skip's packed loops run eager)
    assert all(seq_idx_none for *_, seq_idx_none in model.compiled_backbone.shapes)  # no packed layout compiled
    # The compiled function ran: dynamo produced graphs for it (a silent fallback would not).
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-4)
    for name, w in eager_weights.items():
        assert torch.allclose(compiled_weights[name], w, rtol=1e-4, atol=1e-5), name


def test_compile_setting():
    assert compiles("auto", torch.device("cuda")) and not compiles("auto", torch.device("cpu"))
    assert compiles("on", torch.device("cpu")) and not compiles("off", torch.device("cuda"))
    with pytest.raises(ConfigError, match=re.escape("TrainConfig.compile='yes' is invalid; allowed: auto | on | off")):
        TrainConfig(compile="yes")


DECODE_POLICIES = ["full", "forced:2", "dense:0.5", "skip:0.5", "skip-entropy:5.0"]


# Every backbone × policy × batch × schedule compiles for minutes: the slow tier runs them
# all, and the hybrid backbone (both mixers) traced, batched under full and skip (21 s).
DECODE_MATRIX = [
    pytest.param("hybrid", ("full", "skip:0.5"), (3,), QUICK, id="hybrid-traced", marks=pytest.mark.slow)
] + [
    pytest.param(arch, tuple(DECODE_POLICIES), (1, 3), "inductor", id=arch, marks=pytest.mark.slow)
    for arch in ("mamba2", "transformer", "hybrid")
]


def same_generation(got, eager, case) -> None:
    assert (got.tokens, got.loops, got.exit_step) == (eager.tokens, eager.loops, eager.exit_step), case


@pytest.mark.parametrize("arch,specs,batches,backend", DECODE_MATRIX, indirect=["backend"])
def test_compiled_decoding_gives_eager_tokens_and_loops(arch, specs, batches, backend):
    model = tiny_model(arch, seed=1)
    prompts = [[5, 9, 2, 7, 1, 3], [4, 4, 8], [6, 2, 9, 9, 1, 0, 3, 5]]
    cases = [(spec, rows, schedule) for spec in specs for rows in batches for schedule in ("lockstep", "depth")]
    eager = {
        case: generate(model, prompts[: case[1]], 6, ExitPolicy.parse(case[0]), schedule=case[2]) for case in cases
    }
    torch._dynamo.reset()
    compile_decoding(model)
    for case in cases:
        same_generation(
            generate(model, prompts[: case[1]], 6, ExitPolicy.parse(case[0]), schedule=case[2]), eager[case], case
        )
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # it ran compiled
    assert any(loops != [model.cfg.n_loops] * 6 for case in cases for loops in eager[case].loops)  # exits happened


# ~15 s to build the package on 2 cores: the slow tier builds it, the suite traces (dynamo)
@pytest.mark.parametrize(
    "backend", [QUICK, pytest.param("inductor", marks=pytest.mark.slow)], indirect=True, ids=["traced", "ahead-of-time"]
)
def test_a_full_depth_batch_steps_as_one_graph_with_the_gates_decision(backend, monkeypatch):
    """Depth batching under the gate's skip policy: a step in which every row runs is one
    compiled call of gate_loop (the loop at each row's slot, then the gate's decision;
    on a CPU with Inductor, ahead of time), with eager's tokens, exits and loops, and
    after the weights change in place, the new weights' (a package built again)."""
    model = tiny_model("mamba2", seed=1)
    prompts, policy = [[5, 9, 2, 7, 1, 3], [4, 4, 8], [6, 2, 9, 9, 1, 0, 3, 5]], ExitPolicy.parse("skip:0.5")

    def decoded():
        return generate(model, prompts, 6, policy, schedule="depth")

    def eager():
        step, model.compiled_decode = model.compiled_decode, None
        try:
            return decoded()
        finally:
            model.compiled_decode = step

    compile_decoding(model)
    step, calls = model.compiled_decode, []
    real = step.gate_loop
    monkeypatch.setattr(step, "gate_loop", lambda *a: calls.append(1) or real(*a))
    same_generation(decoded(), eager(), "skip:0.5, depth")
    assert calls  # full batches stepped as one call
    if backend == "inductor":  # the package served them, not dynamo
        assert step.gate_step is None and [key[0] for key in step.packages.packages] == ["gate"]
    else:
        assert step.gate_step is not None
    with torch.no_grad():
        model.backbone.layers[0][0].inner.in_proj.weight.mul_(0.5)
    same_generation(decoded(), eager(), "skip:0.5, depth, new weights")
    assert backend != "inductor" or (len(step.packages.packages) == 1 and not step.packages.failed)


@pytest.mark.slow  # Inductor compiles ("reduce-overhead" mode): tens of seconds on 2 cores
def test_the_cuda_graph_step_gives_eager_tokens_and_loops():
    """compile_decoding(cuda_graphs=True) marks the cache static, starts a capture step per
    call and clones its output. On a CPU Inductor captures nothing, so this checks that
    wrapping against eager; `looplab doctor` checks the captures on a GPU."""
    model = tiny_model("mamba2", seed=1)
    prompts = [[5, 9, 2, 7, 1, 3], [4, 4, 8], [6, 2, 9, 9, 1, 0, 3, 5]]
    cases = [(spec, schedule) for spec in ("full", "skip:0.5") for schedule in ("lockstep", "depth")]
    eager = {case: generate(model, prompts, 6, ExitPolicy.parse(case[0]), schedule=case[1]) for case in cases}
    torch._dynamo.reset()
    compile_decoding(model, cuda_graphs=True)
    assert model.compiled_decode.cuda_graphs
    for case in cases:
        same_generation(generate(model, prompts, 6, ExitPolicy.parse(case[0]), schedule=case[1]), eager[case], case)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # it ran compiled
    # Serving's fused steps (depth_batching.depth_steps) go through the same capture.
    from looplab.inference.arrivals import RequestStream, make_requests, serve

    requests = make_requests(model, None, RequestStream(requests=5, prompt_len=(3, 8), new_tokens=(4, 8), seed=2))
    policy = ExitPolicy.parse("skip:0.5")
    captured = serve(model, requests, policy, slots=3, schedule="depth")
    assert model.compiled_decode.storage_fns  # the fused call ran compiled
    compile_decoding(model, enabled=False)
    eager_served = serve(model, requests, policy, slots=3, schedule="depth")
    assert (captured.tokens, captured.loops) == (eager_served.tokens, eager_served.loops)


# ~10 s to build each package on 2 cores: the slow tier builds them, the suite traces (dynamo)
@pytest.mark.parametrize(
    "backend", [QUICK, pytest.param("inductor", marks=pytest.mark.slow)], indirect=True, ids=["traced", "ahead-of-time"]
)
def test_a_lockstep_token_under_skip_dense_or_forced_is_one_compiled_call(backend):
    """Lockstep decoding under the gate's skip or dense policy or forced: each token step
    runs as one compiled call (generate._fused_token_step: the loops, the gate's
    decisions, skip's exited rows pointed at the scratch slot, the head), for every row
    (on a CPU with Inductor, ahead of time) and for a server's running rows, with eager's
    tokens, exits and loops; generating further from those states shows the holes were
    kept."""
    from looplab.inference.arrivals import RequestStream, make_requests, serve
    from looplab.inference.generate import _fused_token_step

    model = tiny_model("mamba2", seed=1)
    with torch.no_grad():
        model.exit_gate.weight.normal_(0, 5.0, generator=torch.Generator().manual_seed(0))
        model.exit_gate.bias.zero_()
    prompts = [[5, 9, 2, 7, 1, 3], [4, 4, 8], [6, 2, 9, 9, 1, 0, 3, 5]]
    requests = make_requests(model, None, RequestStream(requests=7, prompt_len=(3, 8), new_tokens=(4, 10), seed=2))
    for spec in ("skip:0.5", "dense:0.5", "forced:2"):
        policy = ExitPolicy.parse(spec)
        eager = generate(model, prompts, 8, policy)
        eager_served = serve(model, requests, policy, slots=3, schedule="lockstep")
        compile_decoding(model)
        step = model.compiled_decode
        got = generate(model, prompts, 8, policy)
        served = serve(model, requests, policy, slots=3, schedule="lockstep")
        compile_decoding(model, enabled=False)
        same_generation(got, eager, spec)
        assert (served.tokens, served.loops) == (eager_served.tokens, eager_served.loops), spec
        assert (_fused_token_step, False) in step.storage_fns  # a server's running rows, by dynamo
        if backend == "inductor":  # every row: the package, not dynamo
            assert (_fused_token_step, True) not in step.storage_fns
            assert "storage" in [key[0] for key in step.packages.packages]
        else:
            assert (_fused_token_step, True) in step.storage_fns
    assert len({n for loops in eager_served.loops for n in loops}) == 1  # forced: 2 loops each
    skip = generate(model, prompts, 8, ExitPolicy.parse("skip:0.5"))
    assert len({n for loops in skip.loops for n in loops}) > 1  # skip's tokens left at different loops


# ~10 s a backbone traced: the hybrid (attention's positions and growing buffers) in the slow tier
@pytest.mark.parametrize("arch", ["mamba2", pytest.param("hybrid", marks=pytest.mark.slow)])
def test_the_whole_full_depth_step_follows_the_general_loop(arch, monkeypatch):
    """Under a full-depth policy decode_step runs its token step compiled whole
    (generate._full_depth_step): every row, and a subset of the rows (a server's running
    slots), gives the general per-loop loop's logits and advances only its rows' cache
    (traced with aot_eager: dynamo and AOT autograd are where its own mistakes show)."""
    monkeypatch.setattr(compiled, "BACKEND", QUICK)
    torch._dynamo.reset()
    model = tiny_model(arch, seed=2)
    ids = torch.tensor([[5, 9, 2, 7, 1, 3, 8, 4], [4, 4, 8, 2, 6, 1, 0, 9], [6, 2, 9, 9, 1, 0, 3, 5]])
    pre = prefill(model, ids[:, :4], capacity=8)
    rows = torch.tensor([0, 2])

    def run(cache):
        got = [decode_step(model, cache, ids[:, 4]).logits]
        got.append(decode_step(model, cache, ids[rows, 5], rows=rows).logits)
        got.append(decode_step(model, cache, ids[:, 6], readout=False).logits)
        got.append(decode_step(model, cache, ids[:, 7]).logits)  # reads what the last call left
        return got, cache.length.tolist()

    eager = run(pre.cache.clone())
    compile_decoding(model)
    calls = []
    monkeypatch.setattr(model.compiled_decode, "compiled", lambda *a: calls.append(a))  # the per-loop step
    got = run(pre.cache.clone())
    assert not calls and model.compiled_decode.whole_step  # the whole step ran, not the per-loop one
    assert got[1] == eager[1] == [8, 7, 8]
    assert got[0][2] is None and eager[0][2] is None
    for g, e in zip(got[0][:2] + got[0][3:], eager[0][:2] + eager[0][3:]):
        assert torch.allclose(g, e, atol=1e-5), (g - e).abs().max()


@pytest.mark.slow  # AOTInductor builds a package per signature: ~15 s each on 2 cores
def test_the_ahead_of_time_step_follows_the_general_loop_and_new_weights(monkeypatch):
    """On a CPU, full-depth decoding of every row runs the whole token step compiled
    ahead of time (models/cpu/ahead_of_time.py): the general loop's logits, lengths and
    states, with and without the readout, and after the weights change in place (as an
    optimizer step changes them) the new weights' logits, from a package built again."""
    monkeypatch.setattr(compiled, "BACKEND", "inductor")
    torch._dynamo.reset()
    model = tiny_model("mamba2", seed=3)
    ids = torch.tensor([[5, 9, 2, 7, 1, 3, 8, 4], [4, 4, 8, 2, 6, 1, 0, 9], [6, 2, 9, 9, 1, 0, 3, 5]])
    pre = prefill(model, ids[:, :4], capacity=8)

    def run(cache, start):
        logits = [decode_step(model, cache, ids[:, start]).logits]
        assert decode_step(model, cache, ids[:, start + 1], readout=False).logits is None
        logits.append(decode_step(model, cache, ids[:, start + 2]).logits)  # reads what the last call left
        states = [t.clone() for s in cache.storage for t in vars(s).values()]
        return logits, cache.length.tolist(), states

    def same(got, eager):
        assert got[1] == eager[1]
        for g, e in zip(got[0] + got[2], eager[0] + eager[2]):
            assert torch.allclose(g, e, atol=1e-5), (g - e).abs().max()

    def eager_run(start):
        step, model.compiled_decode = model.compiled_decode, None
        try:
            return run(pre.cache.clone(), start)
        finally:
            model.compiled_decode = step

    compile_decoding(model)
    same(run(pre.cache.clone(), 4), eager_run(4))
    steps = model.compiled_decode.packages
    assert len(steps.packages) == 2  # one signature with the readout, one without
    with torch.no_grad():
        model.backbone.layers[0][0].inner.in_proj.weight.mul_(0.5)
    same(run(pre.cache.clone(), 4), eager_run(4))
    assert len(steps.packages) == 2 and not steps.failed  # rebuilt for the new weights


def test_an_ahead_of_time_step_that_cannot_build_leaves_decoding_to_dynamo(monkeypatch):
    from looplab.inference.generate import _full_depth_step
    from looplab.models.cpu.ahead_of_time import AheadOfTimeSteps

    def fail(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", fail)
    model = tiny_model("mamba2", seed=3)
    pre = prefill(model, torch.tensor([[5, 9, 2, 7]]), capacity=8)
    steps = AheadOfTimeSteps(model)
    with torch.no_grad(), pytest.warns(UserWarning, match="no compiler here"):
        assert steps.token_step(_full_depth_step, pre.cache, torch.tensor([3]), True) is NotImplemented
    assert steps.failed and pre.cache.length.tolist() == [4]  # the caller's cache untouched
    with torch.no_grad():  # no second attempt, for any kind of step
        assert steps.token_step(_full_depth_step, pre.cache, torch.tensor([3]), True) is NotImplemented
        rule, h, slots = exit_rule(ExitPolicy.parse("skip:0.5")), torch.zeros(1, model.cfg.d_model), torch.tensor([0])
        assert steps.gate_loop(gate_loop, rule, h, slots, pre.cache, rule.initial_state(1, "cpu")) is NotImplemented


# ~10 s to build each package on 2 cores: the slow tier builds them, the suite traces (dynamo)
@pytest.mark.parametrize(
    "backend", [QUICK, pytest.param("inductor", marks=pytest.mark.slow)], indirect=True, ids=["traced", "ahead-of-time"]
)
def test_fused_depth_steps_compiled_serve_eagers_tokens_and_loops(backend, monkeypatch):
    """Serving under arrivals on the depth schedule: while every row serves, several
    steps run as one compiled call (depth_batching.depth_steps: loops, the gate's
    decisions, the finished rows' readout and next tokens; on a CPU with Inductor, one
    ahead-of-time package per policy and readout), with the tokens and loops of eager
    serving, the finished rows read out alone (a data-dependent gather) or every row."""
    from looplab.inference.arrivals import RequestStream, make_requests, serve

    model = tiny_model("mamba2", seed=1)
    with torch.no_grad():
        model.exit_gate.weight.normal_(0, 5.0, generator=torch.Generator().manual_seed(0))
        model.exit_gate.bias.zero_()
    requests = make_requests(model, None, RequestStream(requests=7, prompt_len=(3, 8), new_tokens=(4, 10), seed=2))
    import looplab.inference.depth_batching as depth_batching

    cases = [("full", False), ("skip:0.5", False), ("skip:0.5", True)]  # (policy, the readout gathered)
    for spec, gathered in cases:
        monkeypatch.setattr(depth_batching, "gathered_readout", lambda model, rows, g=gathered: g)
        policy = ExitPolicy.parse(spec)
        eager = serve(model, requests, policy, slots=3, schedule="depth")
        compile_decoding(model)
        step = model.compiled_decode
        served = serve(model, requests, policy, slots=3, schedule="depth")
        compile_decoding(model, enabled=False)
        assert (served.tokens, served.loops) == (eager.tokens, eager.loops), (spec, gathered)
        if backend == "inductor":  # the package served the fused calls, not dynamo
            assert not step.storage_fns and "storage" in [key[0] for key in step.packages.packages]
        else:
            assert (depth_batching.depth_steps, True) in step.storage_fns
    assert len({n for loops in eager.loops for n in loops}) > 1  # skip's tokens left at different loops
