"""The `looplab` command: single runs and data inspection.

    looplab train --preset phop-debug --out runs/phop-debug [model.n_loops=1 train.steps=500 ...]
    looplab train --preset phop-debug --stage stage1 --init runs/phop-debug/checkpoint --out runs/s1 [exit.beta=0.1]
    looplab data mano --L 10 [--eval] --count 5 --seed 0
    looplab data phop --n 256 --p 16 --alphabet 4 --count 5 --seed 0
    looplab eval --checkpoint runs/x/checkpoint [--policies 'full;dense:0.2,0.4;skip:0.4;forced:1-3'] [--json out.json]
    looplab eval --checkpoint runs/x/checkpoint --policies 'skip-entropy:1.0,2.0;dense-kl:0.01;skip-stable:2-3'
    looplab lm-eval --checkpoint runs/lm/checkpoint --suite paper [--policy skip:0.4] [--limit 100] [--local-data DIR]
    looplab lm-eval --checkpoint runs/lm/checkpoint --tasks piqa,my_task [--include-path DIR] [--tokenizer bytes] [--output out.json]
    looplab bench --preset local --batch 1,8,16 --seq-len 512,1024 --oracle-mean 2.0 [--dtype bf16] [--packing padded] [--json out.json]
    looplab bench --decode --preset local --batch 1,8,64 --seq-len 128,2048 --oracle-mean 2.0 [--new-tokens 32]
                  [--schedule lockstep,depth]
    looplab bench-arrivals --checkpoint runs/s1/checkpoint --slots 8,32 --policies skip:0.4 [--requests 64]
                  [--prompt-len 16-128] [--new-tokens 8-64] [--schedule lockstep,depth] [--json out.json]
    looplab generate --checkpoint runs/lm/checkpoint --prompt "Once upon a time" [--policy skip:0.4] [--json]
    looplab export --checkpoint runs/lm/checkpoint --format hf exports/lm [--policy skip:0.4] [--force]
    looplab presets
    looplab info --preset paper-140m [arch=hybrid ...]
    looplab doctor [--quick] [--json report.json]      does this node work? (looplab/doctor.py)
    looplab dashboard runs/beta [--port 5000] [--experiment NAME]   MLflow's dashboard of a sweep, until Ctrl-C

Each command is a pair side by side: add_<command> declares its arguments, cmd_<command>
runs with them; build_parser lists the pairs.
"""

from __future__ import annotations

import argparse
import json
import sys

from looplab.arguments import Parser, at_least, int_in, ints_at_least, number_in, one_of
from looplab.config import ConfigError, parse_value
from looplab.errors import CheckpointNotWritten, TrainingDiverged
from looplab.stages import STAGE_NAMES


def _policy(text: str):
    from looplab.policy import ExitPolicy

    try:
        return ExitPolicy.parse(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("policy ")) from None


def _policies(text: str):
    from looplab.policy import parse_policies

    try:
        return parse_policies(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("policies ").removeprefix("policy ")) from None


def _schedules(text: str) -> list[str]:
    from looplab.inference.depth_batching import SCHEDULES

    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in SCHEDULES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: comma-separated {' | '.join(SCHEDULES)}")
    return list(dict.fromkeys(names))


def _threads_flag(p) -> None:
    """--threads, on every command that computes: main() sets torch's threads from it
    (looplab/threads.py), and from the CPUs the process was given without it (the default,
    0, is not a value to give). More threads than CPUs only wait on each other, and
    torch crashes at some 10⁵."""
    from looplab.threads import usable_cpus

    p.add_argument(
        "--threads",
        type=int_in(1, usable_cpus(), "the CPUs this process may use"),
        default=0,
        help="torch threads, at most this process's CPUs (default: Ray's allocation inside Ray, else the "
        "machine's free cores)",
    )


def _compile_flag(p, default: str) -> None:
    p.add_argument(
        "--compile",
        choices=("on", "off", "cuda-graphs"),
        default=default,
        help=f"decode with the compiled one-token step (looplab/models/compiled.py; the first steps "
        f"compile for seconds), the eager one, or the compiled one captured in CUDA graphs (a GPU; "
        f"on a CPU the same as on) (default {default})",
    )


def _compile_decoding(model, setting: str):
    from looplab.models.compiled import compile_decoding

    return compile_decoding(model, setting != "off", cuda_graphs=setting == "cuda-graphs")


def _timing_flags(p, *, warmup: int, repeats: int) -> None:
    """The flags every timing command shares: threads, warm-ups, repeats, device, JSON out."""
    _threads_flag(p)
    p.add_argument("--warmup", type=at_least(0), default=warmup)
    p.add_argument("--repeats", type=at_least(1), default=repeats)
    p.add_argument("--device", default="auto")
    p.add_argument("--json", help="write the records (a JSON list) here")


def _checkpoint(path: str, argument: str = "--checkpoint") -> None:
    from looplab.checkpoint import verify_checkpoint

    verify_checkpoint(path, argument=argument, recover=f"pass another {argument}, or train it again")


