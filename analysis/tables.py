"""The paper's tables from seed-aggregated evaluation points, as Markdown and CSV.

Input: aggregate_seeds(evaluation_points(...), ...) with the default grouping (one
row per configuration × stage × evaluation point; a value v has v_std and n_seeds).
Each builder returns a Table, or None when the sweep has nothing of that shape (and
says why in `skipped`). CSV files hold raw numbers (fractions for accuracies);
Markdown shows what the paper shows: accuracies and lm-eval scores in percent, two
decimals, "mean ± std" when more than one seed was pooled.

  iso_table        Table 3 / Tables 1–2: Arch, Model (N⊗R), Params / FLOPs (N× / NR×,
                   layers and effective depth), PPL, Acc, the lm-eval tasks, Avg.
                   Full-depth evaluation of each pre-trained model (or of the final
                   stage when no pretrain stage was logged).
  exit_gate_table  Table 4: Model, Exit, q, Exec., PPL, the tasks, Avg.: each model
                   without a gate at full depth, and each gated method's final stage
                   at the q with the best downstream average, per execution (skip among
                   the q that run fewer than R loops, as the paper picks CHASE's q).
  table4           Table 4 as the paper lays it out: every block and row in its order,
                   rows without a run shown as missing, a hybrid's skip rows labelled an
                   extension (the gated rows: exit_gate_table's picks).
  threshold_table  App. F: Stage, Mode, q, Iter (mean exit step: the paper's "average
                   exit step selected by the gate"), Exec. (executed loops), PPL, Acc,
                   tasks, Avg., for every gate stage and exit policy; with downstream
                   evaluations also Exec. on the tasks.
  fixed_loop_table App. E: Forced loops r = 1..R, PPL, Acc, tasks, Avg. Forced depths
                   are logged by the gate stages' validation, and by downstream
                   evaluations of any stage (the pre-trained model's App. E).

A stage several trials share (pre-training, Stage-1 of both arms) appears once per point
in the stage tables (analysis.points.shared_once).
  skip_table       Fig. 2 as a table: per q, executed loops under skip, the ideal
                   speedup R / loops, perplexity and accuracy of skip against full
                   compute (all R loops) and dense at the same q, Δ in % / points.
  beta_table       App. D: β, exit entropy and expected exit step at the end of
                   training, validation perplexity and accuracy.
"""

from __future__ import annotations

import polars as pl

from analysis import names
from analysis.gate_tables import HYBRID_SKIP, REPRESENTATIVE_Q, exit_gate_table, table4
from analysis.points import shared_once
from analysis.table_parts import (
    NUM,
    PCT,
    Table,
    cell,
    column_or_null,
    data_columns,
    has_values,
    model_name,
    quality_columns,
    stage_rank,
    with_model_column,
)
from looplab import tracking
from looplab.policy import DENSE, FORCED, FULL, SKIP
from looplab.stages import DEFAULT_STAGE

# What moved to gate_tables.py and table_parts.py stays importable from here.
__all__ = ["HYBRID_SKIP", "NUM", "PCT", "REPRESENTATIVE_Q", "Table", "exit_gate_table", "table4"]


def iso_table(agg: pl.DataFrame) -> Table | None:
    full = agg.filter(pl.col("policy") == FULL)
    if full.is_empty():
        return None
    pre = full.filter(pl.col("stage") == DEFAULT_STAGE)
    rows = (pre if pre.height else full.filter(pl.col("is_final_stage"))).unique(
        ["experiment", tracking.CONFIG_HASH], keep="first", maintain_order=True
    )
    rows = rows.with_columns(
        column_or_null(rows, "params.model.n_layers").alias("n_layers"),
        column_or_null(rows, "params.model.n_loops").alias("n_loops"),
        column_or_null(rows, "params.model.arch").alias("arch"),
    )
    rows = rows.sort([pl.col("arch"), pl.col("n_layers") * pl.col("n_loops"), "n_layers"], nulls_last=True)
    quality = quality_columns(agg, rows)
    header = ["Arch.", "Model", "Params / FLOPs", *(h for h, _, _ in quality), "n"]
    cells = []
    for r in rows.iter_rows(named=True):
        n, R = r["n_layers"], r["n_loops"]
        ratio = f"{n}× / {n * R}×" if n is not None and R is not None else "?"
        cells.append(
            [
                str(r["arch"] or ""),
                model_name(n, R),
                ratio,
                *(cell(r, c, k) for _, c, k in quality),
                str(r["n_seeds"]),
            ]
        )
    data = data_columns(
        rows.with_columns((pl.col("n_layers") * pl.col("n_loops")).alias("effective_depth")),
        ["experiment", "arch", "n_layers", "n_loops", "effective_depth", "stage"],
        quality,
    )
    return Table(
        "iso_table",
        "iso-parameter / iso-FLOPs",
        "Each model at full depth (all R loops). Params / FLOPs: "
        "parameterised layers N and effective depth N·R, relative to one layer (Table 3).",
        data,
        header,
        cells,
    )


