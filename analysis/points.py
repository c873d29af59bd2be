"""The evaluation-points table: one row per (trial, stage, evaluation point).

An evaluation point is one way of running a trained model: policy `full` (val_*:
all R loops, readout at R), `forced` at depth r (forced_d<r>_*), an exit policy
`dense` / `skip` at threshold q (<mode>_q<q>_*), or a zero-shot rule of the zoo
(policy skip-entropy, dense-kl, skip-stable, ...: <mode>_<rule><t>_*, its threshold
in q). Each stage run of a trial evaluates its own checkpoint, so a pretrain → stage1 →
chase → stage2 trial has points for every stage (the paper's threshold tables show
Stage 1 and Stage 2 side by side); `is_final_stage` marks the trial's own result. A
trial without stage runs (logged by hand) is its own single stage.

Downstream evaluations (runs of level eval, trainables/evaluation.py) carry their
checkpoint's stage_key: their metrics join the points of every stage run with that key
in their experiment (a stage reused by several trials, and so evaluated once, shows in
each), on the row of their policy. A stage's pre-training forced depths, say, exist
only downstream: their rows have lm-eval columns and no validation ones.

Columns:
  identity   experiment, trial_run_id, run_id (the stage run read), trial_key (the
             trial's final stage_key), trial_config_hash (groups seeds of a
             configuration), config_hash (the stage's), stage_key, seed, stage,
             is_final_stage, pipeline (e.g. pretrain+stage1+chase+stage2), method
             (fixed | Ouro | CHASE, the tag the platform records),
             model (N⊗R), label (method, N⊗R and the searched values), status
  point      policy, q, depth, point (e.g. "skip q=0.4"); a zoo rule's point has
             policy skip-entropy, dense-kl, skip-stable, ... and its threshold τ
             (or window k) in q, point e.g. "skip entropy<2.5"
  quantities executed_loops, mean_exit_step, accuracy, ppl, loss,
             backbone_flops_per_token (last values), accuracy_best, ppl_best,
             loss_best (best over the stage's evaluations), lm_eval.<task> and
             lm_eval_avg when lm-eval scores were logged, with the downstream
             families lm_eval_loops.<task>, lm_eval_flops.<task>,
             lm_eval_seconds.<task>, lm_eval_ppl.<task> and the suite means
             lm_eval_loops, lm_eval_flops, lm_eval_seconds (downstream executed
             loops: not the validation set's executed_loops)
  compute    stage_seconds (this stage's training), pipeline_seconds (all stages up
             to and including this one: what it cost to produce the model)
  params     every params.<name> of the trial run (the final stage's config)

The `full` point is the fixed-depth baseline's depth R (logged once, as val_*); its
executed loops are R (params.model.n_loops) by definition.
"""

from __future__ import annotations

import polars as pl

from analysis import names
from analysis.axis import searched_label
from analysis.errors import AnalysisError
from analysis.load import RunSet
from analysis.names import PARAM
from looplab import tracking
from looplab.policy import FORCED, FULL, GATE, ZOO_RULES, ExitPolicy
from looplab.stages import STAGE_NAMES

QUANTITIES = tracking.EVAL_QUANTITIES
BEST_QUANTITIES = tuple(q for q in QUANTITIES if names.higher_is_better(q) is not None)
BEST_COLUMNS = tuple(names.best_of(q) for q in BEST_QUANTITIES)
POINT_SCHEMA = {
    "key": pl.String,
    "policy": pl.String,
    "q": pl.Float64,
    "depth": pl.Int64,
    "point": pl.String,
    "quantity": pl.String,
}