def _overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {pair!r} is invalid; allowed: KEY=VALUE, e.g. model.n_loops=2")
        out[key] = parse_value(value)
    return out


def _experiment(args):
    """The preset as the asked-for stage: its recipe (looplab/stages.py), then the
    command line's overrides; a continued stage names its parent by the key the
    --init checkpoint recorded."""
    from looplab.checkpoint import parent_ref, verify_checkpoint
    from looplab.config import config_key
    from looplab.presets import get_preset, stage_config
    from looplab.stages import get_stage

    try:
        cfg = get_preset(args.preset)
    except ConfigError as e:
        raise e.renamed("--preset", args.preset) from None
    stage = getattr(args, "stage", None) or "pretrain"
    init = getattr(args, "init", None)
    if get_stage(stage).continues and not init:
        raise ConfigError(f"--stage {stage} needs --init CHECKPOINT (the parent stage it continues)")
    if init and not get_stage(stage).continues:
        raise ConfigError("--init applies to continued stages; allowed: --stage stage1 | chase | stage2")
    if init:
        verify_checkpoint(init, argument="--init", recover="pass the checkpoint of a trained parent stage")
    overrides = _overrides(getattr(args, "overrides", []))
    try:
        return stage_config(cfg, stage, parent=parent_ref(init) if init else None, overrides=overrides)
    except ConfigError as e:  # said as the override that set the value
        key = config_key(e.name) if e.name else None
        given = next((k for k in overrides if key in (k, f"{key.partition('.')[0]}.{k}")), None) if key else None
        raise (e.renamed("override", f"{given}={overrides[given]}") if given else e) from None


def _destinations(args) -> None:
    """Every place a command writes to, and its device, checked before its work."""
    from looplab import destinations

    for flag in ("json", "output", "markdown"):  # None: not given ("" is refused: it is no file)
        value = getattr(args, flag, None)
        if isinstance(value, str):
            destinations.output_file(f"--{flag}", value)
    if getattr(args, "out", None) is not None:
        destinations.output_dir("--out", args.out)
    if getattr(args, "tracking_uri", None) is not None:
        destinations.tracking_uri("--tracking-uri", args.tracking_uri)
    if getattr(args, "device", None):
        destinations.device("--device", args.device)


def add_train(sub) -> None:
    t = sub.add_parser("train", help="train one run of a preset (resumes from OUT/checkpoint)")
    t.add_argument("--preset", required=True)
    t.add_argument("--out", required=True, help="run directory: metrics.jsonl and checkpoint/")
    t.add_argument("--stop-at", type=at_least(1), default=None, help="stop (with a checkpoint) after this many steps")
    t.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint in OUT")
    t.add_argument(
        "--stage",
        choices=STAGE_NAMES,
        default=None,
        help="training stage (default pretrain); continued stages use their recipe from "
        "looplab/stages.py (App. D's optimiser settings), overrides still win",
    )
    t.add_argument("--init", default=None, help="parent checkpoint a continued stage starts from")
    t.add_argument("overrides", nargs="*", help="KEY=VALUE, e.g. model.n_loops=1 train.steps=500")
    _threads_flag(t)
    t.set_defaults(fn=cmd_train)


def cmd_train(args) -> int:
    from looplab import destinations
    from looplab.training.run_folder import CHECKPOINT_DIR, DIVERGED, METRICS_FILE
    from looplab.training.train import train

    # What the run writes in --out, each of its kind (a metrics.jsonl that is a folder), before the model is built
    destinations.output_dir("--out", args.out, files=(METRICS_FILE, DIVERGED), folders=(CHECKPOINT_DIR,))
    cfg = _experiment(args)
    result = train(cfg, args.out, resume=not args.no_resume, stop_at=args.stop_at)
    summary = {
        "out_dir": str(result.out_dir),
        "step": result.step,
        "stage_key": cfg.stage_key(),
        **{f"eval_{k}": v for k, v in result.eval.items() if k in ("accuracy", "loss", "n")},
    }
    print(json.dumps(summary))
    return 0


def add_eval(sub) -> None:
    e = sub.add_parser(
        "eval",
        help="evaluate exit policies (full, forced, dense, skip, the zoo's zero-shot rules) on the task's eval set",
    )
    e.add_argument("--checkpoint", required=True)
    e.add_argument(
        "--policies",
        type=_policies,
        default=None,
        help="exit policies, e.g. 'full;dense:0.2,0.4;skip:0.2,0.4;forced:1-3'; the zoo's zero-shot "
        "rules, in dense or skip execution: entropy below T nats (skip-entropy:1.0,2.0), KL between "
        "consecutive steps below T (dense-kl:0.01), argmax stable for K steps (skip-stable:2-3) "
        "(default: what the checkpoint's stage evaluates: full depth, dense and skip at q in "
        "0.2..1.0, forced 1..R-1)",
    )
    e.add_argument("--limit", type=at_least(0), default=0, help="first N eval samples only (0: all)")
    e.add_argument("--batch-size", type=at_least(1), default=64)
    e.add_argument("--device", default="auto")
    e.add_argument("--json", help="also write the records as a JSON list here")
    _threads_flag(e)
    e.set_defaults(fn=cmd_eval)


