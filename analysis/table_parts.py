"""What every paper table is made of: the Table (its CSV data, display header and
cells; Markdown, HTML and files) and the cells, columns and orders the builders share
(analysis/tables.py, analysis/gate_tables.py)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from analysis import names
from looplab import tracking
from looplab.stages import STAGE_NAMES

PCT = "pct"  # display as percent
NUM = "num"


@dataclass
class Table:
    """One paper table: its raw numbers (the CSV) and how it is shown (header and cells)."""

    name: str  # file stem
    title: str
    caption: str
    data: pl.DataFrame  # raw numbers (the CSV)
    header: list[str]  # display headers
    rows: list[list[str]]  # display cells
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        """The table as a Markdown section: title, caption, the displayed cells."""
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
        """<name>.md and <name>.csv in out_dir."""
        out_dir.mkdir(parents=True, exist_ok=True)
        md, csv = out_dir / f"{self.name}.md", out_dir / f"{self.name}.csv"
        md.write_text(self.markdown())
        csv_safe(self.data).write_csv(csv)
        return {f"{self.name}.md": md, f"{self.name}.csv": csv}


def csv_safe(df: pl.DataFrame) -> pl.DataFrame:
    """Lists (the pooled seeds) as 'a;b' strings: CSV has no nested values."""
    return df.with_columns(
        [pl.col(c).cast(pl.List(pl.String)).list.join(";") for c, t in df.schema.items() if isinstance(t, pl.List)]
    )


def cell(row: dict, column: str, kind: str = NUM) -> str:
    """A displayed value: two decimals (percent for PCT), "± std" when seeds were pooled, empty when missing."""
    value = row.get(column)
    if value is None:
        return ""
    scale = 100.0 if kind == PCT else 1.0
    text = f"{value * scale:.2f}"
    std = row.get(f"{column}_std")
    if std is not None and (row.get("n_seeds") or 1) > 1:
        text += f" ± {std * scale:.2f}"
    return text


def task_names(agg: pl.DataFrame) -> list[str]:
    """The lm-eval tasks some row has a score for, in the paper's order."""
    present = [
        c[len(tracking.LM_EVAL) :]
        for c in agg.columns
        if c.startswith(tracking.LM_EVAL)
        and not c.endswith(("_std", "_ci_low", "_ci_high"))
        and agg[c].is_not_null().any()
    ]
    return names.ordered_tasks(present)


def quality_columns(agg: pl.DataFrame, rows: pl.DataFrame) -> list[tuple[str, str, str]]:
    """(header, column, kind) of the quality columns: PPL (text tasks), Acc, tasks, Avg."""
    cols = []
    text = "params.task.kind" not in rows.columns or (rows["params.task.kind"] == "text").any()
    if text and rows["ppl"].is_not_null().any():
        cols.append(("PPL", "ppl", NUM))
    if rows["accuracy"].is_not_null().any():
        cols.append(("Acc. (%)", "accuracy", PCT))
    tasks = task_names(rows)
    cols += [(names.task_header(t), tracking.LM_EVAL + t, PCT) for t in tasks]
    if tasks:
        cols.append(("Avg.", tracking.LM_EVAL_AVG, PCT))
    return cols


def data_columns(rows: pl.DataFrame, lead: list[str], quality: list[tuple[str, str, str]]) -> pl.DataFrame:
    """A table's CSV: the lead columns, each quality column with its std, the seeds and config hashes."""
    value_cols = []
    for _, c, _ in quality:
        value_cols += [c, f"{c}_std"]
    keep = [
        c
        for c in [*lead, *value_cols, "n_seeds", "seeds", "trial_config_hash", tracking.CONFIG_HASH]
        if c in rows.columns
    ]
    return rows.select(list(dict.fromkeys(keep)))


def model_name(n_layers, n_loops) -> str:
    """ "Loop (1⊗4)", "Base (4⊗1)": a model by its layers N and loops R."""
    if n_layers is None or n_loops is None:
        return "?"
    return f"{'Base' if n_loops == 1 else 'Loop'} ({n_layers}⊗{n_loops})"


def column_or_null(df: pl.DataFrame, name: str) -> pl.Expr:
    """The column, or nulls where the runs never logged it (a param another schema lacks)."""
    return pl.col(name) if name in df.columns else pl.lit(None)


def with_model_column(rows: pl.DataFrame, header: list[str], cells: list[list[str]]) -> tuple[list, list]:
    """A leading Model column when the table covers more than one configuration."""
    if rows["label"].n_unique() > 1:
        return ["Model", *header], [[lab, *c] for lab, c in zip(rows["label"].to_list(), cells)]
    return header, cells


def stage_rank() -> pl.Expr:
    """A stage's place in the pipeline (looplab.stages order), unknown stages last."""
    return pl.col("stage").replace_strict(
        {s: i for i, s in enumerate(STAGE_NAMES)}, default=len(STAGE_NAMES), return_dtype=pl.Int64
    )


def has_values(rows: pl.DataFrame, column: str) -> bool:
    """Whether the column exists and holds some value."""
    return column in rows.columns and rows[column].is_not_null().any()
