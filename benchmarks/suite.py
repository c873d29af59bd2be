"""The performance suite: every speed figure looplab claims, measured side by side in
one run on this machine, each with its repeats' median, min and max, and marked noisy
(not a result) when its repeats spread wider than the bound or other work loaded the
machine (looplab/costs/spread.py).

    python benchmarks/suite.py                         # the whole suite (~8 min on 2 cores)
    python benchmarks/suite.py --only train,decode     # some sections
    python benchmarks/suite.py --markdown suite.md --json suite.json

Sections (a comparison's arms alternate within each repeat, so drifting load hits
them alike; every time is one direct measurement, never a difference):
  machine   fp32 GEMM peak (2048³) and a 1 GiB copy's bandwidth, with the suite's threads
  train     `debug`'s and `local`'s optimizer steps eager vs compiled (train.compile: on a
            CPU Inductor and the C++ conv and scan, models/cpu/cpu_sequence.py; the compile
            time apart), and their MFU against the GEMM peak (`local`'s); a 4-layer d 256
            Mamba-2 stack forward+backward, looplab's against transformers' Mamba2
            (benchmarks/mamba2_vs_hf.py's stacks)
  decode    ms per token at batch 1 and 16 on a d 256, 4-layer Mamba-2 (6.9 MiB of
            weights, 1 loop): looplab's decode step eager (the step dispatch picks: torch
            ops, or the C++ CPU step with LOOPLAB_CPU_STEP_KERNEL=1) and compiled
            (compile_decoding), against the weight-read bound (weights ÷ the copy
            bandwidth) and transformers' Mamba2; at batch 1 with 1 and 4 loops, the
            whole token step compiled as one graph (ahead of time, the default on a
            CPU, and by dynamo) against one graph a loop
  arrivals  decode tokens/s under continuous arrivals at skip:0.4, 8 and 32 slots: depth
            batching over lockstep, and each schedule against the best full schedule with
            its realised share of the FLOP ratio; `debug` (fresh weights, the gate spread
            so that exits vary; eager and compiled; and compiled with the fresh gate, which
            exits nothing) and `local` (spread, compiled)
  mini      `python sweeps/paper_mini.py --dry-run`'s estimated wall time of a clean run
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from looplab import threads  # noqa: E402
from looplab.arguments import Parser, add_flags, at_least, flag, flags_of, int_in, number_in, some_of  # noqa: E402
from looplab.costs.spread import SPREAD_BOUND, Figure, Load, Timing  # noqa: E402

SECTIONS = ("machine", "train", "decode", "arrivals", "mini")


@dataclass(frozen=True)
class Options:
    """The suite's flags (looplab/arguments.py flag)."""

    only: tuple[str, ...] = flag(
        SECTIONS, f"sections, comma-separated: {', '.join(SECTIONS)} (default all)", type=some_of(*SECTIONS)
    )
    repeats: int = flag(5, "timed runs of each figure", type=at_least(1))
    bound: float = flag(SPREAD_BOUND, "the largest (max − min) / median accepted", type=number_in(0.0, low_open=True))
    threads: int = flag(
        0,
        "torch threads (default: the machine's free cores)",
        type=int_in(1, threads.usable_cpus(), "the CPUs this process may use"),
    )
    markdown: str | None = flag(None, "write the table here")
    json: str | None = flag(None, "write every figure here")


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def alternate(arms: dict, repeats: int, warmup: int = 1) -> dict[str, Timing]:
    """Each arm's Timing over `repeats`, the arms run in turn within every repeat. An arm
    is a call, or (setup, run): setup() untimed, then run(what setup returned) timed."""
    arms = {
        name: arm if isinstance(arm, tuple) else (lambda: None, lambda _, fn=arm: fn()) for name, arm in arms.items()
    }
    for _ in range(warmup):
        for setup, run in arms.values():
            run(setup())
    seconds = {name: [] for name in arms}
    for _ in range(repeats):
        for name, (setup, run) in arms.items():
            seconds[name].append(timed(run, setup()))
    return {name: Timing(tuple(s)) for name, s in seconds.items()}


