"""`looplab bench` (prefill or decoding time and memory over a grid) and `looplab
bench-arrivals` (decoding under continuous arrivals)."""

from __future__ import annotations

import argparse
import json
import sys

from looplab.arguments import at_least, ints_at_least, one_of
from looplab.checkpoint import experiment_task
from looplab.cli.inputs import check_model_source, compile_decoding, load_source_model, model_and_task
from looplab.cli.shared_flags import compile_flag, policies_type, schedules_type, timing_flags
from looplab.config import ConfigError


def add_bench(sub) -> None:
    b = sub.add_parser(
        "bench", help="prefill (or --decode) time and memory, full vs skip, over batch × length × exit policy"
    )
    b.add_argument("--checkpoint", default="", help="a trained checkpoint (gate-driven exits need one)")
    b.add_argument("--preset", default="", help="or a preset, freshly initialised (use --oracle-mean)")
    b.add_argument("--batch", type=ints_at_least(1), default="1,8,16", help="comma-separated batch sizes")
    b.add_argument("--seq-len", type=ints_at_least(1), default="512,1024", help="comma-separated sequence lengths")
    b.add_argument(
        "--policies",
        type=policies_type,
        default=[],
        help="skip policies to compare with full, e.g. skip:0.2,0.4 (the gate) or skip-entropy:2.0, "
        "skip-kl:0.01, skip-stable:2 (zero-shot rules, any checkpoint)",
    )
    b.add_argument("--oracle-mean", type=float, default=None, help="oracle exits with this mean executed loops")
    b.add_argument(
        "--packing",
        choices=("auto", "padded", "varlen"),
        default="auto",
        help="skip's survivor layout: padded (the paper's ragged-halting measurement) or varlen "
        "(looplab's, Mamba-2 only); auto: varlen where it applies",
    )
    b.add_argument(
        "--dtype",
        type=one_of("fp32", "bf16"),
        default="fp32",
        metavar="{fp32,bf16}",
        help="bf16: every timed call under bfloat16 autocast (CUDA's, or CPU's on a CPU) (default fp32)",
    )
    b.add_argument(
        "--decode",
        action="store_true",
        help="time token-by-token decoding after a prompt of --seq-len tokens instead of the prefill",
    )
    b.add_argument("--new-tokens", type=at_least(1), default=32, help="--decode: tokens decoded per row")
    b.add_argument(
        "--attention-fill",
        choices=("hole", "exit_state"),
        default="hole",
        help="--decode: what exited tokens leave in deeper attention layers",
    )
    b.add_argument(
        "--schedule",
        type=schedules_type,
        default="lockstep",
        help="--decode: skip's schedules, comma-separated: lockstep | depth (rows at different loops "
        "share a step; looplab/inference/depth_batching.py) (default lockstep)",
    )
    timing_flags(b, warmup=2, repeats=5)
    b.add_argument("--tracking-uri", default=None, help="also log the records to MLflow")
    b.add_argument("overrides", nargs="*", help="model overrides for --preset, e.g. n_loops=4")
    compile_flag(b, "on")
    b.set_defaults(fn=cmd_bench)


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
        batches=args.batch,
        seq_lens=args.seq_len,
        new_tokens=args.new_tokens,
        policies=args.policies,
        oracle_mean=args.oracle_mean,
        warmup=args.warmup,
        repeats=args.repeats,
        attention_fill=args.attention_fill,
        dtype=args.dtype,
        device=device,
        schedules=args.schedule,
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
        batches=args.batch,
        seq_lens=args.seq_len,
        policies=args.policies,
        oracle_mean=args.oracle_mean,
        warmup=args.warmup,
        repeats=args.repeats,
        packing=args.packing,
        dtype=args.dtype,
        device=device,
        on_record=lambda r: print(format_record(r), file=sys.stderr, flush=True),
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


def add_bench_arrivals(sub) -> None:
    a = sub.add_parser(
        "bench-arrivals",
        help="decode tokens/s under continuous arrivals (requests of different "
        "lengths joining as others finish), schedule × policy, against the "
        "FLOP ratio",
    )
    a.add_argument("--checkpoint", default="", help="a trained checkpoint (gate-driven exits need one)")
    a.add_argument("--preset", default="", help="or a preset, freshly initialised")
    a.add_argument("--slots", type=ints_at_least(1), default="8,32", help="comma-separated cache rows served at once")
    a.add_argument(
        "--policies",
        type=policies_type,
        default="skip:0.4",
        help="policies to compare with full (always run), e.g. skip:0.4 or 'skip:0.2,0.4;dense:0.4'",
    )
    a.add_argument(
        "--schedule",
        type=schedules_type,
        default="lockstep,depth",
        help="comma-separated: lockstep | depth (default both)",
    )
    a.add_argument("--requests", type=at_least(1), default=64, help="requests in the stream (default 64)")
    a.add_argument(
        "--prompt-len",
        type=token_range_type("--prompt-len"),
        default="16-128",
        help="each request's prompt length, drawn uniformly: LOW-HIGH or N (default 16-128)",
    )
    a.add_argument(
        "--new-tokens",
        type=token_range_type("--new-tokens"),
        default="8-64",
        help="each request's new tokens, drawn uniformly: LOW-HIGH or N (default 8-64)",
    )
    a.add_argument("--seed", type=at_least(0), default=0, help="the stream's seed")
    a.add_argument(
        "--attention-fill",
        choices=("hole", "exit_state"),
        default="hole",
        help="what exited tokens leave in deeper attention layers (hybrid/transformer)",
    )
    timing_flags(a, warmup=1, repeats=3)
    a.add_argument("overrides", nargs="*", help="model overrides for --preset, e.g. n_loops=4")
    compile_flag(a, "on")
    a.set_defaults(fn=cmd_bench_arrivals)


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
    )
    from looplab.costs.machine import check_stream
    from looplab.devices import resolve_device
    from looplab.inference.arrivals import RequestStream

    model, task = model_and_task(args)
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