def cmd_eval(args) -> int:
    from looplab.checkpoint import load_model
    from looplab.config import ExperimentConfig
    from looplab.costs.machine import check_forward
    from looplab.evaluation.validation import evaluate_policies, format_table
    from looplab.stages import get_stage
    from looplab.tasks import make_task
    from looplab.devices import resolve_device

    _checkpoint(args.checkpoint)
    model = load_model(args.checkpoint)
    experiment = model.metadata.get("experiment")
    if not experiment:
        raise ConfigError(
            f"--checkpoint={args.checkpoint!r} carries no experiment config; allowed: a checkpoint "
            "written by looplab train"
        )
    cfg = ExperimentConfig.from_dict(experiment)
    policies = args.policies or get_stage(cfg.stage).eval_policies(cfg.model.n_loops)
    for policy in policies:
        try:
            policy.check(cfg.model.n_loops)
        except ConfigError as e:
            raise e.renamed("--policies", policy.spec) from None
    batch = make_task(cfg.task, cfg.train.seq_len).eval_batch()
    if args.limit:
        batch = batch.slice(0, args.limit)
    device = resolve_device(args.device)
    check_forward(
        cfg.model,
        min(args.batch_size, len(batch)),
        batch.ids.shape[1],
        "--batch-size",
        args.batch_size,
        device,
        steps_kept=cfg.model.n_loops,
    )
    records = evaluate_policies(
        model.to(device), batch, policies, batch_size=args.batch_size, device=device, precision=cfg.train.precision
    )
    print(format_table(records), file=sys.stderr)
    for r in records:
        print(json.dumps({"checkpoint": str(args.checkpoint), "stage": model.metadata.get("stage", ""), **r}))
    if args.json:
        from looplab.destinations import write_text

        write_text(args.json, json.dumps(records, indent=2))
    return 0


def add_data(sub) -> None:
    d = sub.add_parser("data", help="print task samples as JSON lines")
    dsub = d.add_subparsers(dest="task", required=True)
    m = dsub.add_parser("mano")
    m.add_argument("--L", type=at_least(1), default=10, help="maximum number of operations")
    m.add_argument("--eval", action="store_true", help="draw from the evaluation distribution (length = L)")
    m.add_argument("--modulus", type=int, default=23, help="the field Z_modulus, a prime (default the paper's 23)")
    p = dsub.add_parser("phop")
    p.add_argument("--n", type=at_least(3), default=256)
    p.add_argument("--p", type=at_least(1), default=16)
    p.add_argument("--alphabet", type=at_least(2), default=4)
    for sp in (m, p):
        sp.add_argument("--count", type=at_least(1), default=10)
        sp.add_argument("--seed", type=at_least(0), default=0)
    d.set_defaults(fn=cmd_data)


def cmd_data(args) -> int:
    if args.task == "mano":
        from looplab.config import ManoConfig
        from looplab.tasks.mano import ManoTask

        records = ManoTask(ManoConfig(L=args.L, modulus=args.modulus)).records(args.count, args.seed, eval=args.eval)
    else:
        from looplab.config import PhopConfig
        from looplab.tasks.phop import PhopTask

        records = PhopTask(PhopConfig(n=args.n, p=args.p, alphabet=args.alphabet)).records(args.count, args.seed)
    for r in records:
        sys.stdout.write(json.dumps(r) + "\n")
    return 0


def _limit(value: str) -> int | float:
    """lm-eval's --limit: N documents per task, or a fraction below 1."""
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"--limit {value!r} is invalid; allowed: a count >= 1 or a fraction in (0, 1)")
    return number if number < 1 else int(number)


def add_lm_eval(sub) -> None:
    le = sub.add_parser("lm-eval", help="lm-eval tasks or the paper's seven-task suite on a checkpoint (JSON)")
    le.add_argument("--checkpoint", required=True)
    le.add_argument("--tasks", default="", help="comma-separated lm-eval task names (with --suite: a subset)")
    le.add_argument(
        "--suite",
        choices=("paper",),
        default=None,
        help="paper: piqa, boolq, winogrande, openbookqa (5 shots), hellaswag (10), arc_challenge "
        "(25), arc_easy (8), and their average accuracy",
    )
    le.add_argument("--include-path", default=None, help="directory of extra task YAMLs")
    le.add_argument(
        "--local-data",
        default=None,
        help="suite datasets from DIR/<task>/<split>.parquet (python -m looplab.evaluation.suite export)",
    )
    le.add_argument(
        "--policy",
        type=_policy,
        default="full",
        help="exit policy: full | forced:D | dense:Q | skip:Q (the gate's threshold rule) | "
        "dense-entropy:T | skip-entropy:T | dense-kl:T | skip-kl:T | dense-stable:K | "
        "skip-stable:K (zero-shot rules, no gate needed) (default full)",
    )
    le.add_argument(
        "--tokenizer",
        default=None,
        help="the tokenizer the model was trained with, for checkpoints that do not record one: "
        "mistral | bytes | an HF tokenizer name (default: the checkpoint's)",
    )
    le.add_argument("--limit", type=_limit, default=None, help="documents per task (or a fraction < 1)")
    le.add_argument("--batch-size", type=at_least(1), default=8)
    le.add_argument("--device", default="auto")
    le.add_argument("--output", default=None, help="also write the JSON here")
    _threads_flag(le)
    le.set_defaults(fn=cmd_lm_eval)


