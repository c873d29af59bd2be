"""ReportContext: what every section of the report reads and writes.

A section reads the runs, the output folder and the report's settings, and adds to three
shared collections: the files it wrote (paths, logged as artifacts at the end), the charts
the page draws (in the page's order) and the notes that say what was skipped and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from analysis.charts import ChartSpec
from analysis.load import RunSet
from analysis.plots import render_png
from analysis.tables import REPRESENTATIVE_Q

Section = tuple[str, str]  # (heading, inner HTML): what render_page lays out in order


def write_csv(df: pl.DataFrame, path: Path) -> dict[str, Path]:
    """df as CSV, list columns (a trial's curves, a point's seeds) joined with ';'."""
    lists = [c for c, t in df.schema.items() if isinstance(t, pl.List)]
    df.with_columns([pl.col(c).cast(pl.List(pl.String)).list.join(";") for c in lists]).write_csv(path)
    return {path.name: path}


@dataclass
class ReportContext:
    """The runs and settings every section reads, and the paths, charts and notes they add to."""

    runs: RunSet
    out: Path
    notes: list[str]
    strict: bool = False
    confidence: float = 0.95
    representative_q: float | None = REPRESENTATIVE_Q
    paths: dict[str, Path] = field(default_factory=dict)
    charts: list[ChartSpec] = field(default_factory=list)

    def note(self, message: str) -> None:
        self.notes.append(message)

    def csv(self, df: pl.DataFrame, name: str) -> None:
        """Write df as out/name and record it among the report's files."""
        self.paths.update(write_csv(df, self.out / name))

    def chart(self, spec: ChartSpec) -> None:
        """Draw spec as out/<name>.png and queue it for the page's interactive charts."""
        png = f"{spec.name}.png"
        self.paths[png] = render_png(spec, self.out / png)
        self.charts.append(spec)
