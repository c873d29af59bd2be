"""`looplab eval` (exit policies on the task's eval set) and `looplab lm-eval`
(lm-eval tasks or the paper's suite on a checkpoint)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from looplab.arguments import at_least, flag
from looplab.cli.inputs import check_checkpoint
from looplab.cli.shared_flags import Device, Threads, command, policies_type, policy_type
from looplab.config import ConfigError
from looplab.policy import ExitPolicy


@dataclass(frozen=True)
class Eval:
    """evaluate exit policies (full, forced, dense, skip, the zoo's zero-shot rules) on the
    task's eval set

    `looplab eval`'s flags (with Threads')."""

    checkpoint: str = flag()
    policies: Sequence[ExitPolicy] | None = flag(
        None,
        "exit policies, e.g. 'full;dense:0.2,0.4;skip:0.2,0.4;forced:1-3'; the zoo's zero-shot "
        "rules, in dense or skip execution: entropy below T nats (skip-entropy:1.0,2.0), KL between "
        "consecutive steps below T (dense-kl:0.01), argmax stable for K steps (skip-stable:2-3) "
        "(default: what the checkpoint's stage evaluates: full depth, dense and skip at q in "
        "0.2..1.0, forced 1..R-1)",
        type=policies_type,
    )
    limit: int = flag(0, "first N eval samples only (0: all)", type=at_least(0))
    batch_size: int = flag(64, type=at_least(1))
    json: str | None = flag(None, "also write the records as a JSON list here")


def add_eval(sub) -> None:
    command(sub, "eval", cmd_eval, Eval, Device, Threads)


def cmd_eval(args) -> int:
    from looplab.checkpoint import load_model
    from looplab.config import ExperimentConfig
    from looplab.costs.machine import check_forward
    from looplab.devices import resolve_device
    from looplab.evaluation.validation import evaluate_policies, format_table
    from looplab.stages import get_stage
    from looplab.tasks import make_task

    check_checkpoint(args.checkpoint)
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


def _limit(value: str) -> int | float:
    """lm-eval's --limit: N documents per task, or a fraction below 1."""
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"--limit {value!r} is invalid; allowed: a count >= 1 or a fraction in (0, 1)")
    return number if number < 1 else int(number)


@dataclass(frozen=True)
class LmEval:
    """lm-eval tasks or the paper's seven-task suite on a checkpoint (JSON)

    `looplab lm-eval`'s flags (with Threads')."""

    checkpoint: str = flag()
    tasks: str = flag("", "comma-separated lm-eval task names (with --suite: a subset)")
    suite: Literal["paper"] | None = flag(
        None,
        "paper: piqa, boolq, winogrande, openbookqa (5 shots), hellaswag (10), arc_challenge "
        "(25), arc_easy (8), and their average accuracy",
    )
    include_path: str | None = flag(None, "directory of extra task YAMLs")
    local_data: str | None = flag(
        None, "suite datasets from DIR/<task>/<split>.parquet (python -m looplab.evaluation.paper_tasks export)"
    )
    policy: ExitPolicy = flag(
        ExitPolicy.parse("full"),
        "exit policy: full | forced:D | dense:Q | skip:Q (the gate's threshold rule) | "
        "dense-entropy:T | skip-entropy:T | dense-kl:T | skip-kl:T | dense-stable:K | "
        "skip-stable:K (zero-shot rules, no gate needed) (default full)",
        type=policy_type,
    )
    tokenizer: str | None = flag(
        None,
        "the tokenizer the model was trained with, for checkpoints that do not record one: "
        "mistral | bytes | an HF tokenizer name (default: the checkpoint's)",
    )
    limit: int | float | None = flag(None, "documents per task (or a fraction < 1)", type=_limit)
    batch_size: int = flag(8, type=at_least(1))
    output: str | None = flag(None, "also write the JSON here")


def add_lm_eval(sub) -> None:
    command(sub, "lm-eval", cmd_lm_eval, LmEval, Device, Threads)


def cmd_lm_eval(args) -> int:
    """lm-eval tasks (or the paper's seven-task suite) on a checkpoint; JSON results
    with each task's accuracy and executed loops."""
    tasks = [t for t in (args.tasks or "").split(",") if t]
    check_checkpoint(args.checkpoint)
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
        from looplab.evaluation.paper_tasks import run_suite

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