def cmd_lm_eval(args) -> int:
    """lm-eval tasks (or the paper's seven-task suite) on a checkpoint; JSON results
    with each task's accuracy and executed loops."""
    tasks = [t for t in (args.tasks or "").split(",") if t]
    _checkpoint(args.checkpoint)
    from looplab.checkpoint import read_model_config

    try:
        args.policy.check(read_model_config(args.checkpoint).n_loops)
    except ConfigError as e:
        raise e.renamed("--policy", args.policy.spec) from None
    model_args = {"policy": args.policy, "batch_size": args.batch_size, "device": args.device}
    report = {
        "checkpoint": str(args.checkpoint),
        "suite": args.suite,
        **model_args,
        "policy": args.policy.spec,
        "limit": args.limit,
    }
    if args.tokenizer:  # for checkpoints that do not record theirs (the adapter says so otherwise)
        model_args["tokenizer"] = report["tokenizer"] = args.tokenizer
    if args.suite:
        from looplab.evaluation.suite import run_suite

        if args.include_path:
            raise ConfigError(
                "--include-path does not apply to --suite paper (it runs lm-eval's built-in tasks); "
                "allowed: --local-data DIR"
            )
        summary = run_suite(
            args.checkpoint, limit=args.limit, local_data_dir=args.local_data, tasks=tasks or None, **model_args
        )
        results = summary["lm_eval"]
        report["tasks"] = summary["tasks"]  # per task: metric, accuracy, executed_loops, shots, lm-eval row
        report["average"] = summary["average"]
    else:
        from looplab.evaluation.harness import evaluate_tasks

        if not tasks:
            raise ConfigError("--tasks is empty; allowed: comma-separated lm-eval task names, or --suite paper")
        if args.local_data:
            raise ConfigError(
                "--local-data applies to --suite paper only; allowed: --include-path DIR with task "
                "YAMLs that read local files"
            )
        check_task_names(tasks, args.include_path)  # before any model loads
        results = evaluate_tasks(args.checkpoint, tasks, include_path=args.include_path, limit=args.limit, **model_args)
        report["tasks"] = {
            name: {"num_fewshot": results.get("n-shot", {}).get(name), "results": row}
            for name, row in results["results"].items()
        }
    from lm_eval.utils import make_table

    from looplab.tracking import EXECUTED_LOOPS

    report[EXECUTED_LOOPS] = results.get(EXECUTED_LOOPS)

    print(make_table(results), file=sys.stderr)
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.output:
        from looplab.destinations import write_text

        write_text(args.output, text + "\n")
    return 0


def check_task_names(tasks: list[str], include_path: str | None) -> None:
    """Every --tasks name is in lm-eval's task index (and --include-path's): checked
    before a model is loaded, so a typo costs seconds, not a model load."""
    from looplab.evaluation.harness import make_task_manager

    manager = make_task_manager(include_path, tasks)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        close = sorted(n for n in manager.all_tasks if unknown[0].split("_")[0] in n)[:5]
        raise ConfigError(
            f"--tasks={','.join(unknown)!r} is invalid; allowed: lm-eval task names"
            + (f" (similar: {', '.join(close)})" if close else "")
            + (", or tasks under --include-path" if not include_path else "")
        )


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
        type=_policies,
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
        type=_schedules,
        default="lockstep",
        help="--decode: skip's schedules, comma-separated: lockstep | depth (rows at different loops "
        "share a step; looplab/inference/depth_batching.py) (default lockstep)",
    )
    _timing_flags(b, warmup=2, repeats=5)
    b.add_argument("--tracking-uri", default=None, help="also log the records to MLflow")
    b.add_argument("overrides", nargs="*", help="model overrides for --preset, e.g. n_loops=4")
    _compile_flag(b, "on")
    b.set_defaults(fn=cmd_bench)


