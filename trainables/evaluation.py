"""Downstream evaluation as a step keyed by content: evaluated once, never recomputed.

An evaluation is one lm-eval task run on one checkpoint under one exit policy. Its key,
`eval_key` (made like a stage key: looplab.keys.digest), hashes exactly what can
change its result:

    the checkpoint: its stage key (its seed and every upstream stage included) and its
      weights' digest (a stage trained again into other weights is evaluated again);
    the exit policy, canonical: forced:R is full depth (the same execution), one key;
    the task: its name, shots, the accuracy read (acc_norm / acc / ...), its config
      (a digest of its parsed YAML: prompts, splits, metrics), and its data: SHA-256
      over the local files it reads, or hub:<dataset path>/<name> for the hub's copy;
    the documents it reads (--eval-limit).

Never batch size, device, paths or time. Each evaluation is one MLflow run (level eval,
tags tracking.eval_tags) nested under the run that trained its stage, with the
downstream metrics of the contract (tracking.downstream_metrics). A FINISHED run with
the key is never recomputed, so a grid that grows (one more q, task, policy or stage)
evaluates only what is new, on the checkpoints already trained.

    grid_evaluations    the grid × the checkpoints → Evaluations (no model, no store)
    evaluation_jobs     the missing evaluations grouped by checkpoint (one job loads its
                        model once)
    run_evaluation_job  per policy one lm-eval call over that policy's missing tasks
                        (lm-eval pays ~0.5 s of environment probing per call), one run
                        per task

An evaluation is a keyed step (trainables/keyed_step.py): EVAL_STEP finds the finished
ones, run_jobs runs the jobs as Ray tasks with the grid's CPUs and GPUs, or in-process
(inline=True).

The policies of a stage: the grid's, where they apply (a gate policy, dense:q or skip:q,
needs a trained gate: gated stages only; a forced depth at most the checkpoint's R;
full and the zero-shot rules anywhere); with none named, App. E and App. F's: a stage
without a gate gets forced depths 1..R (forced R as full depth), a gated stage dense and
skip at each q of the paper's grid.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looplab import threads, tracking
from looplab.config import ConfigError
from looplab.keys import digest
from looplab.policy import DEFAULT_QS, FORCED, GATE, ExitPolicy, parse_policies
from trainables.eval_tasks import EvalTask
from trainables.keyed_step import EVAL_STEP, open_step_run, run_jobs, weights_key

PAPER, INCLUDE, BUILTIN = "paper", "include", "builtin"  # where a task's config comes from
PPL_METRICS = ("perplexity", "word_perplexity")  # the perplexity a task may report
ENV_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_")  # the hub settings (offline flags, caches) jobs inherit


# ---- the grid --------------------------------------------------------------------------
def canonical(policy: ExitPolicy, n_loops: int) -> ExitPolicy:
    """forced:R runs and reads what full depth does: one execution, one key, logged as val_."""
    return ExitPolicy.full() if policy.execution == FORCED and policy.depth == n_loops else policy


def applies(policy: ExitPolicy, stage: str, n_loops: int) -> bool:
    """Whether a policy means something on a checkpoint of this stage (module docstring)."""
    from looplab.stages import get_stage

    if policy.rule == GATE:
        return get_stage(stage).gated
    if policy.execution == FORCED:
        return policy.depth is not None and policy.depth <= n_loops
    return True


def default_policies(stage: str, n_loops: int) -> list[ExitPolicy]:
    """App. E on a stage without a gate (forced depths 1..R), App. F on a gated one."""
    from looplab.stages import get_stage

    if not get_stage(stage).gated:
        return [ExitPolicy.forced(d) for d in range(1, n_loops + 1)]
    return [ExitPolicy.dense(q) for q in DEFAULT_QS] + [ExitPolicy.skip(q) for q in DEFAULT_QS]


@dataclass(frozen=True)
class EvalGrid:
    """What to evaluate after training, and with which resources (these never enter a key).

    policies: a parse_policies text ("dense:0.2,0.4;skip:0.4;forced:1-4"); "" for the
      defaults per stage. stages: the stages evaluated (() = every stage)."""

    tasks: tuple[EvalTask, ...]
    policies: str = ""
    limit: int | float | None = None
    stages: tuple[str, ...] = ()
    cpus: float = 1.0
    gpus: float = 0.0
    batch_size: int = 8
    device: str = "auto"

    def evaluates(self, stage: str) -> bool:
        return not self.stages or stage in self.stages

    def policies_for(self, stage: str, n_loops: int) -> list[ExitPolicy]:
        named = parse_policies(self.policies) if self.policies else default_policies(stage, n_loops)
        return list(dict.fromkeys(canonical(p, n_loops) for p in named if applies(p, stage, n_loops)))


@dataclass(frozen=True)
class Checkpoint:
    """A trained stage to evaluate, and the run that trained it (its evaluations nest there)."""

    path: str
    stage: str
    stage_key: str
    config_hash: str
    lineage: tuple[str, ...]
    n_loops: int
    run_id: str
    preset: str = ""
    task_kind: str = "text"
    weights: str = ""  # the weights' digest (config.json's weights_sha256); "" before training

    @property
    def weights_key(self) -> str:
        """The key of what a step on this checkpoint reads (trainables/keyed_step.weights_key)."""
        return weights_key(self.stage_key, self.weights)


@dataclass(frozen=True)
class Evaluation:
    checkpoint: Checkpoint
    policy: str  # the canonical policy's spec
    task: EvalTask
    limit: int | float | None = None

    @property
    def key(self) -> str:
        return eval_key(self.checkpoint.weights_key, self.policy, self.task, self.limit)

    def params(self) -> dict[str, str]:
        p = tracking.EVAL_PARAM
        return {
            p + "task": self.task.name,
            p + "policy": self.policy,
            p + "num_fewshot": str(self.task.num_fewshot),
            p + "metric": self.task.metric,
            p + "data": self.task.data,
            p + "version": self.task.version,
            p + "limit": str(self.limit),
        }


def eval_key(weights: str, policy: str, task: EvalTask, limit: int | float | None) -> str:
    """The content key of an evaluation (module docstring); `weights` is the checkpoint's
    weights_key."""
    return digest({"weights": weights, "policy": policy, "task": task.key_payload(), "limit": limit})


def grid_evaluations(grid: EvalGrid, checkpoints) -> list[Evaluation]:
    """Every evaluation of the grid on these checkpoints (each stage key once), in order."""
    out, seen = [], set()
    for ck in checkpoints:
        if ck.stage_key in seen or not grid.evaluates(ck.stage):
            continue
        seen.add(ck.stage_key)
        for policy in grid.policies_for(ck.stage, ck.n_loops):
            out += [Evaluation(ck, policy.spec, task, grid.limit) for task in grid.tasks]
    return out


# ---- the store -----------------------------------------------------------------------------
def open_eval_run(mc, experiment_id: str, ev: Evaluation, git: str | None = None) -> tuple[str, str]:
    """The evaluation's run, found by its key or created under the run that trained its
    stage: (run_id, status before: FINISHED means done, nothing to compute)."""
    ck, policy = ev.checkpoint, ExitPolicy.parse(ev.policy)
    return open_step_run(
        mc,
        experiment_id,
        EVAL_STEP,
        ev.key,
        name=tracking.eval_run_name(ev.task.name, policy, ev.key),
        parent_run_id=ck.run_id or None,
        tags=tracking.eval_tags(
            eval_key=ev.key,
            stage_key=ck.stage_key,
            config_hash=ck.config_hash,
            stage=ck.stage,
            lineage=ck.lineage,
            checkpoint=ck.path,
            policy=policy,
            task=ev.task.name,
            preset=ck.preset,
            git=git,
        ),
        params=ev.params(),
    )


def task_metrics(ev: Evaluation, results: dict[str, Any]) -> dict[str, float]:
    """The contract's downstream metrics of one task from lm-eval's results (with the
    adapter's executed loops, FLOPs and model time per task)."""
    row = results["results"][ev.task.name]
    accuracy = None
    if ev.task.metric:
        accuracy = row.get(f"{ev.task.metric},none")
        if accuracy is None:
            raise ConfigError(
                f"task {ev.task.name} reports no {ev.task.metric}; it reports "
                f"{sorted(k.split(',')[0] for k in row if ',' in k)}"
            )
    ppl = next((row[f"{m},none"] for m in PPL_METRICS if isinstance(row.get(f"{m},none"), (int, float))), None)
    # The adapter (looplab/evaluation/harness.py) reports its loops and FLOPs under the contract's quantity names.
    return tracking.downstream_metrics(
        ExitPolicy.parse(ev.policy),
        ev.task.name,
        accuracy=accuracy,
        loops=row.get(tracking.EXECUTED_LOOPS),
        flops=row.get(tracking.BACKBONE_FLOPS),
        seconds=row.get("model_seconds"),
        ppl=ppl,
    )


# ---- jobs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalJob:
    """One checkpoint's missing evaluations and where to record them."""

    evaluations: tuple[Evaluation, ...]
    tracking_uri: str
    experiment: str
    artifact_root: str
    threads: int = 1
    batch_size: int = 8
    device: str = "auto"
    board: str = ""  # the progress board the sweep's driver prints (trainables/progress.py)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        ck = self.evaluations[0].checkpoint
        return f"eval {ck.stage}-{ck.stage_key}"


def evaluation_jobs(
    evaluations: list[Evaluation],
    grid: EvalGrid,
    *,
    tracking_uri: str,
    experiment: str,
    artifact_root: str,
    board: str = "",
) -> list[EvalJob]:
    by_checkpoint: dict[str, list[Evaluation]] = {}
    for ev in evaluations:
        by_checkpoint.setdefault(ev.checkpoint.stage_key, []).append(ev)
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    return [
        EvalJob(
            tuple(evs),
            tracking_uri,
            experiment,
            str(artifact_root),
            max(1, round(grid.cpus)),
            grid.batch_size,
            grid.device,
            board,
            env,
        )
        for evs in by_checkpoint.values()
    ]


def run_evaluation_job(job: EvalJob) -> dict[str, int]:
    """Evaluate one checkpoint: its model loaded once; per policy one lm-eval call over the
    tasks still missing (a run another process finished meanwhile is left alone); one run
    per task, FAILED with the error when its evaluation raises, the others go on."""
    os.environ.update(job.env)  # before lm-eval and datasets read them at import
    from looplab.checkpoint import load_model
    from looplab.evaluation.harness import LoopLabLM, evaluate_tasks, make_task_manager
    from trainables.progress import Reporter
    from trainables.storage import local_checkpoint

    threads.use(within=job.threads)  # the free cores of the job's CPU share (looplab/threads.py)
    mc = tracking.client(job.tracking_uri)
    experiment_id = tracking.ensure_experiment(mc, job.experiment, job.artifact_root)
    progress = Reporter(job.board, job.label, min_seconds=0.0)
    sha = tracking.git_sha()
    model = load_model(local_checkpoint(job.evaluations[0].checkpoint.path))
    counts: Counter = Counter()
    groups: dict[tuple[str, Any], list[Evaluation]] = {}
    for ev in job.evaluations:
        groups.setdefault((ev.policy, ev.limit), []).append(ev)
    for (policy, limit), evaluations in groups.items():
        if progress.stop_requested():  # the sweep was stopped (Ctrl-C): no new evaluation starts
            break
        runs: dict[Evaluation, str] = {}
        for ev in evaluations:
            run_id, status = open_eval_run(mc, experiment_id, ev, git=sha)
            if status == "FINISHED":
                counts["reused"] += 1
            else:
                runs[ev] = run_id
        if not runs:
            continue
        try:
            lm = LoopLabLM(checkpoint=model, policy=policy, batch_size=job.batch_size, device=job.device)
            results = evaluate_tasks(
                lm, [ev.task.config() for ev in runs], limit=limit, manager=make_task_manager(), bootstrap_iters=0
            )  # no bootstrap: stderrs are not logged
        except Exception as e:  # noqa: BLE001 - one policy's failure must not cost the checkpoint's other policies
            for ev, run_id in runs.items():
                _fail(mc, run_id, e, progress, ev)
            counts["failed"] += len(runs)
            continue
        for ev, run_id in runs.items():
            try:
                metrics = task_metrics(ev, results)
                tracking.log_metrics(mc, run_id, metrics)
                n = (results.get("n-samples", {}).get(ev.task.name) or {}).get("effective")
                tracking.log_params(mc, run_id, {tracking.EVAL_PARAM + "n_samples": str(n)})
                tracking.close_run(mc, run_id, ok=True)
            except Exception as e:  # noqa: BLE001 - as above, per task
                _fail(mc, run_id, e, progress, ev)
                counts["failed"] += 1
                continue
            counts["ran"] += 1
            progress.post("eval", policy=policy, task=ev.task.name, summary=_headline(ev, metrics))
    return dict(counts)


def _headline(ev: Evaluation, metrics: dict[str, float]) -> dict[str, float]:
    policy = ExitPolicy.parse(ev.policy)
    names = {
        "accuracy": tracking.lm_eval_quantity(ev.task.name),
        "loops": tracking.lm_eval_quantity(ev.task.name, tracking.LM_EVAL_LOOPS),
        "seconds": tracking.lm_eval_quantity(ev.task.name, tracking.LM_EVAL_SECONDS),
    }
    logged = {label: tracking.policy_metric(policy, name) for label, name in names.items()}
    return {label: metrics[name] for label, name in logged.items() if name in metrics}


def _fail(mc, run_id: str, error: BaseException, progress, ev: Evaluation) -> None:
    message = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    mc.set_tag(run_id, tracking.ERROR_TAG, message[:500])
    tracking.close_run(mc, run_id, ok=False)
    progress.post("eval_failed", policy=ev.policy, task=ev.task.name, error=message)


# ---- the driver -----------------------------------------------------------------------------
@dataclass
class EvalSummary:
    planned: int
    checkpoints: int
    jobs: int = 0
    ran: int = 0
    reused: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"evaluations: {self.ran} ran, {self.reused} reused, {self.failed} failed ({self.planned} in the grid "
            f"on {self.checkpoints} checkpoint(s); {self.jobs} job(s), each loading its model once)"
        )