def evaluation_points(runs: RunSet, *, statuses=("FINISHED",)) -> pl.DataFrame:
    """The evaluation-points table (see the module docstring). Trials whose status is
    not in `statuses` (None: all) are left out, and runs.notes says how many.

    Raises AnalysisError when no run carries an evaluation metric."""
    trials = _trials(runs, statuses)
    sources = _sources(runs.runs, trials)
    metrics = _source_metrics(runs, sources)
    parsed = _parse(metrics)
    if parsed.is_empty():
        found = sorted(set(runs.metrics["key"].to_list()))
        shown = ", ".join(found[:8]) + (" ..." if len(found) > 8 else "") if found else "none"
        raise AnalysisError(
            f"no evaluation metrics (val_*, forced_d<r>_*, <mode>_q<q>_*, lm_eval.*) in "
            f"{_experiments(runs)}; metrics found: {shown}"
        )
    wide = _pivot(parsed)
    table = wide.join(sources, on="run_id", how="left").join(_trial_identity(trials), on="trial_run_id", how="left")
    table = _label(_full_point_compute(table))
    table = _lm_eval_average(table)
    table = _timing(table, runs.metrics, sources)
    table = _training_end(table, runs.metrics)
    return _order(table)


def _experiments(runs: RunSet) -> str:
    return ", ".join(repr(e) for e in runs.experiments.values())


def _trials(runs: RunSet, statuses) -> pl.DataFrame:
    table = runs.runs
    levels = set(table["level"].drop_nulls().to_list())
    if tracking.TRIAL in levels:
        trials = table.filter(pl.col("level") == tracking.TRIAL)
    elif not levels:  # runs logged without the platform's tree: each run is a trial
        trials = table
        runs.notes.append("no run carries a `level` tag: every run is read as a trial")
    else:
        raise AnalysisError(
            f"no trial runs (tag level=trial) in {_experiments(runs)}; levels found: {', '.join(sorted(levels))}"
        )
    if statuses is not None:
        kept = trials.filter(pl.col("status").is_in(list(statuses)))
        if kept.height < trials.height:
            other = trials.filter(~pl.col("status").is_in(list(statuses)))["status"].value_counts(sort=True)
            said = ", ".join(f"{n} {s}" for s, n in other.iter_rows())
            if kept.is_empty():
                raise AnalysisError(
                    f"no {' or '.join(statuses)} trial runs in {_experiments(runs)} ({said}); "
                    "--all-statuses reads them anyway"
                )
            runs.notes.append(f"left out {trials.height - kept.height} unfinished trials ({said})")
        trials = kept
    # One run per (experiment, stage_key): the platform reuses runs by their final stage's
    # key, so a duplicate comes from a race or a hand-made run; the newest wins.
    if trials[tracking.STAGE_KEY].drop_nulls().len():
        before = trials.height
        trials = trials.sort("start_time").unique(
            ["experiment", pl.coalesce(tracking.STAGE_KEY, "run_id")], keep="last", maintain_order=True
        )
        if trials.height < before:
            runs.notes.append(f"{before - trials.height} duplicate trial runs (same stage_key): the newest kept")
    return trials


def _sources(table: pl.DataFrame, trials: pl.DataFrame) -> pl.DataFrame:
    """The run each point is read from: the trials' stage runs, or the trial itself
    when it has none. Columns: run_id, trial_run_id, stage, config_hash, stage_key,
    reused_from, pipeline, method, is_final_stage."""
    trial_ids = trials["run_id"].implode()
    stage_rows = table.filter((pl.col("level") == tracking.STAGE) & pl.col("parent_run_id").is_in(trial_ids))
    stage_rows = stage_rows.select(
        "run_id",
        pl.col("parent_run_id").alias("trial_run_id"),
        "stage",
        tracking.CONFIG_HASH,
        tracking.STAGE_KEY,
        tracking.REUSED_FROM,
        "method",
    )
    lone = trials.filter(~pl.col("run_id").is_in(stage_rows["trial_run_id"].implode())).select(
        "run_id",
        pl.col("run_id").alias("trial_run_id"),
        "stage",
        tracking.CONFIG_HASH,
        tracking.STAGE_KEY,
        tracking.REUSED_FROM,
        "method",
    )
    sources = pl.concat([stage_rows, lone]).with_columns(
        pl.col("stage")
        .replace_strict({s: i for i, s in enumerate(STAGE_NAMES)}, default=len(STAGE_NAMES), return_dtype=pl.Int64)
        .alias("stage_order")
    )
    pipelines = (
        sources.sort("stage_order")
        .group_by("trial_run_id", maintain_order=True)
        .agg(pl.col("stage").fill_null("?").str.join("+").alias("pipeline"))
    )
    final = trials.select(pl.col("run_id").alias("trial_run_id"), pl.col("stage").alias("final_stage"))
    sources = sources.join(pipelines, on="trial_run_id", how="left").join(final, on="trial_run_id", how="left")
    return sources.with_columns(
        pl.coalesce("method", _method_of_pipeline(sources["pipeline"])).alias("method"),
        (pl.col("stage").eq_missing(pl.col("final_stage"))).alias("is_final_stage"),
    ).drop("final_stage")