class Measuring:
    """Records the machine's load around a section (with Measuring() as m: ...; m.load())."""

    def __enter__(self):
        self.before = threads.load_average()
        return self

    def __exit__(self, *exc):
        return False

    def load(self) -> Load:
        return Load(self.before, threads.load_average(), threads.usable_cpus(), torch.get_num_threads())


class Suite:
    def __init__(self, repeats: int, bound: float):
        self.repeats, self.bound = repeats, bound
        self.figures: list[Figure] = []
        self.peak_flops = 0.0
        self.bandwidth = 0.0
        # Their timings: a figure divided by the peak or the bandwidth carries their spread too.
        self.peak_timing: list[Timing] = []
        self.bandwidth_timing: list[Timing] = []

    def add(
        self, name: str, value: float, unit: str, timings, load: Load, note: str = "", contradicted: str = ""
    ) -> Figure:
        figure = Figure(name, value, unit, tuple(timings), load, self.bound, note, contradicted)
        self.figures.append(figure)
        flag = f"   NOISY: {figure.noisy_because}" if figure.noisy else ""
        print(f"  {name:66s} {figure.value:10.4g} {unit:9s} spread {figure.spread:4.0%}{flag}", flush=True)
        return figure


# ---- machine ------------------------------------------------------------------------------


def machine(suite: Suite) -> None:
    with Measuring() as m:
        n = 2048
        # Into an output allocated once: a fresh 16 MiB result each call is memory the
        # allocator maps anew and the kernel first touches, which made `a @ b` read 100-145
        # GFLOP/s where the same product ran at 143-151 (2-core Xeon, one thread).
        a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        src = torch.ones(1 << 28)  # 1 GiB of float32
        dst = torch.empty_like(src)
        t = alternate({"gemm": lambda: torch.mm(a, b, out=c), "copy": lambda: dst.copy_(src)}, suite.repeats)
        load = m.load()
    suite.peak_flops = 2 * n**3 / t["gemm"].median
    suite.bandwidth = 2 * src.numel() * 4 / t["copy"].median  # read + write
    suite.peak_timing, suite.bandwidth_timing = [t["gemm"]], [t["copy"]]
    suite.add(
        f"fp32 GEMM {n}³ ({torch.get_num_threads()} threads)", suite.peak_flops / 1e9, "GFLOP/s", [t["gemm"]], load
    )
    suite.add("copy bandwidth, 1 GiB (read + write)", suite.bandwidth / 1e9, "GB/s", [t["copy"]], load)


# ---- train --------------------------------------------------------------------------------


def _eager_and_compiled(suite: Suite, preset: str, repeats: int) -> tuple[dict[str, Timing], int, Load]:
    """A preset's optimizer step eager and compiled (train.compile), their arms alternating;
    adds "<preset> step: <arm>" in tokens/s and returns the timings, a step's tokens and the load."""
    from looplab.config import apply_overrides
    from looplab.presets import get_preset
    from looplab.training.steps import optimizer_step

    cfg = get_preset(preset)
    arms = {
        arm: optimizer_step(apply_overrides(cfg, {"train.compile": setting}), "cpu")[0]
        for arm, setting in (("eager", "off"), ("compiled", "on"))
    }
    compile_s = timed(arms["compiled"])  # the first call compiles (Inductor's on-disk cache may hold it)
    tokens = cfg.train.batch_size * cfg.train.seq_len
    with Measuring() as m:
        t = alternate(arms, repeats)
        load = m.load()
    for arm in arms:
        note = f"first step (compilation) {compile_s:.1f} s" if arm == "compiled" else ""
        suite.add(f"{preset} step: {arm}", tokens / t[arm].median, "tokens/s", [t[arm]], load, note)
    return t, tokens, load