def evaluate(
    grid: EvalGrid,
    checkpoints,
    *,
    tracking_uri: str,
    experiment: str,
    artifact_root: str | Path,
    board: str = "",
    inline: bool = False,
    out=None,
) -> EvalSummary:
    """Evaluate what the store lacks (module docstring). inline: in this process, one job
    after another (tests, and machines without Ray); otherwise one Ray task per job with
    the grid's CPUs and GPUs (Ray must be initialised)."""
    out = out or sys.stderr
    evaluations = grid_evaluations(grid, checkpoints)
    mc = tracking.client(tracking_uri)
    experiment_id = tracking.ensure_experiment(mc, experiment, artifact_root)
    done = EVAL_STEP.finished_keys(mc, experiment_id)
    todo = [ev for ev in evaluations if ev.key not in done]
    jobs = evaluation_jobs(
        todo, grid, tracking_uri=tracking_uri, experiment=experiment, artifact_root=str(artifact_root), board=board
    )
    summary = EvalSummary(
        len(evaluations),
        len({ev.checkpoint.stage_key for ev in evaluations}),
        len(jobs),
        reused=len(evaluations) - len(todo),
    )
    if jobs:
        print(
            f"evaluating {len(todo)} of {len(evaluations)} evaluation(s) ({summary.reused} already in the store) "
            f"in {len(jobs)} job(s) of {grid.cpus:g} CPU" + (f", {grid.gpus:g} GPU" if grid.gpus else ""),
            file=out,
            flush=True,
        )
    for job, result in run_jobs(run_evaluation_job, jobs, cpus=grid.cpus, gpus=grid.gpus, inline=inline):
        if isinstance(result, BaseException):
            summary.failed += len(job.evaluations)
            summary.errors.append(f"{job.label}: {type(result).__name__}: {result}")
            print(f"[{job.label}] failed: {type(result).__name__}: {result}", file=out, flush=True)
            continue
        summary.ran += result.get("ran", 0)
        summary.reused += result.get("reused", 0)
        summary.failed += result.get("failed", 0)
    return summary


def describe_grid(grid: EvalGrid, checkpoints) -> list[str]:
    """The dry run's lines: tasks, policies per checkpoint, and the count."""
    lines = [
        "",
        "evaluation (after training; one job per checkpoint, each loading its model once, "
        f"{grid.cpus:g} CPU" + (f" {grid.gpus:g} GPU" if grid.gpus else "") + " each):",
        "  tasks: "
        + "; ".join(t.describe() for t in grid.tasks)
        + (f"; limit {grid.limit} documents per task" if grid.limit else ""),
    ]
    total, seen = 0, set()
    for ck in checkpoints:
        if ck.stage_key in seen or not grid.evaluates(ck.stage):
            continue
        seen.add(ck.stage_key)
        policies = grid.policies_for(ck.stage, ck.n_loops)
        total += len(policies) * len(grid.tasks)
        lines.append(f"  {ck.stage}:{ck.stage_key}: {' '.join(p.spec for p in policies) or '(none applies)'}")
    lines.append(f"  {total} evaluation(s); those the store holds FINISHED (same eval_key) are reused, not rerun")
    return lines
