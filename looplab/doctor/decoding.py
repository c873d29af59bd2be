"""The decoding checks: generation against the full forward for every exit policy,
compiled decoding against eager (tokens, loops, CUDA-graph captures) and its speed."""

from __future__ import annotations

from looplab.doctor.checks import Check, failed, max_error, passed, skipped, within


def generation_check(device) -> list[Check]:
    """For every exit policy kind, a prompt prefilled and three tokens decoded one by one
    give the logits of the full forward over the same tokens in the same policy."""
    import torch

    from looplab.checkpoint import load_model
    from looplab.inference.generate import decode_step, prefill
    from looplab.policy import ExitPolicy

    dtype = torch.float32
    model = load_model("debug", seed=0).to(device).eval()
    with torch.no_grad():  # a gate that exits: the untrained bias of −2 would rarely leave
        model.exit_gate.bias.fill_(0.0)
    torch.manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 24), device=device)
    prompt, new = 20, 4
    out = []
    for spec in ("full", "forced:2", "dense:0.5", "skip:0.5", "skip-entropy:2.0"):
        policy = ExitPolicy.parse(spec)
        with torch.no_grad():
            full = model(ids, policy).logits[:, prompt - 1 :]
            state = prefill(model, ids[:, :prompt], policy, capacity=ids.shape[1])
            logits = [state.logits]
            for k in range(new - 1):
                step = decode_step(model, state.cache, ids[:, prompt + k], policy).logits
                assert step is not None  # decode_step reads out unless told readout=False
                logits.append(step)
        decoded = torch.stack(logits, 1)
        out.append(within(f"generation {spec} vs full forward", {"logits": max_error(decoded, full[:, :new])}, dtype))
    return out


def compiled_decoding_check(device) -> list[Check]:
    """The compiled one-token step (looplab/models/compiled.py) generates the eager step's
    tokens and loops, lockstep and depth-batched, on this node's device. On a CPU it is
    skipped: compiling costs tens of seconds there and tests/test_compile.py checks it."""
    import torch

    from looplab.checkpoint import load_model
    from looplab.inference.generate import generate
    from looplab.models.compiled import compile_decoding
    from looplab.policy import ExitPolicy

    if device.type != "cuda":
        return [
            skipped(
                "compiled decoding vs eager",
                "CPU: tests/test_compile.py checks it (compiling takes tens of seconds here)",
            )
        ]
    model = load_model("debug", seed=0).to(device).eval()
    with torch.no_grad():
        # A gate that exits for some tokens and not others, its logits spread wide (a unit
        # weight on a normalized state: std about 4). With bias 0 and the initial weights
        # every λ sat near 0.5, so skip:0.5's decisions lay on the threshold, where another
        # kernel's float rounding flips them: on an H200, skip:0.5 lockstep differed.
        model.exit_gate.bias.fill_(0.0)
        model.exit_gate.weight.mul_(4.0 / model.exit_gate.weight.norm())
    torch.manual_seed(0)
    prompts = torch.randint(0, model.cfg.vocab_size, (4, 16)).tolist()
    cases = [(spec, schedule) for spec in ("full", "skip:0.5") for schedule in ("lockstep", "depth")]

    def generations():
        return [generate(model, prompts, 8, ExitPolicy.parse(spec), schedule=schedule) for spec, schedule in cases]

    eager = generations()
    out = []
    for label, cuda_graphs in (("compiled decoding", False), ("cuda-graph decoding", True)):
        compile_decoding(model, cuda_graphs=cuda_graphs)  # once: every case after it runs the same step
        skips_before = _cudagraph_skips()
        for (spec, schedule), e, c in zip(cases, eager, generations()):
            name = f"{label} {spec} {schedule}"
            difference = first_difference(e, c)
            out.append(
                passed(name, "tokens and loops equal eager's")
                if difference is None
                else failed(name, f"{difference} differ from the eager step's")
            )
        out.append(_served_check(model, label))
        if cuda_graphs:
            # Inductor skips a capture it cannot make sound (a mutated input not marked
            # static, a CPU tensor) and runs the graph uncaptured: tokens still equal.
            skips = _cudagraph_skips() - skips_before
            out.append(
                passed("cuda-graph captures", "no capture skipped", 0, "skips")
                if skips == 0
                else failed(
                    "cuda-graph captures", f"Inductor skipped {skips} CUDA-graph capture(s)", "", skips, "skips"
                )
            )
    return out + decoding_speed(model, prompts, device)


