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

import html
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from analysis import names
from analysis.names import PARAM
from analysis.points import shared_once
from looplab import tracking
from looplab.policy import DENSE, FORCED, FULL, SKIP
from looplab.stages import DEFAULT_STAGE, STAGE_NAMES

PCT = "pct"  # display as percent
NUM = "num"


@dataclass
class Table:
    name: str  # file stem
    title: str
    caption: str
    data: pl.DataFrame  # raw numbers (the CSV)
    header: list[str]  # display headers
    rows: list[list[str]]  # display cells
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [
            f"### {self.title}",
            "",
            self.caption,
            "",
            "| " + " | ".join(self.header) + " |",
            "|" + "|".join("---" for _ in self.header) + "|",
        ]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in self.rows]
        return "\n".join(lines + [""])

    def html(self, max_rows: int = 300) -> str:
        """At most max_rows rows (the page stays light for large sweeps; the .md and
        .csv files have every row)."""
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self.rows[:max_rows]
        )
        more = (
            (
                f'<p class="caption">first {max_rows} of {len(self.rows)} rows; all of them in tables/{self.name}.md '
                f"and .csv</p>"
            )
            if len(self.rows) > max_rows
            else ""
        )
        return (
            f'<h3>{html.escape(self.title)}</h3><p class="caption">{html.escape(self.caption)}</p>'
            f'<table class="paper"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}'
        )

    def write(self, out_dir: Path) -> dict[str, Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        md, csv = out_dir / f"{self.name}.md", out_dir / f"{self.name}.csv"
        md.write_text(self.markdown())
        _csv_safe(self.data).write_csv(csv)
        return {f"{self.name}.md": md, f"{self.name}.csv": csv}


def _csv_safe(df: pl.DataFrame) -> pl.DataFrame:
    """Lists (the pooled seeds) as 'a;b' strings: CSV has no nested values."""
    return df.with_columns(
        [pl.col(c).cast(pl.List(pl.String)).list.join(";") for c, t in df.schema.items() if isinstance(t, pl.List)]
    )


def _cell(row: dict, column: str, kind: str = NUM) -> str:
    value = row.get(column)
    if value is None:
        return ""
    scale = 100.0 if kind == PCT else 1.0
    text = f"{value * scale:.2f}"
    std = row.get(f"{column}_std")
    if std is not None and (row.get("n_seeds") or 1) > 1:
        text += f" ± {std * scale:.2f}"
    return text


def _tasks(agg: pl.DataFrame) -> list[str]:
    present = [
        c[len(tracking.LM_EVAL) :]
        for c in agg.columns
        if c.startswith(tracking.LM_EVAL)
        and not c.endswith(("_std", "_ci_low", "_ci_high"))
        and agg[c].is_not_null().any()
    ]
    return names.ordered_tasks(present)


def _quality_columns(agg: pl.DataFrame, rows: pl.DataFrame) -> list[tuple[str, str, str]]:
    """(header, column, kind) of the quality columns: PPL (text tasks), Acc, tasks, Avg."""
    cols = []
    text = "params.task.kind" not in rows.columns or (rows["params.task.kind"] == "text").any()
    if text and rows["ppl"].is_not_null().any():
        cols.append(("PPL", "ppl", NUM))
    if rows["accuracy"].is_not_null().any():
        cols.append(("Acc. (%)", "accuracy", PCT))
    tasks = _tasks(rows)
    cols += [(names.task_header(t), tracking.LM_EVAL + t, PCT) for t in tasks]
    if tasks:
        cols.append(("Avg.", tracking.LM_EVAL_AVG, PCT))
    return cols


def _data(rows: pl.DataFrame, lead: list[str], quality: list[tuple[str, str, str]]) -> pl.DataFrame:
    value_cols = []
    for _, c, _ in quality:
        value_cols += [c, f"{c}_std"]
    keep = [
        c
        for c in [*lead, *value_cols, "n_seeds", "seeds", "trial_config_hash", tracking.CONFIG_HASH]
        if c in rows.columns
    ]
    return rows.select(list(dict.fromkeys(keep)))


def _model_name(n_layers, n_loops) -> str:
    if n_layers is None or n_loops is None:
        return "?"
    return f"{'Base' if n_loops == 1 else 'Loop'} ({n_layers}⊗{n_loops})"


def iso_table(agg: pl.DataFrame) -> Table | None:
    full = agg.filter(pl.col("policy") == FULL)
    if full.is_empty():
        return None
    pre = full.filter(pl.col("stage") == DEFAULT_STAGE)
    rows = (pre if pre.height else full.filter(pl.col("is_final_stage"))).unique(
        ["experiment", tracking.CONFIG_HASH], keep="first", maintain_order=True
    )
    rows = rows.with_columns(
        _col(rows, "params.model.n_layers").alias("n_layers"),
        _col(rows, "params.model.n_loops").alias("n_loops"),
        _col(rows, "params.model.arch").alias("arch"),
    )
    rows = rows.sort([pl.col("arch"), pl.col("n_layers") * pl.col("n_loops"), "n_layers"], nulls_last=True)
    quality = _quality_columns(agg, rows)
    header = ["Arch.", "Model", "Params / FLOPs", *(h for h, _, _ in quality), "n"]
    cells = []
    for r in rows.iter_rows(named=True):
        n, R = r["n_layers"], r["n_loops"]
        ratio = f"{n}× / {n * R}×" if n is not None and R is not None else "?"
        cells.append(
            [
                str(r["arch"] or ""),
                _model_name(n, R),
                ratio,
                *(_cell(r, c, k) for _, c, k in quality),
                str(r["n_seeds"]),
            ]
        )
    data = _data(
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


def _col(df: pl.DataFrame, name: str) -> pl.Expr:
    return pl.col(name) if name in df.columns else pl.lit(None)


def _with_model_column(rows: pl.DataFrame, header: list[str], cells: list[list[str]]) -> tuple[list, list]:
    """A leading Model column when the table covers more than one configuration."""
    if rows["label"].n_unique() > 1:
        return ["Model", *header], [[lab, *c] for lab, c in zip(rows["label"].to_list(), cells)]
    return header, cells


def _stage_rank() -> pl.Expr:
    return pl.col("stage").replace_strict(
        {s: i for i, s in enumerate(STAGE_NAMES)}, default=len(STAGE_NAMES), return_dtype=pl.Int64
    )


def threshold_table(agg: pl.DataFrame) -> Table | None:
    rows = agg.filter(pl.col("policy").is_in([DENSE, SKIP]))
    if rows.is_empty():
        return None
    rows = shared_once(rows).sort(["label", _stage_rank(), "policy", "q"], descending=[False, False, False, True])
    quality = _quality_columns(agg, rows)
    downstream = _has(rows, tracking.LM_EVAL_LOOPS)
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
            _cell(r, tracking.MEAN_EXIT_STEP),
            _cell(r, tracking.EXECUTED_LOOPS),
            *([_cell(r, tracking.LM_EVAL_LOOPS)] if downstream else []),
            *(_cell(r, c, k) for _, c, k in quality),
            str(r["n_seeds"]),
        ]
        for r in rows.iter_rows(named=True)
    ]
    header, cells = _with_model_column(rows, header, cells)
    data = _data(
        rows,
        [
            "experiment",
            "label",
            "stage",
            "policy",
            "q",
            tracking.MEAN_EXIT_STEP,
            names.std_of(tracking.MEAN_EXIT_STEP),
            tracking.EXECUTED_LOOPS,
            names.std_of(tracking.EXECUTED_LOOPS),
            *([tracking.LM_EVAL_LOOPS, f"{tracking.LM_EVAL_LOOPS}_std"] if downstream else []),
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
    rows = shared_once(rows).sort(["label", _stage_rank(), "depth"])
    quality = _quality_columns(agg, rows)
    header = ["Stage", "Forced loops", *(h for h, _, _ in quality), "n"]
    cells = [
        [r["stage"] or "", str(r["depth"]), *(_cell(r, c, k) for _, c, k in quality), str(r["n_seeds"])]
        for r in rows.iter_rows(named=True)
    ]
    header, cells = _with_model_column(rows, header, cells)
    data = _data(rows, ["experiment", "label", "stage", "depth"], quality)
    return Table(
        "fixed_loop",
        "Fixed-loop inference ablation",
        "Every token forced to stop at depth r (App. E); depth R is full depth. Validation columns from each "
        "gate stage's evaluation, task columns from downstream evaluations (a pre-trained model's too).",
        data,
        header,
        cells,
    )


def _has(rows: pl.DataFrame, column: str) -> bool:
    return column in rows.columns and rows[column].is_not_null().any()


def _gate_picks(agg: pl.DataFrame, representative_q: float | None) -> pl.DataFrame:
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


REPRESENTATIVE_Q = 0.8  # the threshold the paper reports the Ouro gate at (Table 4)
HYBRID_SKIP = "extension: skip on a hybrid (the paper defines skip for pure Mamba-2 only)"


def exit_gate_table(agg: pl.DataFrame, representative_q: float | None = REPRESENTATIVE_Q) -> Table | None:
    """Table 4 from downstream evaluations (module docstring). Each gated method's
    final stage appears per execution twice, labelled in the Choice column: at the
    representative q (the paper's 0.8 by default; None: left out) and at the q of the best
    downstream Avg. (skip: among the q that save loops, as the paper picks CHASE's); one
    row says both when they are the same q."""
    if not _has(agg, tracking.LM_EVAL_AVG):
        return None
    table = _gate_picks(agg, representative_q)
    if table.is_empty():
        return None
    table = table.with_columns(_stage_rank().alias("_rank")).sort(["experiment", "_rank", "label", "policy"])
    quality = [c for c in _quality_columns(agg, table) if c[1] != "accuracy"]  # next-token accuracy: not Table 4's
    header = ["Model", "Exit", "q", "Choice", "Exec.", *(h for h, _, _ in quality), "n"]
    hybrid_skip = (_col(table, f"{PARAM}model.arch") == "hybrid") & (pl.col("policy") == SKIP)
    table = table.with_columns(pl.when(hybrid_skip).then(pl.lit(HYBRID_SKIP)).otherwise(pl.lit("")).alias("note"))
    cells = [
        [
            (r["label"] or "") + (f" ({r['note']})" if r["note"] else ""),
            r["policy"],
            "–" if r["q"] is None else f"{r['q']:.1f}",
            r["choice"] or "",
            _cell(r, "_exec"),
            *(_cell(r, c, k) for _, c, k in quality),
            str(r["n_seeds"]),
        ]
        for r in table.iter_rows(named=True)
    ]
    data = _data(
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
    from looplab.presets import TABLE4, TABLE4_GATED, get_preset, table4_loops

    if not _has(agg, tracking.LM_EVAL_AVG):
        return None
    picks = _gate_picks(agg, representative_q)
    out: list[pl.DataFrame] = []
    found = False
    for group in TABLE4:
        model = get_preset(group.preset).model

        def of_model(df: pl.DataFrame) -> pl.DataFrame:
            return df.filter(
                *(
                    _col(df, f"{PARAM}model.{k}").cast(pl.String) == str(v)
                    for k, v in (("arch", model.arch), ("d_model", model.d_model), ("n_layers", model.n_layers))
                )
            )

        mine, trained = of_model(picks), of_model(agg)
        found |= mine.height > 0

        def put(name: str, rows: pl.DataFrame, note: str = "", ran: pl.Expr | None = None) -> None:
            # A missing row says whether its model was trained (then only the downstream
            # evaluation is missing) or has no run at all.
            was_trained = ran is not None and trained.filter(ran).height > 0
            missing = "" if rows.height else ("not evaluated downstream" if was_trained else "no run")
            head = {"block": group.title, "row": name, "note": note, "missing": missing}
            out.append(
                pl.DataFrame({k: [v] for k, v in head.items()})
                if rows.is_empty()
                else rows.with_columns(*(pl.lit(v).alias(k) for k, v in head.items()))
            )

        for name in group.rows:
            loops = table4_loops(name)
            if loops is not None:
                fixed = (pl.col("policy") == FULL) & (pl.col("n_loops").cast(pl.Int64) == loops)
                put(name, mine.filter((pl.col("choice") == "") & fixed).head(1), ran=fixed)
            else:
                method, execution = TABLE4_GATED[name]
                put(
                    name,
                    mine.filter((pl.col("method") == method) & (pl.col("policy") == execution)),
                    ran=(pl.col("method") == method) & pl.col("is_final_stage"),
                )
        if model.arch == "hybrid":
            for method in ("Ouro", "CHASE"):
                rows = mine.filter((pl.col("method") == method) & (pl.col("policy") == SKIP))
                if rows.height:
                    put(f"loop4-{method} · skip", rows, HYBRID_SKIP)
    if not found:
        return None
    table = pl.concat(out, how="diagonal_relaxed")
    quality = [c for c in _quality_columns(agg, picks) if c[1] != "accuracy"]  # as exit_gate: no next-token Acc.
    header = ["Block", "Model", "Exit", "q", "Choice", "Exec.", *(h for h, _, _ in quality), "n"]
    cells = []
    for r in table.iter_rows(named=True):
        model_cell = r["row"] + (f" ({r['note']})" if r["note"] else "")
        if r["missing"]:
            cells.append([r["block"], model_cell, "", "", "", "", *("" for _ in quality), f"missing ({r['missing']})"])
            continue
        cells.append(
            [
                r["block"],
                model_cell,
                r["policy"],
                "–" if r["q"] is None else f"{r['q']:.1f}",
                r["choice"] or "",
                _cell(r, "_exec"),
                *(_cell(r, c, k) for _, c, k in quality),
                str(r["n_seeds"]),
            ]
        )
    data = _data(
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
        cells,
    )


def skip_table(agg: pl.DataFrame) -> Table | None:
    final = agg.filter(pl.col("is_final_stage"))
    skip = final.filter(pl.col("policy") == SKIP)
    if skip.is_empty():
        return None
    ppl, accuracy, loops = tracking.PPL, tracking.ACCURACY, tracking.EXECUTED_LOOPS
    # The same configuration's full and dense points, joined beside each skip row.
    ppl_full, ppl_dense = names.at_point(ppl, FULL), names.at_point(ppl, DENSE)
    accuracy_full, accuracy_dense = names.at_point(accuracy, FULL), names.at_point(accuracy, DENSE)
    key = ["experiment", "trial_config_hash"]
    full = final.filter(pl.col("policy") == FULL).select(
        *key, pl.col(ppl).alias(ppl_full), pl.col(accuracy).alias(accuracy_full)
    )
    dense = final.filter(pl.col("policy") == DENSE).select(
        *key, "q", pl.col(ppl).alias(ppl_dense), pl.col(accuracy).alias(accuracy_dense)
    )
    rows = (
        skip.join(full, on=key, how="left")
        .join(dense, on=[*key, "q"], how="left")
        .with_columns(
            (pl.col("n_loops").cast(pl.Float64) / pl.col(loops)).alias(tracking.LOOP_BOUND),
            ((pl.col(ppl) / pl.col(ppl_full) - 1.0) * 100.0).alias("delta_ppl_pct"),
            ((pl.col(accuracy) - pl.col(accuracy_full)) * 100.0).alias("delta_accuracy_pts"),
        )
        .sort(["label", "q"], descending=[False, True])
    )
    header = [
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

    def num(v, fmt="{:.2f}"):
        return "" if v is None else fmt.format(v)

    cells = [
        [
            f"{r['q']:.2f}",
            _cell(r, loops),
            num(r[tracking.LOOP_BOUND], "{:.2f}×"),
            num(r[ppl_full]),
            num(r[ppl_dense]),
            _cell(r, ppl),
            num(r["delta_ppl_pct"], "{:+.1f}"),
            num(None if r[accuracy_full] is None else 100 * r[accuracy_full]),
            _cell(r, accuracy, PCT),
            num(r["delta_accuracy_pts"], "{:+.2f}"),
            str(r["n_seeds"]),
        ]
        for r in rows.iter_rows(named=True)
    ]
    header, cells = _with_model_column(rows, header, cells)
    data = rows.select(
        [
            c
            for c in [
                "experiment",
                "label",
                "stage",
                "q",
                loops,
                names.std_of(loops),
                tracking.LOOP_BOUND,
                ppl_full,
                ppl_dense,
                ppl,
                names.std_of(ppl),
                "delta_ppl_pct",
                accuracy_full,
                accuracy_dense,
                accuracy,
                names.std_of(accuracy),
                "delta_accuracy_pts",
                "n_seeds",
                "trial_config_hash",
            ]
            if c in rows.columns
        ]
    )
    return Table(
        names.SKIP_VS_FULL,
        "Skip against full compute",
        "Final stage under skip execution at each q, against all R loops (full) and the same gate without "
        "skipping (dense). Ideal speedup: R / executed loops (Fig. 2).",
        data,
        header,
        cells,
    )


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
            _cell(r, tracking.EXIT_ENTROPY),
            _cell(r, tracking.EXPECTED_EXIT_STEP),
            _cell(r, quality),
            _cell(r, "accuracy", PCT),
            str(r["n_seeds"]),
        ]
        for r in rows.iter_rows(named=True)
    ]
    header, cells = _with_model_column(rows, header, cells)
    data = rows.select(
        [
            c
            for c in [
                "experiment",
                "label",
                "stage",
                "beta",
                tracking.EXIT_ENTROPY,
                names.std_of(tracking.EXIT_ENTROPY),
                tracking.EXPECTED_EXIT_STEP,
                names.std_of(tracking.EXPECTED_EXIT_STEP),
                "ppl",
                names.std_of(tracking.PPL),
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
