"""`looplab bench` (prefill or decoding time and memory over a grid) and `looplab
bench-arrivals` (decoding under continuous arrivals)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from looplab.arguments import at_least, flag, ints_at_least
from looplab.checkpoint import experiment_task
from looplab.cli.inputs import check_model_source, compile_decoding, load_source_model, model_and_task
from looplab.cli.shared_flags import Compile, Threads, Timing, command, policies_type, schedules_type
from looplab.config import ConfigError
from looplab.policy import ExitPolicy


@dataclass(frozen=True)
class Bench:
    """prefill (or --decode) time and memory, full vs skip, over batch × length × exit policy

    `looplab bench`'s own flags (with Timing, Threads and Compile's)."""

    checkpoint: str = flag("", "a trained checkpoint (gate-driven exits need one)")
    preset: str = flag("", "or a preset, freshly initialised (use --oracle-mean)")
    batch: Sequence[int] = flag((1, 8, 16), "comma-separated batch sizes", type=ints_at_least(1))
    seq_len: Sequence[int] = flag((512, 1024), "comma-separated sequence lengths", type=ints_at_least(1))
    policies: Sequence[ExitPolicy] = flag(
        (),
        "skip policies to compare with full, e.g. skip:0.2,0.4 (the gate) or skip-entropy:2.0, "
        "skip-kl:0.01, skip-stable:2 (zero-shot rules, any checkpoint; default none)",
        type=policies_type,
    )
    oracle_mean: float | None = flag(None, "oracle exits with this mean executed loops")
    packing: Literal["auto", "padded", "varlen"] = flag(
        "auto",
        "skip's survivor layout: padded (the paper's ragged-halting measurement) or varlen "
        "(looplab's, Mamba-2 only); auto: varlen where it applies",
    )
    dtype: Literal["fp32", "bf16"] = flag(
        "fp32", "bf16: every timed call under bfloat16 autocast (CUDA's, or CPU's on a CPU) (default fp32)"
    )
    decode: bool = flag(False, "time token-by-token decoding after a prompt of --seq-len tokens instead of the prefill")
    new_tokens: int = flag(32, "--decode: tokens decoded per row", type=at_least(1))
    attention_fill: Literal["hole", "exit_state"] = flag(
        "hole", "--decode: what exited tokens leave in deeper attention layers"
    )
    schedule: Sequence[str] = flag(
        ("lockstep",),
        "--decode: skip's schedules, comma-separated: lockstep | depth (rows at different loops "
        "share a step; looplab/inference/depth_batching.py) (default lockstep)",
        type=schedules_type,
    )
    tracking_uri: str | None = flag(None, "also log the records to MLflow")
    overrides: list[str] = flag(help="model overrides for --preset, e.g. n_loops=4", positional=True)


def add_bench(sub) -> None:
    command(sub, "bench", cmd_bench, Bench, Timing, Threads, Compile)


def cmd_bench(args) -> int:
    """Time prefill (or --decode's decoding) and measure memory, full against skip,
    over batch × length × policy; print each record as it comes, then the JSON list."""
    from looplab.costs.decode_timing import DecodeRecord
    from looplab.costs.machine import check_grid
    from looplab.costs.timing import BenchRecord, records_as_dicts
    from looplab.devices import resolve_device

    check_model_source(args)
    if not args.policies and args.oracle_mean is None:
        raise ConfigError(
            "bench needs skip policies or an oracle mean; allowed: --policies skip:0.2,0.4 or --oracle-mean 2.0"
        )
    model = load_source_model(args)
    if args.decode:
        compile_decoding(model, args.compile)
    _check_bench_model(args, model.cfg)
    task = experiment_task(model)
    device = resolve_device(args.device)
    check_grid(model.cfg, args.batch, args.seq_len, args.new_tokens if args.decode else 0, device)
    if device.type == "cpu":
        print(
            "measuring every point's peak memory first, in a separate process (looplab/costs/measured_memory.py); "
            "then the timing",
            file=sys.stderr,
            flush=True,
        )
    records: list[BenchRecord] | list[DecodeRecord]
    try:
        if args.decode:
            records = _time_decoding(args, model, task, device)
        else:
            records = _time_prefill(args, model, task, device)
    except ConfigError as e:  # a bf16 kernel the device lacks: say it about the flag
        if e.name != "dtype":
            raise
        raise e.renamed("--dtype", args.dtype) from None
    _write_bench(args, records_as_dicts(records))
    return 0


def _check_bench_model(args, cfg) -> None:
    """The flags that depend on the model: --packing varlen (Mamba-2 only), --oracle-mean
    within its loops, --policies of skip execution."""
    R = cfg.n_loops
    if getattr(args, "packing", "auto") == "varlen" and cfg.arch != "mamba2":
        raise ConfigError(
            f"--packing='varlen' is invalid for a {cfg.arch} model; allowed: auto | padded "
            "(varlen packs sequences into one row, which attention layers cannot)"
        )
    if args.oracle_mean is not None and not 1.0 <= args.oracle_mean <= R:
        raise ConfigError(f"--oracle-mean={args.oracle_mean!r} is invalid; allowed: a number in [1, R={R}]")
    for policy in args.policies:
        if policy.execution != "skip":
            raise ConfigError(
                f"--policies={policy.spec!r} is invalid; allowed: skip policies (skip:Q, "
                "skip-entropy:T, skip-kl:T, skip-stable:K), which bench compares with full execution"
            )


def _time_decoding(args, model, task, device):
    """--decode: the decoding grid, each record shown as it comes, then how it scales with context."""
    from looplab.costs.decode_timing import DECODE_HEADER, context_scaling, format_decode_record, run_decode_grid

    print(DECODE_HEADER, file=sys.stderr)
    records = run_decode_grid(
        model,
        task,
        _grid(args),
        new_tokens=args.new_tokens,
        attention_fill=args.attention_fill,
        schedules=args.schedule,
        device=device,
        on_record=lambda r: print(format_decode_record(r), file=sys.stderr, flush=True),
    )
    for line in context_scaling(records):
        print(line, file=sys.stderr)
    return records


def _time_prefill(args, model, task, device):
    """The prefill grid, each record shown as it comes."""
    from looplab.costs.timing import HEADER, format_record, run_grid

    print(HEADER, file=sys.stderr)
    return run_grid(
        model,
        task,
        _grid(args),
        packing=args.packing,
        device=device,
        on_record=lambda r: print(format_record(r), file=sys.stderr, flush=True),
    )


def _grid(args):
    """The points --batch × --seq-len × --policies (or --oracle-mean) and their timing flags."""
    from looplab.costs.timing import BenchGrid

    return BenchGrid(
        tuple(args.batch),
        tuple(args.seq_len),
        tuple(args.policies),
        args.oracle_mean,
        args.warmup,
        args.repeats,
        args.dtype,
    )


def _write_bench(args, dicts: list[dict]) -> None:
    """The records to --json, to MLflow at --tracking-uri, and as JSON lines."""
    if args.json:
        from looplab.destinations import write_text

        write_text(args.json, json.dumps(dicts, indent=2))
    if args.tracking_uri:
        from looplab.tracking import log_benchmark

        kind = "decode" if args.decode else "bench"
        log_benchmark(args.tracking_uri, dicts, name=f"{kind}-{args.checkpoint or args.preset}-{args.dtype}")
    for d in dicts:
        print(json.dumps(d))


def token_range_type(name: str):
    """An argparse type: LOW-HIGH or N, token counts (looplab/inference/arrivals.py)."""

    def parse(text: str) -> tuple[int, int]:
        from looplab.inference.arrivals import parse_range

        try:
            return parse_range(name, text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: {e.allowed}") from None

    return parse


@dataclass(frozen=True)
class BenchArrivals:
    """decode tokens/s under continuous arrivals (requests of different lengths joining as
    others finish), schedule × policy, against the FLOP ratio

    `looplab bench-arrivals`' own flags (with ArrivalTiming, Threads and Compile's)."""

    checkpoint: str = flag("", "a trained checkpoint (gate-driven exits need one)")
    preset: str = flag("", "or a preset, freshly initialised")
    gate_spread: float = flag(
        0.0,
        "with --preset: draw the fresh gate's weights from N(0, S²) (bias 0), so tokens exit at varied "
        "loops as a trained gate's do (benchmarks/suite.py: 5); 0: the fresh gate, which exits none",
    )
    slots: Sequence[int] = flag((8, 32), "comma-separated cache rows served at once", type=ints_at_least(1))
    policies: Sequence[ExitPolicy] = flag(
        (ExitPolicy.parse("skip:0.4"),),
        "policies to compare with full (always run), e.g. skip:0.4 or 'skip:0.2,0.4;dense:0.4'",
        type=policies_type,
    )
    schedule: Sequence[str] = flag(
        ("lockstep", "depth"), "comma-separated: lockstep | depth (default both)", type=schedules_type
    )
    requests: int = flag(64, "requests in the stream (default 64)", type=at_least(1))
    prompt_len: tuple[int, int] = flag(
        (16, 128),
        "each request's prompt length, drawn uniformly: LOW-HIGH or N (default 16-128)",
        type=token_range_type("--prompt-len"),
    )
    new_tokens: tuple[int, int] = flag(
        (8, 64),
        "each request's new tokens, drawn uniformly: LOW-HIGH or N (default 8-64)",
        type=token_range_type("--new-tokens"),
    )
    seed: int = flag(0, "the stream's seed", type=at_least(0))
    attention_fill: Literal["hole", "exit_state"] = flag(
        "hole", "what exited tokens leave in deeper attention layers (hybrid/transformer)"
    )
    overrides: list[str] = flag(help="model overrides for --preset, e.g. n_loops=4", positional=True)


@dataclass(frozen=True)
class ArrivalTiming(Timing):
    """Timing with fewer runs: each is a whole stream."""

    warmup: int = flag(1, "untimed runs first", type=at_least(0))
    repeats: int = flag(3, "timed runs", type=at_least(1))


def add_bench_arrivals(sub) -> None:
    command(sub, "bench-arrivals", cmd_bench_arrivals, BenchArrivals, ArrivalTiming, Threads, Compile)


def _model_and_prompts(args):
    """The model and the task whose held-out text the requests' prompts are cut from.
    A fresh preset whose dataset cannot be reached here (a paper preset's, offline)
    times on random ids instead, said on stderr: fresh weights read any ids alike."""
    if args.checkpoint:
        return model_and_task(args)
    check_model_source(args)
    model = load_source_model(args)
    try:
        return model, experiment_task(model)
    except ConfigError as e:
        print(f"prompts: random token ids, as {args.preset}'s text is unreachable here ({e})", file=sys.stderr)
        return model, None


def cmd_bench_arrivals(args) -> int:
    """Decoding under continuous arrivals (looplab/inference/arrivals.py): tokens/s of each
    schedule × policy against full's and against the FLOP ratio."""
    from looplab.costs.arrival_bench import (
        HEADER,
        ArrivalBench,
        ArrivalRecord,
        bench_arrivals,
        format_record,
        records_as_dicts,
        spread_gate,
    )
    from looplab.costs.machine import check_stream
    from looplab.devices import resolve_device
    from looplab.inference.arrivals import RequestStream

    if args.gate_spread and (args.checkpoint or args.gate_spread < 0):
        allowed = "a number > 0 with --preset (a checkpoint's gate is trained: it is timed as it is)"
        raise ConfigError(f"--gate-spread={args.gate_spread:g} is invalid; allowed: {allowed}")
    model, task = _model_and_prompts(args)
    if args.gate_spread:
        spread_gate(model, args.gate_spread, seed=args.seed)
    for policy in args.policies:  # (given exits cannot be written on a command line)
        try:
            policy.check(model.cfg.n_loops)
        except ConfigError as e:  # forced:D deeper than the model's loops
            allowed = str(e).split("allowed: ")[-1]
            raise ConfigError(f"--policies={policy.spec!r} is invalid; allowed: {allowed}") from None
    settings = ArrivalBench(
        RequestStream(args.requests, args.prompt_len, args.new_tokens, args.seed),
        slots=tuple(args.slots),
        policies=tuple(args.policies),
        schedules=tuple(args.schedule),
        warmup=args.warmup,
        repeats=args.repeats,
        attention_fill=args.attention_fill,
    )
    device = resolve_device(args.device)
    check_stream(model.cfg, max(args.slots), args.requests, args.prompt_len, args.new_tokens, device)
    model = compile_decoding(model.to(device), args.compile)
    print(
        f"{args.requests} requests (prompt {args.prompt_len[0]}-{args.prompt_len[1]}, new "
        f"{args.new_tokens[0]}-{args.new_tokens[1]} tokens, seed {args.seed}); R={model.cfg.n_loops}; "
        f"{len(settings.runs)} runs per slots × {args.warmup + args.repeats}",
        file=sys.stderr,
        flush=True,
    )
    records: list[ArrivalRecord] = []

    def show(record: ArrivalRecord) -> None:
        if not records:
            print(HEADER, file=sys.stderr)
        records.append(record)
        print(format_record(record), file=sys.stderr, flush=True)

    bench_arrivals(
        model, task, settings, on_record=show, progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    dicts = records_as_dicts(records)
    if args.json:
        from looplab.destinations import write_text

        write_text(args.json, json.dumps(dicts, indent=2))
    for d in dicts:
        print(json.dumps(d))
    return 0
