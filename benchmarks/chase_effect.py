"""The paper's central effect at small scale (its Fig. 2): skip-mode perplexity of
the stock Ouro gate against the CHASE-adapted gate as compute falls.

    python benchmarks/chase_effect.py --preset local --out runs/chase-effect [--json out.json]

Pipeline on one preset (R = 4): fixed-loop pre-training → Stage-1, then two arms
that share that Stage-1 checkpoint:
    ouro:  Stage-1 → Stage-2                 ("loop4-Ouro")
    chase: Stage-1 → CHASE → Stage-2         ("loop4-CHASE")
Both arms are then evaluated on the validation set under skip execution for a
sweep of thresholds q, and under full compute (forced depth R). The figure of
merit is the perplexity increase over full compute at a similar number of
executed loops. Re-running resumes finished stages from their checkpoints.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from looplab.checkpoint import load_model, parent_ref
from looplab.config import apply_overrides, parse_value
from looplab.evaluate import evaluate_policy
from looplab.policy import ExitPolicy
from looplab.presets import get_preset
from looplab.presets import stage_config
from looplab.tasks import make_task
from looplab.train import train

QS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def run_stage(cfg, out: Path, label: str) -> Path:
    t = time.perf_counter()
    result = train(cfg, out, quiet=True)
    print(f"  {label:8s} {cfg.train.steps:5d} steps  {time.perf_counter() - t:6.1f} s  "
          f"final eval loss {result.eval.get('loss', float('nan')):.4f}", flush=True)
    return out / "checkpoint"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="local")
    p.add_argument("--out", default="runs/chase-effect")
    p.add_argument("--stage-steps", type=int, default=0, help="steps of each continued stage (default: preset/4)")
    p.add_argument("--stage-lr", type=float, default=0.0, help="peak lr of continued stages (default: App. E's)")
    p.add_argument("--json", help="write the records here")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE applied to every stage")
    args = p.parse_args()

    out = Path(args.out)
    overrides = {"model.n_loops": 4, **{k: parse_value(v) for k, v in (o.split("=", 1) for o in args.overrides)}}
    base = apply_overrides(get_preset(args.preset), overrides)
    stage_steps = args.stage_steps or max(20, base.train.steps // 4)

    def stage(name: str, parent: Path):
        mine = {"train.steps": stage_steps, "train.warmup_steps": max(1, stage_steps // 50)}
        if args.stage_lr:
            mine["train.lr"] = args.stage_lr
        return stage_config(get_preset(args.preset), name, parent=parent_ref(parent), overrides=overrides,
                            stage_overrides=mine)

    print(f"{args.preset}: {base.model.arch} {base.model.n_layers}⊗{base.model.n_loops}, "
          f"pretrain {base.train.steps} steps, stages {stage_steps} steps")
    pre = run_stage(base, out / "pretrain", "pretrain")
    s1 = run_stage(stage("stage1", pre), out / "stage1", "stage1")
    ouro = run_stage(stage("stage2", s1), out / "ouro-stage2", "ouro-s2")
    chased = run_stage(stage("chase", s1), out / "chase", "chase")
    chase = run_stage(stage("stage2", chased), out / "chase-stage2", "chase-s2")

    batch = make_task(base.task, base.train.seq_len).eval_batch()
    records = []
    for arm, ckpt in (("ouro", ouro), ("chase", chase)):
        model = load_model(ckpt)
        full = evaluate_policy(model, batch, ExitPolicy.full(), batch_size=base.train.eval_batch_size)
        records.append({"arm": arm, "mode": "full", "q": None, "executed_loops": full["executed_loops"],
                        "ppl": full["ppl"], "ppl_increase_pct": 0.0})
        for q in QS:
            r = evaluate_policy(model, batch, ExitPolicy.skip(q), batch_size=base.train.eval_batch_size)
            records.append({"arm": arm, "mode": "skip", "q": q, "executed_loops": r["executed_loops"],
                            "ppl": r["ppl"], "ppl_increase_pct": 100 * (r["ppl"] / full["ppl"] - 1)})
    print("\narm    mode  q     loops  ppl        vs full")
    for r in records:
        q = "" if r["q"] is None else f"{r['q']:.1f}"
        print(f"{r['arm']:6s} {r['mode']:5s} {q:4s}  {r['executed_loops']:4.2f}  {r['ppl']:9.3f}  "
              f"{r['ppl_increase_pct']:+8.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"preset": args.preset, "stage_steps": stage_steps,
                                               "records": records}, indent=2))


if __name__ == "__main__":
    main()