def _served_check(model, label: str) -> Check:
    """Serving under arrivals on the depth schedule (several greedy steps a call:
    depth_batching.depth_steps) with the model's current decode step, against eager's."""
    from looplab.inference.arrivals import RequestStream, make_requests, serve
    from looplab.policy import ExitPolicy

    requests = make_requests(model, None, RequestStream(requests=8, prompt_len=(4, 16), new_tokens=(4, 12), seed=0))
    policy = ExitPolicy.parse("skip:0.5")
    served = serve(model, requests, policy, slots=4, schedule="depth")
    step, model.compiled_decode = model.compiled_decode, None
    try:
        eager = serve(model, requests, policy, slots=4, schedule="depth")
    finally:
        model.compiled_decode = step
    name = f"{label} skip:0.5 served under arrivals"
    same = (served.tokens, served.loops) == (eager.tokens, eager.loops)
    return (
        passed(name, "tokens and loops equal eager's")
        if same
        else failed(name, "tokens or loops differ from eager serving's")
    )


def _cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


TIMED_TOKENS = 32  # the decoding speed check's new tokens per prompt


def decoding_speed(model, prompts, device) -> list[Check]:
    """Seconds a token of `model`'s compiled decode step (compile_decoding), and on a GPU
    of the step captured in CUDA graphs, each against the eager step: full lockstep
    generation of TIMED_TOKENS after the prompts, the median of three after a warm-up,
    every arm on the same prompts. Leaves the model eager. Figures, not pass marks: where
    compiled is not faster, the node's decode is bound by something compiling does not
    remove (on a GPU: kernel launches, which CUDA graphs remove)."""
    from looplab.costs.timing import median_seconds
    from looplab.inference.generate import generate
    from looplab.models.compiled import compile_decoding
    from looplab.policy import ExitPolicy

    def per_token() -> float:
        def run():
            return generate(model, prompts, TIMED_TOKENS, ExitPolicy.parse("full"))

        return median_seconds(run, 3, warmup=1, device=device) / TIMED_TOKENS

    arms = [("compiled", False)] + ([("cuda-graph", True)] if device.type == "cuda" else [])
    seconds = {}
    for label, cuda_graphs in arms:
        compile_decoding(model, cuda_graphs=cuda_graphs)
        seconds[label] = per_token()
    compile_decoding(model, enabled=False)
    eager = per_token()
    shape = f"full lockstep, batch {len(prompts)}, {TIMED_TOKENS} tokens after a {len(prompts[0])}-token prompt"
    return [
        passed(
            f"{label} decoding speed",
            f"{s * 1e3:.2f} ms a token {label}, {eager * 1e3:.2f} eager ({s / eager:.2f}×): {shape}",
            s / eager,
            "ratio",
        )
        for label, s in seconds.items()
    ]


def first_difference(eager, compiled) -> str | None:
    """Where two generations first part: "row r, token t: tokens 5 vs 7, loops 2 vs 3"."""
    for row, (et, ct, el, cl) in enumerate(zip(eager.tokens, compiled.tokens, eager.loops, compiled.loops)):
        for t in range(max(len(et), len(ct), len(el), len(cl))):
            pair = [(a[t] if t < len(a) else None, b[t] if t < len(b) else None) for a, b in ((et, ct), (el, cl))]
            if any(a != b for a, b in pair):
                (te, tc), (le, lc) = pair
                return f"row {row}, token {t}: tokens {te} vs {tc}, loops {le} vs {lc}"
    return None