def _method_of_pipeline(pipelines: pl.Series) -> pl.Series:
    """The method label the platform records on every stage run (tag `method`); for runs
    logged without it, the stage registry's rule applied to the trial's pipeline."""
    from looplab.stages import method_of

    known = {p: method_of([s for s in p.split("+") if s in STAGE_NAMES]) for p in pipelines.unique().drop_nulls()}
    return pipelines.replace_strict(known, default=None, return_dtype=pl.String)


def _source_metrics(runs: RunSet, sources: pl.DataFrame) -> pl.DataFrame:
    """Metric summaries of the source runs, with the downstream evaluations of their
    stage keys. A reused stage run logged only its original's final values, so its
    best/min/max come from that original when it was loaded (the same training, with its
    whole history)."""
    metrics = runs.metrics.join(sources.select("run_id", tracking.REUSED_FROM), on="run_id", how="inner")
    original = runs.metrics.select(
        pl.col("run_id").alias(tracking.REUSED_FROM), "key", pl.col("best").alias("orig_best")
    )
    own = (
        metrics.join(original, on=[tracking.REUSED_FROM, "key"], how="left")
        .with_columns(pl.coalesce("orig_best", "best").alias("best"))
        .select("run_id", "key", "last", "best")
    )
    downstream = _evaluation_metrics(runs, sources)
    if downstream is None:
        return own
    # An evaluation run's value wins over the same name logged on the stage run itself.
    return pl.concat([own.join(downstream.select("run_id", "key"), on=["run_id", "key"], how="anti"), downstream])


def _evaluation_metrics(runs: RunSet, sources: pl.DataFrame) -> pl.DataFrame | None:
    """The FINISHED evaluation runs' metrics as metrics of every source run with their
    stage key in their experiment. When evaluations of one stage key give the same
    metric (the same task and policy under other settings, e.g. another limit), the one
    that finished last wins, and runs.notes says so."""
    table = runs.runs
    evals = table.filter((pl.col("level") == tracking.EVAL) & (pl.col("status") == "FINISHED"))
    if evals.is_empty():
        return None
    values = runs.metrics.join(
        evals.select("run_id", "experiment", tracking.STAGE_KEY, "end_time"), on="run_id", how="inner"
    )
    newest = values.sort("end_time", nulls_last=False).unique(["experiment", tracking.STAGE_KEY, "key"], keep="last")
    if newest.height < values.height:
        runs.notes.append(
            f"{values.height - newest.height} downstream metric value(s) superseded by a newer "
            "evaluation of the same stage, task and policy under other settings"
        )
    targets = sources.select("run_id", tracking.STAGE_KEY).join(
        table.select("run_id", "experiment"), on="run_id", how="left"
    )
    return (
        newest.select("experiment", tracking.STAGE_KEY, "key", "last", "best")
        .join(targets, on=["experiment", tracking.STAGE_KEY], how="inner")
        .select("run_id", "key", "last", "best")
    )


