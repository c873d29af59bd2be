"""A small sweep logged to an MLflow store with looplab.tracking, shaped like the
platform's (trainables/trial.py): a sweep run; per trial a trial run (params of the
final stage's config, search.* values, content tags) and one nested run per stage;
shared upstream stages trained once and reused (reused=true, reused_from, the
original's final metrics logged again); training records, the full-model eval and
the threshold sweep (dense / skip at q, forced depths 1..R) logged as
looplab.training.train's records through tracking.log_record. log_evaluations adds downstream
evaluation runs (level eval) with the platform's writer (trainables/evaluation.py);
log_zoo_rules adds zero-shot exit-rule metrics under the zoo's prefixes.

The values are simple closed forms (VALUES below) so tests can state expected
numbers by hand.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from looplab import tracking
from looplab.evaluation.paper_tasks import PAPER_TASKS
from looplab.policy import DENSE, FORCED, FULL, SKIP, ExitPolicy
from looplab.stages import get_stage
from trainables.pipeline import PipelineSpec
from trainables.pipeline import stage_configs as pipeline_stage_configs

QS = (0.2, 0.4, 0.6, 0.8, 1.0)
R = 4
ARMS = {"Ouro": ("pretrain", "stage1", "stage2"), "CHASE": ("pretrain", "stage1", "chase", "stage2")}


def skip_loops(q: float) -> float:
    return 1.5 + 2.5 * q  # q 0.2 -> 2.0 ... 1.0 -> 4.0


def point_values(arm: str, stage: str, seed: int, mode: str, q: float | None, depth: int | None) -> dict:
    """Executed loops, exit step, accuracy and perplexity of one evaluation point."""
    s = 0.02 * seed
    if mode == "forced":
        return {
            "executed_loops": float(depth),
            "mean_exit_step": float(depth),
            "accuracy": 0.1 * depth + s,
            "ppl": 100.0 / depth**2 + seed,
        }
    if mode == "full":  # all R loops, readout at R: forced depth R
        return point_values(arm, stage, seed, "forced", None, R)
    exit_step = skip_loops(q)
    loops = float(R) if mode == "dense" else exit_step
    if mode == "dense":
        acc, ppl = 0.40 + 0.1 * q + s, 10.0 + seed + (1.0 - q)
    elif arm == "CHASE" and stage in ("chase", "stage2"):
        acc, ppl = 0.35 + 0.1 * q + s, 10.5 + seed + (1.0 - q)
    else:  # the Ouro gate under skip: quality collapses as compute falls (the cache-hole effect)
        acc, ppl = 0.05 + 0.4 * q + s, 10.0 + seed + 50.0 * (1.0 - q)
    return {"executed_loops": loops, "mean_exit_step": exit_step, "accuracy": acc, "ppl": ppl}


def eval_records(arm: str, stage: str, seed: int, step: int) -> list[dict]:
    """looplab.training.train's evaluation record: one entry per policy the stage evaluates
    (looplab.stages: full depth; gate stages add dense and skip at each q and forced
    depths 1..R-1)."""

    def entry(policy: ExitPolicy, v: dict) -> dict:
        return {
            "policy": policy.spec,
            **v,
            "loss": math.log(v["ppl"]),
            "backbone_flops_per_token": 1000.0 * v["executed_loops"],
            "n": 100,
        }

    for_policy = {
        FULL: lambda p: point_values(arm, stage, seed, "full", None, None),
        FORCED: lambda p: point_values(arm, stage, seed, "forced", None, p.depth),
        DENSE: lambda p: point_values(arm, stage, seed, "dense", p.q, None),
        SKIP: lambda p: point_values(arm, stage, seed, "skip", p.q, None),
    }
    policies = get_stage(stage).eval_policies(R)
    return [
        {"kind": "eval", "step": step, "policies": [entry(p, for_policy[p.execution](p)) for p in policies]},
        {"kind": tracking.LOOP, "step": step, "metrics": loop_values(arm, stage, seed)},
    ]


def loop_values(arm: str, stage: str, seed: int) -> dict[str, float]:
    """The per-loop instruments of looplab/training/instruments.py, as closed forms: hidden norm
    r + 0.1·seed, gradient 1/r (stages that train the backbone), and under skip at q
    (gated stages) the active fraction 1 at loop 1 and q after, the state gap 0 at loop 1
    and (0.5 for Ouro, 0.1 for CHASE's stages) · (1 − q) after."""
    out = {}
    gap = 0.1 if arm == "CHASE" and stage in ("chase", "stage2") else 0.5
    for r in range(1, R + 1):
        out[tracking.loop_metric(tracking.HIDDEN_NORM, r)] = r + 0.1 * seed
        if get_stage(stage).trains == "all":
            out[tracking.loop_metric(tracking.GRAD_NORM, r)] = 1.0 / r
        if get_stage(stage).gated:
            for q in QS:
                skip = ExitPolicy.skip(q)
                out[tracking.loop_metric(tracking.ACTIVE, r, skip)] = 1.0 if r == 1 else q
                out[tracking.loop_metric(tracking.STATE_GAP, r, skip)] = 0.0 if r == 1 else gap * (1 - q)
    return out


def log_records(mc, run_id: str, records: list[dict]) -> None:
    """What tracking.log_record logs for each record (same names, values and steps via
    tracking.record_metrics), in one log_batch per run instead of one per record: the
    fixture is then a few seconds, not twenty."""
    from mlflow.entities import Metric

    batch = [
        Metric(key, value, 0, int(record["step"]))
        for record in records
        for key, value in tracking.record_metrics(record).items()
    ]
    for i in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per batch
        mc.log_batch(run_id, metrics=batch[i : i + 1000])


def train_records(stage: str, beta: float, steps: int) -> list[dict]:
    out = []
    for step in range(steps // 4, steps + 1, steps // 4):
        rec = {
            "kind": "train",
            "step": step,
            "stage": stage,
            "loss": 3.0 - step / steps,
            "lr": 1e-3,
            "grad_norm": 1.0,
            "tokens_per_s": 1000.0,
        }
        if stage != "pretrain":  # a gate exists: the β diagnostics
            rec["exit_entropy"] = math.log(R) * (1.0 - 0.5 * step / steps) * min(1.0, beta * 4)
            rec["expected_exit_step"] = 4.0 - beta * step / steps
        out.append(rec)
    return out


def stage_configs(arm: str, seed: int, beta: float, root: Path, *, preset: str = "debug", extra=None):
    """The trial's stage configs exactly as the platform derives them (β searched in Stage-1)."""
    spec = PipelineSpec(
        preset=preset,
        stages=ARMS[arm],
        overrides={"train.steps": 40, **(extra or {})},
        searched={"beta": "exit.beta"},
        searched_stages=("stage1",),
    )
    return pipeline_stage_configs(spec, {"beta": beta, "seed": seed}, root)


def log_sweep(
    uri: str,
    root: Path,
    experiment: str,
    *,
    arms=("Ouro", "CHASE"),
    seeds=(0, 1),
    betas=(0.25,),
    lm_eval: bool = False,
    preset: str = "debug",
    extra=None,
    sweep_key: str = "k0",
    stored: dict[str, dict] | None = None,
    declared: bool = False,
) -> dict:
    """Log the sweep as the platform does: stages several trials share (pretrain and
    Stage-1 of the two arms of one seed) train first as runs under the sweep run
    (trainables/trial.py, run_shared_prefix); every trial then has a run per stage,
    reusing those (reused=true, reused_from, the original's final metrics logged again).
    Another sweep into the same experiment (its own sweep_key) passes `stored`, the
    store's done markers an earlier sweep returned ("done"): the stages they hold are
    reused, not trained, and a trial whose run an earlier sweep FINISHED is reused whole,
    its run left under that sweep's run, nothing logged. declared: the sweep run gets the
    params the platform logs on it (its grid of β, its seeds: tracking.sweep_params).
    Returns {"sweep_run": id, "trials": {(arm, seed, beta): trial_run_id},
    "stages": {(arm, seed, beta, stage): stage_run_id}, "experiment_id": id, "done":
    {stage_key: done marker}, "reused_trials": the trial runs reused whole}."""
    mc = tracking.client(uri)
    exp_id = tracking.ensure_experiment(mc, experiment, root / "mlflow")
    name = f"{experiment}-sweep" if sweep_key == "k0" else tracking.sweep_run_name(experiment, sweep_key)
    sweep = mc.create_run(
        exp_id,
        run_name=name,
        tags={
            tracking.LEVEL: tracking.SWEEP,
            tracking.SWEEP_KEY: sweep_key,
            tracking.PRESET: preset,
            tracking.GIT_SHA: "abc",
            tracking.COMMAND: "sweeps/test.py",
            tracking.RUN_NAME_TAG: name,
        },
    ).info.run_id
    if declared:
        settings = {"seeds": list(seeds), "search": "grid"}
        tracking.log_params(mc, sweep, tracking.sweep_params({"beta": list(betas)}, (), {}, settings))
    trials = {
        (arm, seed, beta): stage_configs(arm, seed, beta, root, preset=preset, extra=extra)
        for arm in arms
        for beta in betas
        for seed in seeds
    }
    uses = Counter(cfg.stage_key() for configs in trials.values() for cfg in configs)
    trained: dict[str, dict] = dict(stored or {})  # stage_key -> {"run_id", "metrics"} (the "done" marker)
    for (arm, seed, _beta), configs in trials.items():
        for i, cfg in enumerate(configs):
            if uses[cfg.stage_key()] > 1 and cfg.stage_key() not in trained:
                trained[cfg.stage_key()] = _train_stage(mc, exp_id, configs[: i + 1], arm, seed, sweep, None, False)
    out = {
        "sweep_run": sweep,
        "trials": {},
        "stages": {},
        "experiment_id": exp_id,
        "configs": trials,
        "trained": {key: done["run_id"] for key, done in trained.items()},
        "reused_trials": [],
    }
    for (arm, seed, beta), configs in trials.items():
        final = configs[-1]
        lineage = [c.stage for c in configs]
        trial, status = tracking.open_run(
            mc,
            exp_id,
            name=tracking.trial_run_name(final.stage_key()),
            tags=tracking.config_tags(
                final, level=tracking.TRIAL, git="abc", lineage=lineage, **{tracking.SWEEP_TAG: experiment}
            ),
            key={tracking.LEVEL: tracking.TRIAL, tracking.STAGE_KEY: final.stage_key()},
            parent_run_id=sweep,
            params={**tracking.config_params(final), **tracking.search_params({"beta": beta, "seed": seed})},
        )
        out["trials"][(arm, seed, beta)] = trial
        if status == "FINISHED":  # an earlier sweep's trial: reused whole, as trainables/trial.run_trial does
            out["reused_trials"].append(trial)
            continue
        for i, cfg in enumerate(configs):
            last = i == len(configs) - 1
            done = trained.get(cfg.stage_key())
            if done:  # trained before: reused, its metrics logged again
                run, _ = tracking.open_run(
                    mc,
                    exp_id,
                    name=tracking.stage_run_name(cfg.stage, cfg.stage_key()),
                    parent_run_id=trial,
                    key={
                        tracking.LEVEL: tracking.STAGE,
                        tracking.STAGE_KEY: cfg.stage_key(),
                        tracking.TRIAL_RUN: trial,
                    },
                    tags=tracking.config_tags(
                        cfg,
                        level=tracking.STAGE,
                        git="abc",
                        lineage=lineage[: i + 1],
                        **{tracking.REUSED_FROM: done["run_id"], tracking.REUSED: "true", tracking.CHECKPOINT: "ckpt"},
                    ),
                )
                tracking.log_metrics(mc, run, done["metrics"], step=cfg.train.steps)
                if last:
                    tracking.log_metrics(mc, trial, done["metrics"], step=cfg.train.steps)
                tracking.close_run(mc, run, ok=True)
            else:
                done = _train_stage(
                    mc, exp_id, configs[: i + 1], arm, seed, trial, trial if last else None, lm_eval and last
                )
                trained[cfg.stage_key()] = done
                run = done["run_id"]
            out["stages"][(arm, seed, beta, cfg.stage)] = run
        tracking.close_run(mc, trial, ok=True)
    tracking.close_run(mc, sweep, ok=True)
    out["trained"] = {key: done["run_id"] for key, done in trained.items()}
    out["done"] = trained
    return out


def _train_stage(mc, exp_id: str, chain, arm: str, seed: int, parent: str, trial: str | None, lm_eval: bool) -> dict:
    """A stage run that trains chain[-1] (under `parent`: a trial, or the sweep for a
    shared stage): its records, timing and, for a trial's last stage, the trial run's copy."""
    cfg, index = chain[-1], len(chain) - 1
    run, _ = tracking.open_run(
        mc,
        exp_id,
        name=tracking.stage_run_name(cfg.stage, cfg.stage_key()),
        parent_run_id=parent,
        key={tracking.LEVEL: tracking.STAGE, tracking.STAGE_KEY: cfg.stage_key(), tracking.TRIAL_RUN: parent},
        tags=tracking.config_tags(
            cfg,
            level=tracking.STAGE,
            git="abc",
            lineage=[c.stage for c in chain],
            **{tracking.REUSED: "false", tracking.CHECKPOINT: "ckpt"},
        ),
        params=tracking.config_params(cfg),
    )
    targets = [run] + ([trial] if trial else [])
    steps = cfg.train.steps
    records = train_records(cfg.stage, cfg.exit.beta, steps) + eval_records(arm, cfg.stage, seed, steps)
    for target in targets:
        log_records(mc, target, records)
        tracking.log_metrics(mc, target, {tracking.STAGE_SECONDS: 10.0 * (index + 1)}, step=steps)
        if lm_eval:
            tracking.log_metrics(mc, target, lm_eval_scores(arm, seed), step=steps)
    tracking.close_run(mc, run, ok=True)
    return {"run_id": run, "metrics": tracking.latest_metrics(mc, run)}


def lm_eval_scores(arm: str, seed: int) -> dict[str, float]:
    """Task scores (fractions) of the full model and of skip at q=0.4, by the names
    looplab/tracking/ documents."""
    scores = {}
    for i, task in enumerate(PAPER_TASKS):
        full = 0.30 + 0.01 * i + 0.01 * seed
        quantity = tracking.lm_eval_quantity(task)
        scores[tracking.policy_metric(ExitPolicy.full(), quantity)] = full
        scores[tracking.policy_metric(ExitPolicy.skip(0.4), quantity)] = full - (0.01 if arm == "CHASE" else 0.05)
    return scores


def log_untrained_sweep(uri: str, root: Path, experiment: str) -> str:
    """A sweep whose one trial logged training records only (it died before evaluating)."""
    mc = tracking.client(uri)
    exp_id = tracking.ensure_experiment(mc, experiment, root / "mlflow")
    sweep = mc.create_run(exp_id, tags={tracking.LEVEL: tracking.SWEEP, tracking.SWEEP_KEY: "k1"}).info.run_id
    cfg = stage_configs("Ouro", 0, 0.25, root)[0]
    trial, _ = tracking.open_run(
        mc,
        exp_id,
        name=tracking.trial_run_name(cfg.stage_key()),
        tags=tracking.config_tags(cfg, level=tracking.TRIAL, git="abc"),
        key={tracking.LEVEL: tracking.TRIAL, tracking.STAGE_KEY: cfg.stage_key()},
        parent_run_id=sweep,
        params=tracking.config_params(cfg),
    )
    for record in train_records("pretrain", 0.25, 40):
        tracking.log_record(mc, trial, record)
    tracking.close_run(mc, trial, ok=True)
    tracking.close_run(mc, sweep, ok=True)
    return sweep


def log_history(uri: str, root: Path, experiment: str) -> str:
    """One trial run (no stage runs) whose evaluation got worse after its best step:
    val_ppl 8.0 then 9.0, val_accuracy 0.5 then 0.4; training loss 3.0, 2.0, 2.5."""
    mc = tracking.client(uri)
    exp_id = tracking.ensure_experiment(mc, experiment, root / "mlflow")
    cfg = stage_configs("Ouro", 0, 0.25, root)[0]
    trial, _ = tracking.open_run(
        mc,
        exp_id,
        name="trial",
        tags=tracking.config_tags(cfg, level=tracking.TRIAL),
        key={tracking.LEVEL: tracking.TRIAL, tracking.STAGE_KEY: cfg.stage_key()},
        params=tracking.config_params(cfg),
    )
    for step, ppl, acc, loss in ((10, 8.0, 0.5, 3.0), (20, 9.0, 0.4, 2.0)):
        tracking.log_record(
            mc,
            trial,
            {
                "kind": "eval",
                "step": step,
                "policies": [{"policy": "full", "ppl": ppl, "accuracy": acc, "loss": math.log(ppl)}],
            },
        )
        tracking.log_record(mc, trial, {"kind": "train", "step": step, "loss": loss})
    tracking.log_record(mc, trial, {"kind": "train", "step": 30, "loss": 2.5})
    tracking.close_run(mc, trial, ok=True)
    return trial


# ---- downstream evaluations (level eval) ---------------------------------------------------
EVAL_TASKS = ("piqa", "arc_easy")


def downstream_loops(policy: ExitPolicy) -> float:
    """Loops executed on the tasks: forced d and dense exactly d and R; skip a little off
    the validation set's skip_loops (1.92 ... 3.48, then 4.0 at q = 1), so a test can tell
    the two apart."""
    if policy.execution == FULL:
        return float(R)
    if policy.execution == FORCED:
        return float(policy.depth)
    if policy.execution == DENSE:
        return float(R)
    return min(float(R), 1.4 + 2.6 * policy.q)


def downstream_accuracy(arm: str, stage: str, seed: int, policy: ExitPolicy, task_index: int) -> float:
    """A task's accuracy: the pre-trained model rises with forced depth; dense peaks at
    q = 0.8 (0.35), CHASE's skip at q = 0.6 (0.34), Ouro's skip falls with compute."""
    s = 0.01 * seed + 0.01 * task_index
    if policy.execution in (FULL, FORCED):
        return 0.25 + 0.02 * (R if policy.execution == FULL else policy.depth) + s
    q = policy.q
    if policy.execution == DENSE:
        return 0.35 - 0.5 * (q - 0.8) ** 2 + s
    if arm == "CHASE":
        return 0.34 - 0.25 * (q - 0.6) ** 2 + s
    return 0.10 + 0.2 * q + s


def log_evaluations(uri: str, root: Path, experiment: str, logged: dict, *, tasks=EVAL_TASKS) -> int:
    """Evaluation runs as the platform's evaluation step writes them (open_eval_run,
    tracking.downstream_metrics, nested under the run that trained the stage): the
    pre-trained model at forced depths 1..R (R as full), each trial's final stage under
    dense and skip at each q. Returns how many runs it wrote."""
    from trainables.eval_tasks import EvalTask
    from trainables.evaluation import Checkpoint, Evaluation, open_eval_run

    mc = tracking.client(uri)
    exp_id = tracking.ensure_experiment(mc, experiment, root / "mlflow")
    grid_tasks = [EvalTask(t, "paper", 5, "acc_norm", "hub:fixture", "1") for t in tasks]
    written, done = 0, set()
    for (arm, seed, _beta), configs in logged["configs"].items():
        for i, cfg in enumerate(configs):
            if cfg.stage != "pretrain" and i != len(configs) - 1:
                continue
            if cfg.stage_key() in done:
                continue
            done.add(cfg.stage_key())
            checkpoint = Checkpoint(
                "ckpt",
                cfg.stage,
                cfg.stage_key(),
                cfg.config_hash(),
                tuple(c.stage for c in configs[: i + 1]),
                R,
                logged["trained"][cfg.stage_key()],
            )
            policies = (
                [ExitPolicy.forced(d) for d in range(1, R)] + [ExitPolicy.full()]
                if cfg.stage == "pretrain"
                else [ExitPolicy.dense(q) for q in QS] + [ExitPolicy.skip(q) for q in QS]
            )
            for policy in policies:
                for index, task in enumerate(grid_tasks):
                    run, _ = open_eval_run(mc, exp_id, Evaluation(checkpoint, policy.spec, task), git="abc")
                    loops = downstream_loops(policy)
                    tracking.log_metrics(
                        mc,
                        run,
                        tracking.downstream_metrics(
                            policy,
                            task.name,
                            accuracy=downstream_accuracy(arm, cfg.stage, seed, policy, index),
                            loops=loops,
                            flops=1000.0 * loops,
                            seconds=0.5 * loops,
                        ),
                    )
                    tracking.close_run(mc, run, ok=True)
                    written += 1
    return written


# ---- the policy zoo (zero-shot exit rules) ----------------------------------------------------
ZOO_RULES = {"skip_entropy": (0.5, 1.0, 2.0), "dense_kl": (0.01,)}


def zoo_values(arm: str, seed: int, prefix: str, threshold: float) -> dict:
    """A rule's validation point: skip-entropy at threshold t runs 4 - t loops at the
    gate's accuracy for those loops minus 0.05 (CHASE; Ouro minus 0.02); dense-kl runs all R."""
    if prefix.startswith("dense"):
        return {"executed_loops": float(R), "accuracy": 0.40 + 0.01 * seed}
    loops = R - threshold
    gate = 0.29 + 0.04 * loops + 0.02 * seed if arm == "CHASE" else 0.05 + 0.16 * (loops - 1.5) + 0.02 * seed
    return {"executed_loops": loops, "accuracy": gate - (0.05 if arm == "CHASE" else 0.02)}


def log_zoo_rules(uri: str, logged: dict) -> None:
    """Metrics named by the zoo's prefixes (skip_entropy<t>_, dense_kl<t>_) on each
    trial's final stage run, as a zoo evaluation would log them there."""
    from looplab.policy import number_name

    mc = tracking.client(uri)
    for (arm, seed, beta), configs in logged["configs"].items():
        run = logged["stages"][(arm, seed, beta, configs[-1].stage)]
        metrics = {}
        for prefix, thresholds in ZOO_RULES.items():
            for t in thresholds:
                name = f"{prefix}{number_name(t) if t < 1 or t != int(t) else int(t)}_"
                metrics.update({name + k: v for k, v in zoo_values(arm, seed, prefix, t).items()})
        tracking.log_metrics(mc, run, metrics, step=configs[-1].train.steps)
