"""`looplab train`, `looplab presets` and `looplab info`: one run of a preset, the
presets, a preset's size."""

from __future__ import annotations

import json
from dataclasses import dataclass

from looplab.arguments import at_least, flag, one_of
from looplab.cli.inputs import experiment_config
from looplab.cli.shared_flags import Threads, command
from looplab.stages import STAGE_NAMES


def stage_name(text: str) -> str:
    """--stage's argparse type: a stage registered when the flag is read (looplab/stages.py
    register adds them at run time, so not a Literal fixed at import)."""
    return one_of(*STAGE_NAMES)(text)


@dataclass(frozen=True)
class Train:
    """train one run of a preset (resumes from OUT/checkpoint)

    `looplab train`'s flags (with Threads')."""

    preset: str = flag()
    out: str = flag(help="run directory: metrics.jsonl and checkpoint/")
    stop_at: int | None = flag(None, "stop (with a checkpoint) after this many steps", type=at_least(1))
    no_resume: bool = flag(False, "ignore an existing checkpoint in OUT")
    stage: str | None = flag(
        None,
        "training stage (default pretrain); continued stages use their recipe from "
        "looplab/stages.py (App. D's optimiser settings), overrides still win",
        type=stage_name,
        metavar="{" + ",".join(STAGE_NAMES) + "}",
    )
    init: str | None = flag(None, "parent checkpoint a continued stage starts from")
    overrides: list[str] = flag(help="KEY=VALUE, e.g. model.n_loops=1 train.steps=500", positional=True)


def add_train(sub) -> None:
    command(sub, "train", cmd_train, Train, Threads)


def cmd_train(args) -> int:
    from looplab import destinations
    from looplab.training.run_folder import CHECKPOINT_DIR, DIVERGED, METRICS_FILE
    from looplab.training.train import train

    # What the run writes in --out, each of its kind (a metrics.jsonl that is a folder), before the model is built
    destinations.output_dir("--out", args.out, files=(METRICS_FILE, DIVERGED), folders=(CHECKPOINT_DIR,))
    cfg = experiment_config(args)
    result = train(cfg, args.out, resume=not args.no_resume, stop_at=args.stop_at)
    summary = {
        "out_dir": str(result.out_dir),
        "step": result.step,
        "stage_key": cfg.stage_key(),
        **{f"eval_{k}": v for k, v in result.eval.items() if k in ("accuracy", "loss", "n")},
    }
    print(json.dumps(summary))
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


@dataclass(frozen=True)
class Info:
    """parameters and FLOPs of a preset

    `looplab info`'s flags."""

    preset: str = flag()
    overrides: list[str] = flag(positional=True)


def add_info(sub) -> None:
    command(sub, "info", cmd_info, Info)


def cmd_info(args) -> int:
    from looplab.checkpoint import model_from_config

    cfg = experiment_config(args)
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