def threshold_table(agg: pl.DataFrame) -> Table | None:
    rows = agg.filter(pl.col("policy").is_in([DENSE, SKIP]))
    if rows.is_empty():
        return None
    rows = shared_once(rows).sort(["label", stage_rank(), "policy", "q"], descending=[False, False, False, True])
    quality = quality_columns(agg, rows)
    downstream = has_values(rows, tracking.LM_EVAL_LOOPS)
    header = [
        "Stage",
        "Mode",
        "q",
        "Iter",
        "Exec.",
        *(["Exec. (tasks)"] if downstream else []),
        *(h for h, _, _ in quality),
        "n",
    ]
    cells = [
        [
            r["stage"] or "",
            r["policy"],
            f"{r['q']:.2f}",
            cell(r, tracking.MEAN_EXIT_STEP),
            cell(r, tracking.EXECUTED_LOOPS),
            *([cell(r, tracking.LM_EVAL_LOOPS)] if downstream else []),
            *(cell(r, c, k) for _, c, k in quality),
            str(r["n_seeds"]),
        ]
        for r in rows.iter_rows(named=True)
    ]
    header, cells = with_model_column(rows, header, cells)
    data = data_columns(
        rows,
        [
            "experiment",
            "label",
            "stage",
            "policy",
            "q",
            *names.with_std(tracking.MEAN_EXIT_STEP, tracking.EXECUTED_LOOPS),
            *(names.with_std(tracking.LM_EVAL_LOOPS) if downstream else []),
        ],
        quality,
    )
    return Table(
        "threshold_sweep",
        "Exit-gate threshold sweep",
        "Iter: mean exit step the gate selects; Exec.: loops executed per token (R under dense, fewer "
        "under skip) (App. F).",
        data,
        header,
        cells,
    )


def fixed_loop_table(agg: pl.DataFrame) -> Table | None:
    """Forced depths 1..R-1 and, as depth R, full depth (the same execution, logged once)."""
    forced = agg.filter(pl.col("policy") == FORCED)
    if forced.is_empty():
        return None
    key = [c for c in ("experiment", "trial_config_hash", "stage") if c in agg.columns]
    full = agg.filter(pl.col("policy") == FULL).join(forced.select(key).unique(), on=key, how="semi")
    rows = pl.concat(
        [forced, full.with_columns(pl.col("n_loops").cast(forced["depth"].dtype).alias("depth"))],
        how="diagonal_relaxed",
    )
    rows = shared_once(rows).sort(["label", stage_rank(), "depth"])
    quality = quality_columns(agg, rows)
    header = ["Stage", "Forced loops", *(h for h, _, _ in quality), "n"]
    cells = [
        [r["stage"] or "", str(r["depth"]), *(cell(r, c, k) for _, c, k in quality), str(r["n_seeds"])]
        for r in rows.iter_rows(named=True)
    ]
    header, cells = with_model_column(rows, header, cells)
    data = data_columns(rows, ["experiment", "label", "stage", "depth"], quality)
    return Table(
        "fixed_loop",
        "Fixed-loop inference ablation",
        "Every token forced to stop at depth r (App. E); depth R is full depth. Validation columns from each "
        "gate stage's evaluation, task columns from downstream evaluations (a pre-trained model's too).",
        data,
        header,
        cells,
    )