def train(suite: Suite) -> None:
    from looplab.costs.resources import flops_per_token
    from looplab.presets import get_preset

    t, tokens, load = _eager_and_compiled(suite, "debug", suite.repeats)
    suite.add(
        "debug step: compiled ÷ eager (time; target ≤ 0.5)",
        t["compiled"].median / t["eager"].median,
        "ratio",
        [t["eager"], t["compiled"]],
        load,
    )

    local = get_preset("local")
    t, tokens, load = _eager_and_compiled(suite, "local", max(3, suite.repeats // 2))
    if suite.peak_flops:
        # What bounds `local`'s MFU: its LM head's three products (logits, the gradients
        # of the readout and of the weight: 78 % of the step's FLOPs), run on one chunk of
        # tokens as models/head.py runs them (outputs reused, the weight's gradient laid
        # out transposed), against the 2048³ GEMM's rate.
        from looplab.models.head import chunk_tokens_for

        rows, d, vocab = (
            min(chunk_tokens_for(local.model.vocab_size), tokens),
            local.model.d_model,
            local.model.vocab_size,
        )
        x, w = torch.randn(rows, d), torch.randn(vocab, d)
        z, gx, gw = torch.empty(rows, vocab), torch.empty(rows, d), torch.zeros(d, vocab).t()

        def products():
            torch.mm(x, w.t(), out=z)
            torch.mm(z, w, out=gx)
            gw.addmm_(z.t(), x)

        with Measuring() as m:
            head = alternate({"head": products}, suite.repeats)["head"]
            head_load = m.load()
        share = 100 * 3 * 2 * rows * d * vocab / head.median / suite.peak_flops
        # This host's 2048³ GEMM has read anywhere from 93 to 165 GFLOP/s, at times steadily
        # low: where these products outrun it, it is no peak, and what is divided by it no MFU.
        doubt = (
            f"the head's products ran at {share:.0f} % of the GEMM peak: the peak is under-measured"
            if share > 100
            else ""
        )
        suite.add(
            f"local's head products (3 GEMMs, {rows} tokens × {d} × {vocab}) against the GEMM peak",
            share,
            "%",
            [head, *suite.peak_timing],
            head_load,
            contradicted=doubt,
        )
        for arm in ("eager", "compiled"):
            suite.add(
                f"local step, {arm}: MFU against the GEMM peak (target ≥ 65 %)",
                100 * flops_per_token(local) * tokens / t[arm].median / suite.peak_flops,
                "%",
                [t[arm], *suite.peak_timing],
                load,
                contradicted=doubt,
            )

    import mamba2_vs_hf  # the two same-shaped stacks

    shape = mamba2_vs_hf.Shape(d_model=256, layers=4, expand=2, headdim=64, d_state=64, chunk_size=64)
    torch.manual_seed(0)
    x = torch.randn(4, 256, shape.d_model)
    stacks = {"looplab": mamba2_vs_hf.looplab_stack(shape).train(), "hf": mamba2_vs_hf.hf_stack(shape).train()}
    with Measuring() as m:
        t = alternate({k: (lambda s=s: mamba2_vs_hf.time_fwd_bwd(s, x)) for k, s in stacks.items()}, suite.repeats)
        load = m.load()
    tokens = x.shape[0] * x.shape[1]
    suite.add(
        "Mamba-2 stack fwd+bwd (d 256, 4 layers): looplab",
        tokens / t["looplab"].median,
        "tokens/s",
        [t["looplab"]],
        load,
    )
    suite.add("Mamba-2 stack fwd+bwd: transformers", tokens / t["hf"].median, "tokens/s", [t["hf"]], load)
    suite.add(
        "Mamba-2 stack fwd+bwd: looplab ÷ transformers (speed)",
        t["hf"].median / t["looplab"].median,
        "x",
        [t["looplab"], t["hf"]],
        load,
    )


# ---- decode -------------------------------------------------------------------------------

DECODE_SHAPE = dict(vocab_size=259, d_model=256, n_layers=4, n_loops=1, d_state=64, headdim=64, chunk_size=64)
PROMPT, NEW = 32, 32


def looplab_decoder(
    batch: int, compiled: bool, whole_steps: bool = True, ahead_of_time: bool = True, loops: int = 1, reset: bool = True
):
    """(setup, run) decoding NEW tokens after a PROMPT-token prefill (setup: a copy of
    the prefilled cache), eager or with the compiled step (compile_decoding: whole_steps,
    the whole token step as one graph, else one graph a loop; ahead_of_time, that graph
    compiled ahead of time, else by dynamo), and the model's weight bytes. reset=False
    keeps the compilations already made (an arm compared beside this one)."""
    from looplab.config import ModelConfig
    from looplab.inference.generate import decode_step, prefill
    from looplab.models.compiled import compile_decoding
    from looplab.models.looped import LoopedLM

    torch.manual_seed(0)
    if reset:
        torch._dynamo.reset()  # one model's compilations at a time: a serving process holds one
    shape = {**DECODE_SHAPE, "n_loops": loops}
    model = LoopedLM(ModelConfig(arch="mamba2", **shape)).eval()
    compile_decoding(model, compiled, whole_steps=whole_steps, ahead_of_time=ahead_of_time)
    ids = torch.randint(0, shape["vocab_size"], (batch, PROMPT + NEW))
    cache = prefill(model, ids[:, :PROMPT], capacity=PROMPT + NEW).cache

    def run(c):
        for t in range(PROMPT, PROMPT + NEW):
            decode_step(model, c, ids[:, t])

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return (cache.clone, run), weights


def hf_decoder(batch: int):
    """transformers' Mamba2ForCausalLM at the same shape: (setup, run), setup its
    prefill (a fresh cache), run the NEW one-token steps on it."""
    import mamba2_vs_hf
    from transformers import Mamba2ForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()  # its note that mamba-ssm's kernels are absent: they are, on a CPU
    s = DECODE_SHAPE
    shape = mamba2_vs_hf.Shape(
        d_model=s["d_model"],
        layers=s["n_layers"],
        expand=2,
        headdim=s["headdim"],
        d_state=s["d_state"],
        chunk_size=s["chunk_size"],
    )
    torch.manual_seed(0)
    model = Mamba2ForCausalLM(mamba2_vs_hf.hf_config(shape, vocab_size=s["vocab_size"], use_cache=True)).eval()
    ids = torch.randint(0, s["vocab_size"], (batch, PROMPT + NEW))

    def run(cache):
        for t in range(PROMPT, PROMPT + NEW):
            cache = model(ids[:, t : t + 1], cache=cache, use_cache=True).cache

    return lambda: model(ids[:, :PROMPT], use_cache=True).cache, run


@torch.no_grad()
def decode(suite: Suite) -> None:
    from looplab.models.ops.dispatch import step_implementation

    step = step_implementation(torch.zeros(1))
    for batch in (1, 16):
        eager, weights = looplab_decoder(batch, compiled=False)
        compiled, _ = looplab_decoder(batch, compiled=True)
        compile_s = timed(compiled[1], compiled[0]())  # the first steps compile
        with Measuring() as m:
            t = alternate({"eager": eager, "compiled": compiled, "hf": hf_decoder(batch)}, suite.repeats)
            load = m.load()
        ms = {k: t[k].median / NEW * 1e3 for k in t}
        suite.add(f"decode batch {batch}: looplab eager ({step} step)", ms["eager"], "ms/token", [t["eager"]], load)
        suite.add(
            f"decode batch {batch}: looplab compiled (the default of bench)",
            ms["compiled"],
            "ms/token",
            [t["compiled"]],
            load,
            f"first {NEW} tokens (compilation) {compile_s:.1f} s",
        )
        suite.add(f"decode batch {batch}: transformers", ms["hf"], "ms/token", [t["hf"]], load)
        if suite.bandwidth:
            bound_ms = weights / suite.bandwidth * 1e3
            for arm in ("eager", "compiled"):
                suite.add(
                    f"decode batch {batch}: looplab {arm} ÷ weight-read bound (target ≤ 1.3)",
                    ms[arm] / bound_ms,
                    "x",
                    [t[arm], *suite.bandwidth_timing],
                    load,
                    f"{weights / 2**20:.1f} MiB of weights: {bound_ms:.3f} ms",
                )
        suite.add(
            f"decode batch {batch}: looplab compiled ÷ transformers (speed; target ≥ 3)",
            t["hf"].median / t["compiled"].median,
            "x",
            [t["compiled"], t["hf"]],
            load,
        )
    # The whole token step ahead of time (the default on a CPU), by dynamo, and one graph a loop.
    ways = {"ahead of time": (True, True), "dynamo": (True, False), "per-loop": (False, False)}
    for loops in (1, 4):
        torch._dynamo.reset()
        arms = {
            way: looplab_decoder(1, True, whole_steps=w, ahead_of_time=a, loops=loops, reset=False)[0]
            for way, (w, a) in ways.items()
        }
        for setup, run in arms.values():
            timed(run, setup())  # compiles
        with Measuring() as m:
            t = alternate(arms, suite.repeats)
            load = m.load()
        for way in ("ahead of time", "dynamo"):
            suite.add(
                f"decode batch 1, {loops} loop(s): whole token step {way} ÷ one graph a loop (time)",
                t[way].median / t["per-loop"].median,
                "ratio",
                [t[way], t["per-loop"]],
                load,
                f"{t[way].median / NEW * 1e3:.3f} against {t['per-loop'].median / NEW * 1e3:.3f} ms/token",
            )


# ---- arrivals -----------------------------------------------------------------------------


# (preset, gate, decoding, requests): `debug` with its gate spread (exits vary, as a
# trained gate's do) eager and compiled, and with its fresh gate (no token exits: what
# the skip machinery costs when it saves nothing); `local` (Mistral's 32,000-row head)
# spread, compiled (bench-arrivals' default).
ARRIVAL_CASES = (
    ("debug", "spread", "eager", 32),
    ("debug", "spread", "compiled", 32),
    ("debug", "fresh", "compiled", 32),
    ("local", "spread", "compiled", 24),
)
GATE_SPREAD = 5.0  # bench-arrivals --gate-spread: d̄ about 2 of 4 on `debug`


@torch.no_grad()
def arrivals(suite: Suite) -> None:
    from looplab.costs.arrival_bench import ArrivalBench, bench_arrivals, spread_gate
    from looplab.inference.arrivals import RequestStream
    from looplab.models.compiled import compile_decoding
    from looplab.models.looped import LoopedLM
    from looplab.policy import ExitPolicy
    from looplab.presets import get_preset
    from looplab.tasks import make_task

    def timing(r) -> Timing:  # the repeats' decode seconds at their median, min and max rate
        return Timing(
            tuple(
                r.decoded_tokens / rate
                for rate in (r.decode_tokens_per_s_max, r.decode_tokens_per_s, r.decode_tokens_per_s_min)
            )
        )

    for preset, gate, step, requests in ARRIVAL_CASES:
        cfg = get_preset(preset)
        torch.manual_seed(0)
        model = LoopedLM(cfg.model).eval()
        if gate == "spread":  # a fresh gate exits almost never: spread it so exits vary
            spread_gate(model, GATE_SPREAD)
        task = make_task(cfg.task, cfg.train.seq_len)
        settings = ArrivalBench(
            RequestStream(requests=requests, prompt_len=(16, 64), new_tokens=(8, 32), seed=0),
            slots=(8, 32),
            policies=(ExitPolicy.parse("skip:0.4"),),
            warmup=1,
            repeats=max(3, suite.repeats // 2),
        )
        torch._dynamo.reset()
        compile_decoding(model, step == "compiled")
        with Measuring() as m:
            records = bench_arrivals(model, task, settings)
            load = m.load()
        by = {(r.slots, r.schedule, r.policy): r for r in records}
        case = f"{preset}{'' if gate == 'spread' else ', fresh gate'}, {step}"

        def speedup(name: str, fast, slow, note: str, load=load) -> None:  # decode tokens/s, one record over another
            suite.add(
                name, fast.decode_tokens_per_s / slow.decode_tokens_per_s, "x", [timing(fast), timing(slow)], load, note
            )

        for slots in settings.slots:
            depth, lock = by[slots, "depth", "skip:0.4"], by[slots, "lockstep", "skip:0.4"]
            speedup(
                f"arrivals {case}, {slots} slots: depth ÷ lockstep skip:0.4",
                depth,
                lock,
                f"decode tok/s depth {depth.decode_tokens_per_s:,.0f}, lockstep {lock.decode_tokens_per_s:,.0f}",
            )
            best = max((by[slots, s, "full"] for s in settings.schedules), key=lambda r: r.decode_tokens_per_s)
            for skip in (lock, depth):  # against what one would serve instead: the fastest full schedule
                speedup(
                    f"arrivals {case}, {slots} slots: {skip.schedule} skip:0.4 ÷ best full ({best.schedule})",
                    skip,
                    best,
                    f"realised {skip.realised:.0%} of the FLOP ratio {skip.flop_ratio:.2f} (d̄ "
                    f"{skip.mean_executed_loops:.2f}; 1/{skip.flop_ratio:.2f} = {1 / skip.flop_ratio:.0%} is as slow "
                    "as full)",
                )


# ---- the miniature ------------------------------------------------------------------------


def mini(suite: Suite) -> None:
    with Measuring() as m:
        t = time.perf_counter()
        with tempfile.TemporaryDirectory() as empty:  # a clean run's estimate: nothing trained yet
            out = subprocess.run(
                [sys.executable, "sweeps/paper_mini.py", "--dry-run", "--storage-path", empty],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=True,
            )
        took = time.perf_counter() - t
        load = m.load()
    text = out.stdout + out.stderr
    line = next((ln for ln in text.splitlines() if ln.strip().startswith("total ≈")), "")
    minutes = _minutes(line)
    if minutes is None:
        print(f"  paper_mini --dry-run printed no estimate:\n{text[-2000:]}", file=sys.stderr)
        return
    suite.add("paper_mini estimated wall time (target ≤ 30 min)", minutes, "min", [Timing((took,))], load, line.strip())


def _minutes(line: str) -> float | None:
    import re

    found = re.search(r"(\d+) min (\d+) s", line) or re.search(r"(\d+) min", line)
    if not found:
        return None
    return int(found.group(1)) + (int(found.group(2)) / 60 if found.lastindex == 2 else 0.0)


# ---- the report ---------------------------------------------------------------------------


def markdown(figures: list[Figure]) -> str:
    rows = ["| figure | value | unit | spread (bound) | note |", "|---|---|---|---|---|"]
    for f in figures:
        value = f"noisy: {f.noisy_because}" if f.noisy else f"{f.value:.3g}"
        rows.append(f"| {f.name} | {value} | {f.unit} | {f.spread:.0%} ({f.bound:.0%}) | {f.note} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0])
    add_flags(p, Options)
    opts = flags_of(Options, p.parse_args(argv))
    chosen = threads.use(opts.threads)
    before = threads.load_average()
    print(
        f"suite: {chosen.line()}; {opts.repeats} repeats; spread bound {opts.bound:.0%}; load {before:.2f}", flush=True
    )
    suite = Suite(opts.repeats, opts.bound)
    for section in SECTIONS:
        if section in opts.only or section == "machine":  # the peaks every other figure divides by
            print(f"[{section}]", flush=True)
            globals()[section](suite)
    after = threads.load_average()
    noisy = sum(f.noisy for f in suite.figures)
    print(f"suite: {len(suite.figures)} figures, {noisy} noisy; load {before:.2f} before, {after:.2f} after")
    if opts.markdown:
        Path(opts.markdown).write_text(markdown(suite.figures) + "\n")
    if opts.json:
        Path(opts.json).write_text(
            json.dumps(
                {
                    "threads": chosen.count,
                    "load_before": before,
                    "load_after": after,
                    "figures": [f.row() for f in suite.figures],
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