def cmd_bench(args) -> int:
    from looplab.costs.machine import check_grid
    from looplab.costs.timing import HEADER, BenchRecord, DecodeRecord, format_record, records_as_dicts, run_grid
    from looplab.checkpoint import load_model
    from looplab.config import ExperimentConfig
    from looplab.tasks import make_task
    from looplab.devices import resolve_device

    if bool(args.checkpoint) == bool(args.preset):
        raise ConfigError("bench needs exactly one of --checkpoint PATH or --preset NAME")
    if args.checkpoint:
        _checkpoint(args.checkpoint)
    elif args.preset not in __import__("looplab.presets", fromlist=["PRESETS"]).PRESETS:
        from looplab.presets import get_preset

        try:
            get_preset(args.preset)
        except ConfigError as e:
            raise e.renamed("--preset", args.preset) from None
    if not args.policies and args.oracle_mean is None:
        raise ConfigError(
            "bench needs skip policies or an oracle mean; allowed: --policies skip:0.2,0.4 or --oracle-mean 2.0"
        )
    overrides = {} if args.checkpoint else _overrides(args.overrides)  # a checkpoint fixes the model
    model = load_model(args.checkpoint or args.preset, **overrides)
    if args.decode:
        _compile_decoding(model, args.compile)
    R = model.cfg.n_loops
    if getattr(args, "packing", "auto") == "varlen" and model.cfg.arch != "mamba2":
        raise ConfigError(
            f"--packing='varlen' is invalid for a {model.cfg.arch} model; allowed: auto | padded "
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
    experiment = model.metadata.get("experiment")
    cfg = ExperimentConfig.from_dict(experiment) if experiment else None
    task = make_task(cfg.task, cfg.train.seq_len) if cfg is not None else None
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
            from looplab.costs.timing import DECODE_HEADER, context_scaling, format_decode_record, run_decode_grid

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
        else:
            print(HEADER, file=sys.stderr)
            records = run_grid(
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
    except ConfigError as e:  # a bf16 kernel the device lacks: say it about the flag
        if e.name != "dtype":
            raise
        raise e.renamed("--dtype", args.dtype) from None
    dicts = records_as_dicts(records)
    if args.json:
        from looplab.destinations import write_text

        write_text(args.json, json.dumps(dicts, indent=2))
    if args.tracking_uri:
        from looplab.tracking import log_benchmark

        kind = "decode" if args.decode else "bench"
        log_benchmark(args.tracking_uri, dicts, name=f"{kind}-{args.checkpoint or args.preset}-{args.dtype}")
    for d in dicts:
        print(json.dumps(d))
    return 0


def _token_range(name: str):
    """An argparse type: LOW-HIGH or N, token counts (looplab/inference/arrivals.py)."""

    def parse(text: str) -> tuple[int, int]:
        from looplab.inference.arrivals import parse_range

        try:
            return parse_range(name, text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: {e.allowed}") from None

    return parse


def _model_and_task(args):
    """The model of --checkpoint or --preset (with overrides) and its task (None for
    a bare preset's model without an experiment)."""
    from looplab.checkpoint import load_model
    from looplab.config import ExperimentConfig
    from looplab.presets import get_preset
    from looplab.tasks import make_task

    if bool(args.checkpoint) == bool(args.preset):
        raise ConfigError(f"{args.command} needs exactly one of --checkpoint PATH or --preset NAME")
    if args.checkpoint:
        _checkpoint(args.checkpoint)
    else:
        try:
            get_preset(args.preset)
        except ConfigError as e:
            raise e.renamed("--preset", args.preset) from None
    overrides = {} if args.checkpoint else _overrides(args.overrides)  # a checkpoint fixes the model
    model = load_model(args.checkpoint or args.preset, **overrides)
    experiment = model.metadata.get("experiment")
    cfg = ExperimentConfig.from_dict(experiment) if experiment else None
    return model, make_task(cfg.task, cfg.train.seq_len) if cfg is not None else None


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
        type=_policies,
        default="skip:0.4",
        help="policies to compare with full (always run), e.g. skip:0.4 or 'skip:0.2,0.4;dense:0.4'",
    )
    a.add_argument(
        "--schedule", type=_schedules, default="lockstep,depth", help="comma-separated: lockstep | depth (default both)"
    )
    a.add_argument("--requests", type=at_least(1), default=64, help="requests in the stream (default 64)")
    a.add_argument(
        "--prompt-len",
        type=_token_range("--prompt-len"),
        default="16-128",
        help="each request's prompt length, drawn uniformly: LOW-HIGH or N (default 16-128)",
    )
    a.add_argument(
        "--new-tokens",
        type=_token_range("--new-tokens"),
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
    _timing_flags(a, warmup=1, repeats=3)
    a.add_argument("overrides", nargs="*", help="model overrides for --preset, e.g. n_loops=4")
    _compile_flag(a, "on")
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
    from looplab.inference.arrivals import RequestStream
    from looplab.costs.machine import check_stream
    from looplab.devices import resolve_device

    model, task = _model_and_task(args)
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
    model = _compile_decoding(model.to(device), args.compile)
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


SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def depth_display(pieces: list[str], loops: list[int], width: int = 96) -> str:
    """Each token's text followed by the loops that produced it as a superscript
    (`␣the² ␣cat⁴`), wrapped at `width` characters; spaces show as ␣ and control
    characters escaped, so token boundaries stay visible."""
    lines, line = [], ""
    for piece, n in zip(pieces, loops):
        text = "".join("␣" if c == " " else c if c.isprintable() else repr(c)[1:-1] for c in piece)
        cell = text + str(n).translate(SUPERSCRIPT)
        if line and len(line) + 1 + len(cell) > width:
            lines.append(line)
            line = ""
        line += (" " if line else "") + cell
    return "\n".join(lines + [line])


def untrained_gate_note(model, policy) -> str | None:
    """Why a gate-driven policy's exits may mean nothing: no stage of the checkpoint's
    lineage trained its exit gate (a pre-trained model's gate is its initialisation).
    None when the policy does not read the gate or a gated stage trained it."""
    from looplab.policy import EXIT_RULES, GATE_LOGITS
    from looplab.stages import DEFAULT_STAGE, STAGES

    if policy.rule not in EXIT_RULES or EXIT_RULES[policy.rule].reads != GATE_LOGITS:
        return None
    lineage = model.metadata.get("lineage") or [model.metadata.get("stage", DEFAULT_STAGE)]
    if any(stage in STAGES and STAGES[stage].gated for stage in lineage):
        return None
    return (
        f"note: --policy {policy.spec} exits where the exit gate says, and no stage of this checkpoint trained "
        f"the gate (lineage: {' -> '.join(lineage)}): its exits follow the gate's initial weights, not the "
        "tokens; train Stage-1 on it (looplab train --stage stage1 --init CHECKPOINT), or choose forced:D or a "
        "rule that reads the logits (skip-entropy:T)"
    )


def add_generate(sub) -> None:
    g = sub.add_parser("generate", help="continue a prompt from a checkpoint; print the loops behind each token")
    g.add_argument("--checkpoint", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument(
        "--policy",
        type=_policy,
        default="full",
        help="exit policy: full | forced:D | dense:Q | skip:Q | the zoo's skip-entropy:T, ... (default full)",
    )
    g.add_argument("--max-new-tokens", type=at_least(1), default=64)
    g.add_argument("--temperature", type=number_in(0.0), default=0.0, help="0: greedy (default)")
    g.add_argument("--top-k", type=at_least(0), default=0, help="0: no limit")
    g.add_argument("--top-p", type=number_in(0.0, 1.0, low_open=True), default=1.0)
    g.add_argument("--seed", type=at_least(0), default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument(
        "--attention-fill",
        choices=("hole", "exit_state"),
        default="hole",
        help="what exited tokens leave in deeper attention layers (hybrid/transformer)",
    )
    g.add_argument("--tokenizer", default="", help="default: the checkpoint's")
    g.add_argument("--no-bos", action="store_true", help="do not start the prompt with <bos>")
    g.add_argument("--device", default="auto")
    g.add_argument("--json", action="store_true", help="print one JSON record instead")
    _threads_flag(g)
    _compile_flag(g, "off")
    g.set_defaults(fn=cmd_generate)


def cmd_generate(args) -> int:
    """Continue a prompt from a checkpoint under an exit policy; print the text and the
    loops behind every new token."""
    import torch

    from looplab.checkpoint import load_model
    from looplab.costs.machine import check_decoding, check_new_tokens
    from looplab.inference.generate import generate
    from looplab.tasks.tokenizer import load_tokenizer
    from looplab.devices import resolve_device

    check_new_tokens("--max-new-tokens", args.max_new_tokens)  # a count no model makes sensible: before loading one
    _checkpoint(args.checkpoint)
    model = load_model(args.checkpoint)
    policy = args.policy
    try:
        policy.check(model.cfg.n_loops)
    except ConfigError as e:
        raise e.renamed("--policy", policy.spec) from None
    spec = args.tokenizer or model.metadata.get("tokenizer")
    if not spec:
        raise ConfigError(
            f"--checkpoint={args.checkpoint!r} carries no metadata['tokenizer']; allowed: "
            "--tokenizer mistral | bytes | an HF tokenizer name"
        )
    tok = load_tokenizer(spec)
    prompt = ([tok.bos_id] if tok.bos_id is not None and not args.no_bos else []) + tok.encode(args.prompt)
    if not prompt:
        raise ConfigError("--prompt is empty; allowed: some text (or drop --no-bos)")
    top = max(prompt)
    if top >= model.cfg.vocab_size:  # an id past the model's embedding: another tokenizer's
        raise ConfigError(
            f"--tokenizer={spec!r} is invalid for --checkpoint={args.checkpoint!r}: the prompt's ids reach "
            f"{top}, the model's vocabulary has {model.cfg.vocab_size}; allowed: the tokenizer it trained with"
        )
    device = resolve_device(args.device)
    check_decoding(model.cfg, 1, len(prompt), args.max_new_tokens, "--max-new-tokens", args.max_new_tokens, device)
    note = untrained_gate_note(model, policy)
    if note:
        print(note, file=sys.stderr)
    model = _compile_decoding(model.to(device).eval(), args.compile)
    with torch.no_grad():
        out = generate(
            model,
            [prompt],
            args.max_new_tokens,
            policy,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            eos_id=tok.eos_id,
            stop=args.stop or None,
            decode=tok.decode,
            attention_fill=args.attention_fill,
        )
    assert out.texts is not None  # generate returns the texts when given decode=
    tokens, loops, text = out.tokens[0], out.loops[0], out.texts[0]
    pieces = [tok.decode([t]) for t in tokens]
    record = {
        "checkpoint": str(args.checkpoint),
        "prompt": args.prompt,
        "policy": policy.spec,
        "attention_fill": args.attention_fill,
        "n_loops": model.cfg.n_loops,
        "text": text,
        "tokens": tokens,
        "pieces": pieces,
        "loops": loops,
        "exit_step": out.exit_step[0],
        "finish": out.finish[0],
        "mean_loops": out.executed_loops,
        "prompt_executed_loops": out.prompt_executed_loops,
        "note": note,
    }
    if args.json:
        print(json.dumps(record))
        return 0
    print(args.prompt + text)
    mean = f"{out.executed_loops:.2f}" if out.executed_loops is not None else "-"
    counts = " ".join(f"{r}:{loops.count(r)}" for r in range(1, model.cfg.n_loops + 1))
    print(
        f"\nloops per new token ({policy.label}, R={model.cfg.n_loops}; mean {mean}, tokens per depth {counts}; "
        f"prompt {out.prompt_executed_loops:.2f}; stopped: {out.finish[0]}):",
        file=sys.stderr,
    )
    print(depth_display(pieces, loops), file=sys.stderr)
    return 0


def add_export(sub) -> None:
    x = sub.add_parser("export", help="write a checkpoint as a Hugging Face folder (transformers, lm-eval's hf)")
    x.add_argument("--checkpoint", required=True)
    x.add_argument(
        "--format",
        default="hf",
        help="hf: AutoModelForCausalLM.from_pretrained(OUT_DIR, trust_remote_code=True) (default hf)",
    )
    x.add_argument(
        "--policy",
        type=_policy,
        default="full",
        help="the exit policy the export runs by default (config exit_policy; overridable at load time)",
    )
    x.add_argument("--force", action="store_true", help="replace a previous export in OUT_DIR (nothing else)")
    x.add_argument("out_dir", metavar="OUT_DIR")
    x.set_defaults(fn=cmd_export)


def cmd_export(args) -> int:
    """Write a checkpoint as a folder another ecosystem loads (--format hf: transformers,
    with trust_remote_code; looplab/export.py)."""
    from looplab import destinations
    from looplab.checkpoint import read_model_config
    from looplab.export import FORMATS, check_out_dir, export_hf

    if args.format not in FORMATS:
        raise ConfigError(f"--format={args.format!r} is invalid; allowed: {' | '.join(FORMATS)}")
    _checkpoint(args.checkpoint)
    try:
        args.policy.check(read_model_config(args.checkpoint).n_loops)
    except ConfigError as e:
        raise e.renamed("--policy", args.policy.spec) from None
    destinations.output_dir("OUT_DIR", args.out_dir)
    check_out_dir(args.out_dir, args.force, name="OUT_DIR")
    out = export_hf(args.checkpoint, args.out_dir, args.policy, force=args.force)
    print(
        f"exported {args.checkpoint} to {out} (format {args.format}, exit policy {args.policy.spec}); load it "
        f"with AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)"
    )
    return 0


def add_presets(sub) -> None:
    sub.add_parser("presets", help="list the presets").set_defaults(fn=cmd_presets)


def cmd_presets(args) -> int:
    from looplab.presets import PRESETS, get_preset

    for name in sorted(PRESETS):
        c = get_preset(name)
        m = c.model
        print(
            f"{name:24s} {c.task.kind:5s} {m.arch:11s} {m.n_layers}⊗{m.n_loops}  d={m.d_model}  "
            f"steps={c.train.steps}  hash={c.config_hash()}"
        )
    return 0


def add_info(sub) -> None:
    i = sub.add_parser("info", help="parameters and FLOPs of a preset")
    i.add_argument("--preset", required=True)
    i.add_argument("overrides", nargs="*")
    i.set_defaults(fn=cmd_info)


def cmd_info(args) -> int:
    from looplab.checkpoint import model_from_config

    cfg = _experiment(args)
    model = model_from_config(cfg.model, cfg.train.seed)
    flops = model.flops_per_token(cfg.train.seq_len)
    print(
        json.dumps(
            {
                "preset": args.preset,
                "config_hash": cfg.config_hash(),
                "params": model.num_parameters(),
                "params_non_embedding": model.num_parameters(exclude_embeddings=True),
                "seq_len": cfg.train.seq_len,
                "flops_per_token": flops,
                "config": cfg.to_dict(),
            },
            indent=2,
        )
    )
    return 0


def add_doctor(sub) -> None:
    d = sub.add_parser(
        "doctor",
        help="check this node: environment, peaks, kernel correctness, a training probe, Ray (looplab/doctor.py)",
    )
    d.add_argument(
        "--quick",
        action="store_true",
        help="environment, peaks and correctness only (seconds): what cluster.yaml runs on every node",
    )
    d.add_argument("--json", help="also write every check (name, status, figure, value, reason) here")
    d.add_argument("--markdown", help="also write the checks as a markdown table here")
    d.add_argument(
        "--preset", default=None, help="the training probe's preset (default paper-140m on a GPU, local on a CPU)"
    )
    d.add_argument("--steps", type=at_least(1), default=3, help="the training probe's timed steps (default 3)")
    d.add_argument("--device", default="auto")
    d.add_argument("--no-ray", action="store_true", help="skip the Ray check")
    _threads_flag(d)
    d.set_defaults(fn=cmd_doctor)


def cmd_doctor(args) -> int:
    from looplab.doctor import main as doctor

    if args.preset is not None:
        from looplab.presets import get_preset

        try:
            get_preset(args.preset)
        except ConfigError as e:
            raise e.renamed("--preset", args.preset) from None
    return doctor(args)


def add_dashboard(sub) -> None:
    d = sub.add_parser(
        "dashboard",
        help="serve MLflow's dashboard of a sweep's store until Ctrl-C, print its URLs (looplab/dashboard_server.py)",
    )
    d.add_argument("store", metavar="STORE", help="a sweep's storage folder (holding mlflow.db) or sqlite:///PATH")
    d.add_argument("--port", type=int_in(1, 65535), default=5000, help="default 5000, the port a sweep's URLs name")
    d.add_argument("--host", default="127.0.0.1", help="the interface to bind (default 127.0.0.1: this machine only)")
    d.add_argument("--experiment", help="the experiment whose newest sweep to open (default: the store's newest sweep)")
    d.add_argument(
        "--timeout", type=number_in(1), default=180.0, help="seconds to wait for the server's /health (default 180)"
    )
    d.set_defaults(fn=cmd_dashboard)


def _wait_interruptibly(process) -> int:
    """The process's exit status. Not a bare wait(): a signal that lands on another thread
    (MLflow's client starts some) runs its Python handler only once the main thread runs
    Python again, and a blocking waitpid would never return to it."""
    import subprocess

    while True:
        try:
            return process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass


def cmd_dashboard(args) -> int:
    """Serve the store with one MLflow worker in a process group of its own, print the
    URLs once /health answers, then wait; Ctrl-C or SIGTERM stops the whole group."""
    import signal

    from looplab import dashboard_server as ds

    uri = ds.store_uri(args.store)

    # SIGINT too: a shell starts a background job with SIGINT ignored, and Python then
    # leaves it ignored; a kill -INT must still stop the server, not orphan it.
    stop_asked = ds.stop_once()
    handlers = {s: signal.signal(s, stop_asked) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    server = ds.Server(uri, args.host, args.port)
    try:
        with server:
            lines = ds.sweep_lines(uri, server.base, args.experiment)  # reads the store while the server starts
            took = server.wait_healthy(args.timeout)
            print(
                f"serving {uri} at {server.base}/ (up in {took:.0f} s; process group {server.pgid}; log: {server.log})"
            )
            print("\n".join(lines))
            print("Ctrl-C stops it.", flush=True)
            status = _wait_interruptibly(server.process)
        print(f"looplab: mlflow server exited by itself (status {status}); its log: {server.log}", file=sys.stderr)
        return 1
    except ds.NotServing as e:
        print(f"looplab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        forced = f" ({server.killed} ignored SIGTERM and were killed)" if server.killed else ""
        left = ds.group_members(server.pgid) if server.pgid else []
        if left:
            print(f"looplab: MLflow processes {left} of process group {server.pgid} are still running", file=sys.stderr)
            return 1
        print(f"stopped: no MLflow process left{forced}", flush=True)
        return 0
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="looplab", description="Looped language models: single runs and data.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add in (
        add_train,
        add_data,
        add_eval,
        add_lm_eval,
        add_bench,
        add_bench_arrivals,
        add_generate,
        add_export,
        add_presets,
        add_info,
        add_doctor,
        add_dashboard,
    ):  # --help lists the commands in this order
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _destinations(args)  # before any command's work: a bad --json costs seconds, not the evaluation
        if hasattr(args, "threads"):  # a command that computes: threads chosen, never torch's default
            from looplab import threads

            threads.use(args.threads)
        return args.fn(args)
    except ConfigError as e:
        print(f"looplab: error: {e}", file=sys.stderr)
        return 2
    except (TrainingDiverged, CheckpointNotWritten) as e:  # stopped, nothing lost: the line says how to go on
        print(f"looplab: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
