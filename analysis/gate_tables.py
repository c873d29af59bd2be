"""Table 4 (downstream evaluation with exit gates): exit_gate_table, the rows a sweep
has, and table4, every block and row in the paper's order (module docstring of
analysis/tables.py)."""

from __future__ import annotations

import polars as pl

from analysis.names import PARAM
from analysis.points import shared_once
from analysis.table_parts import (
    Table,
    cell,
    column_or_null,
    data_columns,
    has_values,
    quality_columns,
    stage_rank,
)
from looplab import tracking
from looplab.policy import DENSE, FULL, SKIP
from looplab.stages import STAGE_NAMES

REPRESENTATIVE_Q = 0.8  # the threshold the paper reports the Ouro gate at (Table 4)
HYBRID_SKIP = "extension: skip on a hybrid (the paper defines skip for pure Mamba-2 only)"


def gate_picks(agg: pl.DataFrame, representative_q: float | None) -> pl.DataFrame:
    """The rows Table 4 chooses from (exit_gate_table's docstring): each model without a
    gate at full depth (choice ""), and each gated method's final stage per execution
    at the representative q and at the best-Avg. q, the choice column saying which."""
    from looplab.stages import get_stage

    rows = agg.filter(pl.col(tracking.LM_EVAL_AVG).is_not_null())
    gateless = [s for s in STAGE_NAMES if not get_stage(s).gated]
    loops = pl.coalesce([c for c in (tracking.LM_EVAL_LOOPS, tracking.EXECUTED_LOOPS) if c in rows.columns])
    rows = rows.with_columns(loops.alias("_exec"))
    fixed = shared_once(rows.filter(pl.col("stage").is_in(gateless) & (pl.col("policy") == FULL)))
    gated = rows.filter(
        pl.col("is_final_stage") & pl.col("policy").is_in([DENSE, SKIP]) & ~pl.col("stage").is_in(gateless)
    )
    picks = [fixed.with_columns(pl.lit("").alias("choice"))]
    for _, group in gated.group_by(["experiment", "trial_config_hash", "policy"], maintain_order=True):
        candidates = group
        if group["policy"][0] == SKIP:  # CHASE's q: the best among those that save compute
            saving = group.filter(pl.col("_exec") < pl.col("n_loops").cast(pl.Float64) - 1e-9)
            candidates = saving if saving.height else group
        best = candidates.sort(
            [tracking.LM_EVAL_AVG, "_exec", "q"], descending=[True, False, True], nulls_last=True
        ).head(1)
        at_q = (
            group.filter((pl.col("q") - representative_q).abs() < 1e-9)
            if representative_q is not None
            else group.clear()
        )
        if at_q.height and at_q["q"][0] == best["q"][0]:
            picks.append(best.with_columns(pl.lit(f"q={representative_q:g} and best Avg.").alias("choice")))
            continue
        picks.append(best.with_columns(pl.lit("best Avg.").alias("choice")))
        if at_q.height:
            picks.append(at_q.head(1).with_columns(pl.lit(f"q={representative_q:g} (the paper's)").alias("choice")))
    return pl.concat(picks, how="diagonal_relaxed")


def exit_gate_table(agg: pl.DataFrame, representative_q: float | None = REPRESENTATIVE_Q) -> Table | None:
    """Table 4 from downstream evaluations (module docstring). Each gated method's
    final stage appears per execution twice, labelled in the Choice column: at the
    representative q (the paper's 0.8 by default; None: left out) and at the q of the best
    downstream Avg. (skip: among the q that save loops, as the paper picks CHASE's); one
    row says both when they are the same q."""
    if not has_values(agg, tracking.LM_EVAL_AVG):
        return None
    table = gate_picks(agg, representative_q)
    if table.is_empty():
        return None
    table = table.with_columns(stage_rank().alias("_rank")).sort(["experiment", "_rank", "label", "policy"])
    quality = [c for c in quality_columns(agg, table) if c[1] != "accuracy"]  # next-token accuracy: not Table 4's
    header = ["Model", "Exit", "q", "Choice", "Exec.", *(h for h, _, _ in quality), "n"]
    hybrid_skip = (column_or_null(table, f"{PARAM}model.arch") == "hybrid") & (pl.col("policy") == SKIP)
    table = table.with_columns(pl.when(hybrid_skip).then(pl.lit(HYBRID_SKIP)).otherwise(pl.lit("")).alias("note"))
    cells = [
        [
            (r["label"] or "") + (f" ({r['note']})" if r["note"] else ""),
            r["policy"],
            "–" if r["q"] is None else f"{r['q']:.1f}",
            r["choice"] or "",
            cell(r, "_exec"),
            *(cell(r, c, k) for _, c, k in quality),
            str(r["n_seeds"]),
        ]
        for r in table.iter_rows(named=True)
    ]
    data = data_columns(
        table.rename({"_exec": "exec_loops"}),
        ["experiment", "label", "note", "stage", "policy", "q", "choice", "exec_loops"],
        quality,
    )
    chosen = (
        f"at the representative q = {representative_q:g} (the paper reports the Ouro gate there) and "
        if representative_q is not None
        else ""
    )
    return Table(
        "exit_gate",
        "Downstream evaluation with exit gates",
        "Each model without a gate at full depth; each gated method's final stage per execution "
        f"{chosen}at the q with the best downstream Avg. (skip: among the q that execute fewer than R loops, "
        "as the paper picks CHASE's), the Choice column saying which. Exec.: loops executed per token on "
        "the tasks (Table 4).",
        data,
        header,
        cells,
    )