def _parse(metrics: pl.DataFrame) -> pl.DataFrame:
    """Metric names → (policy, q, depth, point, quantity): each distinct name parsed once
    by the contract (tracking.parse_metric), its point named by its ExitPolicy. A zoo
    rule's point is its own policy (its kind: skip-entropy, dense-kl, ..., so each is
    its own series) with its threshold τ or window k in q."""
    named = [point for point in map(evaluation_point, metrics["key"].unique().to_list()) if point is not None]
    points = pl.DataFrame(named, schema=POINT_SCHEMA)
    # In the metrics' order (as a filter would keep it), so the rows start in the order they always had.
    return metrics.join(points, on="key", how="inner", maintain_order="left").select(
        "run_id", "last", "best", "policy", "q", "depth", "point", "quantity"
    )


def evaluation_point(name: str) -> dict | None:
    """A metric name's evaluation point as a row of POINT_SCHEMA, or None when the name
    is no evaluation metric of a policy this build knows."""
    parsed = tracking.parse_metric(name)
    if parsed is None:
        return None
    policy, quantity = parsed
    return {
        "key": name,
        "policy": policy.kind,
        "q": threshold_of(policy),
        "depth": policy.depth,
        "point": point_name(policy),
        "quantity": quantity,
    }


def threshold_of(policy: ExitPolicy) -> float | None:
    """The q column: the gate's q, or a zoo rule's τ or window k; None for full and forced."""
    if policy.rule == GATE:
        return policy.q
    if policy.rule in ZOO_RULES:
        assert policy.threshold is not None  # ExitPolicy sets it for every zoo rule
        return float(policy.threshold)
    return None


def point_name(policy: ExitPolicy) -> str:
    """The point column: the policy's label ('skip q=0.4', 'forced d=2', 'skip entropy<2.5'),
    but the full-depth point is its kind, 'full', as the tables have always named it."""
    return policy.kind if policy.execution == FULL else policy.label


def _pivot(parsed: pl.DataFrame) -> pl.DataFrame:
    index = ["run_id", "policy", "q", "depth"]  # `point` (the policy's name) is a function of these: it rides along
    # One categorical key per (run, point): pivots on categoricals are several times faster.
    keyed = parsed.with_columns(
        pl.concat_str(pl.col(index).cast(pl.String).fill_null("-"), separator="|").cast(pl.Categorical).alias("_point"),
        pl.col("quantity").cast(pl.Categorical),
    )
    last = keyed.pivot(on="quantity", index="_point", values="last", aggregate_function="first")
    with_best = keyed.filter(pl.col("quantity").cast(pl.String).is_in(BEST_QUANTITIES))
    best = with_best.with_columns((pl.col("quantity").cast(pl.String) + names.BEST_SUFFIX).cast(pl.Categorical)).pivot(
        on="quantity", index="_point", values="best", aggregate_function="first"
    )
    points = keyed.select("_point", *index, "point").unique("_point")
    wide = points.join(last, on="_point", how="left")
    if best.width > 1:
        wide = wide.join(best, on="_point", how="left")
    for q in (*QUANTITIES, *BEST_COLUMNS):  # a stable schema
        if q not in wide.columns:
            wide = wide.with_columns(pl.lit(None, pl.Float64).alias(q))
    return wide.drop("_point")


def _trial_identity(trials: pl.DataFrame) -> pl.DataFrame:
    params = [c for c in trials.columns if c.startswith(PARAM)]
    cols = ["run_id", "experiment", tracking.STAGE_KEY, tracking.CONFIG_HASH, "status", "preset", *params]
    t = trials.select(cols).rename(
        {"run_id": "trial_run_id", tracking.CONFIG_HASH: "trial_config_hash", tracking.STAGE_KEY: "trial_key"}
    )
    # _searched: "β=0.25 hole probability=0.5", the sampled values (seed aside) that _label shows,
    # named and written as the report writes an axis (analysis/axis.py)
    n_layers, n_loops = _param(t, "model.n_layers"), _param(t, "model.n_loops")
    search = PARAM + tracking.SEARCH_PARAM
    # (N and R are the label's N⊗R already.)
    searched = [c[len(search) :] for c in params if c.startswith(search)]
    return t.with_columns(
        _param(t, "train.seed").cast(pl.Int64, strict=False).alias("seed"),
        pl.concat_str(n_layers.cast(pl.String), pl.lit("⊗"), n_loops.cast(pl.String)).alias("model"),
        n_loops.cast(pl.Int64, strict=False).alias("n_loops"),
        searched_label([p for p in searched if p not in ("seed", "n_layers", "n_loops")]).alias("_searched"),
    )