SKIP_HEADER = [
    "q",
    "Exec.",
    "Ideal speedup",
    "PPL full",
    "PPL dense",
    "PPL skip",
    "ΔPPL vs full (%)",
    "Acc. full (%)",
    "Acc. skip (%)",
    "ΔAcc. (pts)",
    "n",
]
# The same configuration's full and dense points beside each skip row, by column.
PPL_FULL, PPL_DENSE = names.at_point(tracking.PPL, FULL), names.at_point(tracking.PPL, DENSE)
ACCURACY_FULL = names.at_point(tracking.ACCURACY, FULL)
ACCURACY_DENSE = names.at_point(tracking.ACCURACY, DENSE)


def skip_table(agg: pl.DataFrame) -> Table | None:
    """Fig. 2 as a table (module docstring); None when no final stage ran skip."""
    final = agg.filter(pl.col("is_final_stage"))
    skip = final.filter(pl.col("policy") == SKIP)
    if skip.is_empty():
        return None
    rows = _skip_rows(final, skip)
    cells = [_skip_cells(r) for r in rows.iter_rows(named=True)]
    header, cells = with_model_column(rows, list(SKIP_HEADER), cells)
    return Table(
        names.SKIP_VS_FULL,
        "Skip against full compute",
        "Final stage under skip execution at each q, against all R loops (full) and the same gate without "
        "skipping (dense). Ideal speedup: R / executed loops (Fig. 2).",
        _skip_data(rows),
        header,
        cells,
    )


def _skip_rows(final: pl.DataFrame, skip: pl.DataFrame) -> pl.DataFrame:
    """Each skip row with its configuration's full and dense (same q) points joined beside
    it, the ideal speedup R / loops and the changes from full compute."""
    ppl, accuracy, loops = tracking.PPL, tracking.ACCURACY, tracking.EXECUTED_LOOPS
    key = ["experiment", "trial_config_hash"]
    full = final.filter(pl.col("policy") == FULL).select(
        *key, pl.col(ppl).alias(PPL_FULL), pl.col(accuracy).alias(ACCURACY_FULL)
    )
    dense = final.filter(pl.col("policy") == DENSE).select(
        *key, "q", pl.col(ppl).alias(PPL_DENSE), pl.col(accuracy).alias(ACCURACY_DENSE)
    )
    return (
        skip.join(full, on=key, how="left")
        .join(dense, on=[*key, "q"], how="left")
        .with_columns(
            (pl.col("n_loops").cast(pl.Float64) / pl.col(loops)).alias(tracking.LOOP_BOUND),
            ((pl.col(ppl) / pl.col(PPL_FULL) - 1.0) * 100.0).alias("delta_ppl_pct"),
            ((pl.col(accuracy) - pl.col(ACCURACY_FULL)) * 100.0).alias("delta_accuracy_pts"),
        )
        .sort(["label", "q"], descending=[False, True])
    )


def _number(v, fmt: str = "{:.2f}") -> str:
    """A plain number in fmt, empty when missing (no ± std: the joined points carry none)."""
    return "" if v is None else fmt.format(v)


def _skip_cells(r: dict) -> list[str]:
    """One displayed row of the skip table, in SKIP_HEADER's order."""
    return [
        f"{r['q']:.2f}",
        cell(r, tracking.EXECUTED_LOOPS),
        _number(r[tracking.LOOP_BOUND], "{:.2f}×"),
        _number(r[PPL_FULL]),
        _number(r[PPL_DENSE]),
        cell(r, tracking.PPL),
        _number(r["delta_ppl_pct"], "{:+.1f}"),
        _number(None if r[ACCURACY_FULL] is None else 100 * r[ACCURACY_FULL]),
        cell(r, tracking.ACCURACY, PCT),
        _number(r["delta_accuracy_pts"], "{:+.2f}"),
        str(r["n_seeds"]),
    ]


