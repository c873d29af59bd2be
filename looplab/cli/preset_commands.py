"""`looplab train`, `looplab presets` and `looplab info`: one run of a preset, the
presets, a preset's size."""

from __future__ import annotations

import json

from looplab.arguments import at_least
from looplab.cli.inputs import experiment_config
from looplab.cli.shared_flags import threads_flag
from looplab.stages import STAGE_NAMES


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
    threads_flag(t)
    t.set_defaults(fn=cmd_train)


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


def add_info(sub) -> None:
    i = sub.add_parser("info", help="parameters and FLOPs of a preset")
    i.add_argument("--preset", required=True)
    i.add_argument("overrides", nargs="*")
    i.set_defaults(fn=cmd_info)


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