def _param(t: pl.DataFrame, name: str) -> pl.Expr:
    return pl.col(PARAM + name) if PARAM + name in t.columns else pl.lit(None)


def _full_point_compute(table: pl.DataFrame) -> pl.DataFrame:
    """The full point runs all R loops: executed loops and exit step R where a run
    logged only its quality (lm-eval scores, runs logged by hand)."""
    full = pl.col("policy") == FULL
    r = pl.col("n_loops").cast(pl.Float64)
    return table.with_columns(
        *(
            pl.when(full).then(pl.coalesce(q, r)).otherwise(q).alias(q)
            for q in (tracking.EXECUTED_LOOPS, tracking.MEAN_EXIT_STEP)
        )
    )


def _label(table: pl.DataFrame) -> pl.DataFrame:
    """What a reader calls the configuration: method, N⊗R and the searched values."""
    return table.with_columns(
        pl.concat_str(pl.col("method"), pl.col("model"), pl.col("_searched"), separator=" ", ignore_nulls=True)
        .str.strip_chars()
        .alias("label")
    ).drop("_searched")


def _lm_eval_average(table: pl.DataFrame) -> pl.DataFrame:
    """lm_eval_avg: the mean over the lm-eval tasks present anywhere in the table (the
    paper's Avg. over the tasks its table shows); null where a row lacks one of them.
    The same over the same tasks for the suite means of names.SUITE_MEANS (downstream
    loops, FLOPs, seconds per token): each task weighs equally, as in the Avg."""
    ordered = names.task_columns(table.columns)
    tasks = [c[len(tracking.LM_EVAL) :] for c in ordered]
    out = []
    for name, columns in [
        (tracking.LM_EVAL_AVG, ordered),
        *((family, [f"{family}.{t}" for t in tasks]) for family in names.SUITE_MEANS),
    ]:
        if not columns or any(c not in table.columns for c in columns):
            out.append(pl.lit(None, pl.Float64).alias(name))
            continue
        out.append(
            pl.when(pl.all_horizontal(pl.col(columns).is_not_null())).then(pl.mean_horizontal(columns)).alias(name)
        )
    return table.with_columns(out)


def _timing(table: pl.DataFrame, metrics: pl.DataFrame, sources: pl.DataFrame) -> pl.DataFrame:
    """stage_seconds from the stage run, and their running sum over the trial's stages
    in pipeline order."""
    per_run = (
        metrics.filter(pl.col("key") == tracking.STAGE_SECONDS)
        .select("run_id", pl.col("last").alias(tracking.STAGE_SECONDS))
        .unique("run_id")
    )
    stages = (
        sources.select("run_id", "trial_run_id", "stage_order")
        .join(per_run, on="run_id", how="left")
        .sort("trial_run_id", "stage_order")
        .with_columns(pl.col(tracking.STAGE_SECONDS).cum_sum().over("trial_run_id").alias("pipeline_seconds"))
        .select("run_id", tracking.STAGE_SECONDS, "pipeline_seconds")
    )
    return table.join(stages, on="run_id", how="left")


def _training_end(table: pl.DataFrame, metrics: pl.DataFrame) -> pl.DataFrame:
    """The stage's last training-window values: exit_entropy and expected_exit_step
    (the β diagnostics, gate stages only) and the training loss as train_loss."""
    wanted = {**{k: k for k in names.BETA_DIAGNOSTICS}, tracking.LOSS: names.TRAIN_LOSS}
    found = metrics.filter(pl.col("key").is_in(list(wanted)))
    end = (
        pl.DataFrame(schema={"run_id": pl.String})
        if found.is_empty()
        else (
            found.with_columns(pl.col("key").replace_strict(wanted)).pivot(
                on="key", index="run_id", values="last", aggregate_function="first"
            )
        )
    )
    for column in wanted.values():
        if column not in end.columns:
            end = end.with_columns(pl.lit(None, pl.Float64).alias(column))
    return table.join(end.select("run_id", *wanted.values()), on="run_id", how="left")