def _skip_data(rows: pl.DataFrame) -> pl.DataFrame:
    """skip_vs_full.csv: the raw numbers behind the displayed cells."""
    ppl, accuracy, loops = tracking.PPL, tracking.ACCURACY, tracking.EXECUTED_LOOPS
    columns = [
        "experiment",
        "label",
        "stage",
        "q",
        loops,
        names.std_of(loops),
        tracking.LOOP_BOUND,
        PPL_FULL,
        PPL_DENSE,
        ppl,
        names.std_of(ppl),
        "delta_ppl_pct",
        ACCURACY_FULL,
        ACCURACY_DENSE,
        accuracy,
        names.std_of(accuracy),
        "delta_accuracy_pts",
        "n_seeds",
        "trial_config_hash",
    ]
    return rows.select([c for c in columns if c in rows.columns])


def beta_table(agg: pl.DataFrame) -> Table | None:
    rows = agg.filter(pl.col("is_final_stage") & (pl.col("policy") == FULL))
    if tracking.EXIT_ENTROPY not in rows.columns or rows[tracking.EXIT_ENTROPY].is_null().all():
        return None
    beta = next((c for c in ("params.exit.beta", "params.beta") if c in rows.columns), None)
    rows = rows.with_columns((pl.col(beta) if beta else pl.lit(None)).cast(pl.Float64).alias("beta")).sort(
        ["beta", "label"], nulls_last=True
    )
    text = "params.task.kind" not in rows.columns or (rows["params.task.kind"] == "text").any()
    header = ["β", "Exit entropy", "Expected exit step", "Val PPL" if text else "Val loss", "Val acc. (%)", "n"]
    quality = "ppl" if text else "loss"
    cells = [
        [
            "" if r["beta"] is None else f"{r['beta']:g}",
            cell(r, tracking.EXIT_ENTROPY),
            cell(r, tracking.EXPECTED_EXIT_STEP),
            cell(r, quality),
            cell(r, "accuracy", PCT),
            str(r["n_seeds"]),
        ]
        for r in rows.iter_rows(named=True)
    ]
    header, cells = with_model_column(rows, header, cells)
    data = rows.select(
        [
            c
            for c in [
                "experiment",
                "label",
                "stage",
                "beta",
                *names.with_std(tracking.EXIT_ENTROPY, tracking.EXPECTED_EXIT_STEP, tracking.PPL),
                "loss",
                "accuracy",
                "accuracy_std",
                "n_seeds",
                "trial_config_hash",
            ]
            if c in rows.columns
        ]
    )
    return Table(
        "beta_ablation",
        "Entropy coefficient β",
        "Exit entropy and expected exit step at the end of the final stage's training (max entropy log R), "
        "with the full-depth validation metrics (App. D).",
        data,
        header,
        cells,
    )


BUILDERS = {
    "iso_table": iso_table,
    "exit_gate": exit_gate_table,
    "table4": table4,
    "threshold_sweep": threshold_table,
    "fixed_loop": fixed_loop_table,
    names.SKIP_VS_FULL: skip_table,
    "beta_ablation": beta_table,
}
WHY_EMPTY = {
    "iso_table": "no full-depth evaluation (val_*)",
    "exit_gate": "no downstream evaluations (lm_eval.*: a sweep with --eval-tasks, or python -m sweeps.evaluate)",
    "table4": "no downstream evaluation of a paper model (the paper-140m/370m presets, lm_eval.*)",
    "threshold_sweep": "no exit-policy metrics (dense_q*/skip_q*)",
    "fixed_loop": "no forced-depth metrics (forced_d*)",
    names.SKIP_VS_FULL: "no skip metrics in the final stage",
    "beta_ablation": "no exit_entropy (no gate stage trained)",
}


def all_tables(agg: pl.DataFrame, representative_q: float | None = REPRESENTATIVE_Q) -> tuple[list[Table], list[str]]:
    """Every table the data supports, and one line per table it does not."""
    built, skipped = [], []
    for name, build in BUILDERS.items():
        table = build(agg, representative_q) if build in (exit_gate_table, table4) else build(agg)
        if table is None:
            skipped.append(f"table {name}: skipped, {WHY_EMPTY[name]}")
        else:
            built.append(table)
    return built, skipped