def table4(agg: pl.DataFrame, representative_q: float | None = REPRESENTATIVE_Q) -> Table | None:
    """The paper's Table 4 as laid out there (looplab/presets.TABLE4): every block
    (LLaMA-2, Mamba-2, Mamba-2 Hybrid at 140M and 370M) and every row in the paper's
    order, a row with no run shown as missing; the gated rows from exit_gate_table's
    picks (loop4-Ouro dense, loop4-CHASE skip, at the representative and best-Avg. q).
    A hybrid's skip rows follow its block, labelled an extension. None when no run
    is one of the paper's models (a sweep on the small presets)."""
    from looplab.presets import TABLE4

    if not has_values(agg, tracking.LM_EVAL_AVG):
        return None
    picks = gate_picks(agg, representative_q)
    out: list[pl.DataFrame] = []
    found = False
    for group in TABLE4:
        rows, any_picked = _block_rows(group, picks, agg)
        out += rows
        found |= any_picked
    if not found:
        return None
    table = pl.concat(out, how="diagonal_relaxed")
    quality = [c for c in quality_columns(agg, picks) if c[1] != "accuracy"]  # as exit_gate: no next-token Acc.
    header = ["Block", "Model", "Exit", "q", "Choice", "Exec.", *(h for h, _, _ in quality), "n"]
    data = data_columns(
        table.rename({"_exec": "exec_loops"}),
        ["block", "row", "note", "missing", "experiment", "label", "stage", "policy", "q", "choice", "exec_loops"],
        quality,
    )
    return Table(
        "table4",
        "Table 4: every row in the paper's order",
        "The paper's blocks and rows in its order (a row without a run, or without a downstream evaluation: "
        "missing, saying which); ungated rows at full depth, "
        "loop4-Ouro under dense and loop4-CHASE under skip at the representative q and the best-Avg. q (the "
        "Choice column). A hybrid's skip rows are an extension the paper does not have, labelled as such. "
        "Trained by sweeps/adaptive_pipeline.py --baselines.",
        data,
        header,
        [_table4_cells(r, quality) for r in table.iter_rows(named=True)],
    )


def _block_rows(group, picks: pl.DataFrame, agg: pl.DataFrame) -> tuple[list[pl.DataFrame], bool]:
    """One block of Table 4 (a model of the paper): a frame per row in the paper's order,
    then a hybrid's skip rows; and whether any of the block's model's rows were picked."""
    from looplab.presets import TABLE4_GATED, get_preset, table4_loops

    model = get_preset(group.preset).model
    mine, trained = _of_model(picks, model), _of_model(agg, model)
    out = []
    for name in group.rows:
        loops = table4_loops(name)
        if loops is not None:
            fixed = (pl.col("policy") == FULL) & (pl.col("n_loops").cast(pl.Int64) == loops)
            out.append(
                _table4_row(group.title, name, mine.filter((pl.col("choice") == "") & fixed).head(1), trained, fixed)
            )
        else:
            method, execution = TABLE4_GATED[name]
            rows = mine.filter((pl.col("method") == method) & (pl.col("policy") == execution))
            ran = (pl.col("method") == method) & pl.col("is_final_stage")
            out.append(_table4_row(group.title, name, rows, trained, ran))
    if model.arch == "hybrid":
        for method in ("Ouro", "CHASE"):
            rows = mine.filter((pl.col("method") == method) & (pl.col("policy") == SKIP))
            if rows.height:
                out.append(_table4_row(group.title, f"loop4-{method} · skip", rows, trained, None, HYBRID_SKIP))
    return out, mine.height > 0


def _of_model(df: pl.DataFrame, model) -> pl.DataFrame:
    """The rows of df that are the given paper model: its arch, width and layers."""
    return df.filter(
        *(
            column_or_null(df, f"{PARAM}model.{k}").cast(pl.String) == str(v)
            for k, v in (("arch", model.arch), ("d_model", model.d_model), ("n_layers", model.n_layers))
        )
    )


def _table4_row(
    block: str, name: str, rows: pl.DataFrame, trained: pl.DataFrame, ran: pl.Expr | None, note: str = ""
) -> pl.DataFrame:
    """rows labelled with their block, row name and note, or one missing row that says
    whether its model was trained (then only the downstream evaluation is missing) or has no run."""
    was_trained = ran is not None and trained.filter(ran).height > 0
    missing = "" if rows.height else ("not evaluated downstream" if was_trained else "no run")
    head = {"block": block, "row": name, "note": note, "missing": missing}
    if rows.is_empty():
        return pl.DataFrame({k: [v] for k, v in head.items()})
    return rows.with_columns(*(pl.lit(v).alias(k) for k, v in head.items()))


def _table4_cells(r: dict, quality: list[tuple[str, str, str]]) -> list[str]:
    """One displayed row of Table 4; a missing row has only its block, name and why."""
    model_cell = r["row"] + (f" ({r['note']})" if r["note"] else "")
    if r["missing"]:
        return [r["block"], model_cell, "", "", "", "", *("" for _ in quality), f"missing ({r['missing']})"]
    return [
        r["block"],
        model_cell,
        r["policy"],
        "–" if r["q"] is None else f"{r['q']:.1f}",
        r["choice"] or "",
        cell(r, "_exec"),
        *(cell(r, c, k) for _, c, k in quality),
        str(r["n_seeds"]),
    ]