def _order(table: pl.DataFrame) -> pl.DataFrame:
    lead = [*names.POINT_NAME, "seed", *QUANTITIES, *BEST_COLUMNS]
    lead += names.task_columns(table.columns)
    lead += [tracking.LM_EVAL_AVG, *names.SUITE_MEANS]
    for family in tracking.LM_EVAL_FAMILIES:
        lead += names.task_columns(table.columns, family)
    lead += [
        *names.BETA_DIAGNOSTICS,
        names.TRAIN_LOSS,
        tracking.STAGE_SECONDS,
        "pipeline_seconds",
        "trial_config_hash",
        tracking.CONFIG_HASH,
        "trial_key",
        tracking.STAGE_KEY,
        "trial_run_id",
        "run_id",
        "status",
        "preset",
        "n_loops",
    ]
    rest = sorted(c for c in table.columns if c not in lead and c not in (tracking.REUSED_FROM, "stage_order"))
    policy_rank = pl.col("policy").replace_strict(
        {p: i for i, p in enumerate(names.POLICY_ORDER)}, default=9, return_dtype=pl.Int64
    )
    return (
        table.with_columns(policy_rank.alias("_policy_rank"))
        .sort("experiment", "method", "label", "seed", "stage_order", "_policy_rank", "q", "depth", nulls_last=True)
        .select(lead + rest)
    )


def full_as_forced_depth(rows: pl.DataFrame) -> pl.DataFrame:
    """Full depth is forced depth R (the same execution, logged once as val_*): where a
    stage has forced depths, its full point joins them as d=R, so the fixed-depth
    series spans 1..R."""
    key = [c for c in ("experiment", "trial_config_hash", "stage") if c in rows.columns]
    forced = rows.filter(pl.col("policy") == FORCED).select(key).unique()
    joins = (pl.col("policy") == FULL) & pl.struct(key).is_in(forced.select(pl.struct(key)).to_series().implode())
    depth = pl.col("n_loops").cast(pl.Int64)
    labels = {r: ExitPolicy.forced(r).label for r in rows.filter(joins).select(depth)["n_loops"].drop_nulls().unique()}
    return rows.with_columns(
        pl.when(joins).then(pl.lit(FORCED)).otherwise("policy").alias("policy"),
        pl.when(joins).then(depth).otherwise("depth").alias("depth"),
        pl.when(joins)
        .then(depth.replace_strict(labels, default=None, return_dtype=pl.String))
        .otherwise("point")
        .alias("point"),
    )


def shared_once(rows: pl.DataFrame) -> pl.DataFrame:
    """Rows (points or seed-aggregated points) of one stage configuration once per point:
    a stage several trials share (the pre-training or Stage-1 both arms continue) is one
    model, though each trial configuration carries a copy. A row that stands for several
    trial configurations is labelled by its method and N⊗R alone (the trials' searched
    values, e.g. arm=chase, do not describe it)."""
    key = [c for c in ("experiment", tracking.CONFIG_HASH, "stage", "policy", "q", "depth") if c in rows.columns]
    if "label" not in rows.columns or "trial_config_hash" not in rows.columns:
        return rows.unique(key, keep="first", maintain_order=True)
    shared = pl.col("trial_config_hash").n_unique().over(key) > 1
    plain = pl.concat_str([pl.col("method"), pl.col("model")], separator=" ", ignore_nulls=True)
    return rows.with_columns(pl.when(shared).then(plain).otherwise(pl.col("label")).alias("label")).unique(
        key, keep="first", maintain_order=True
    )
