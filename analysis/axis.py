"""The sweep's searched axis: what a sweep varied, named as a reader calls it, and the
report's first section built on it (the question the sweep asked, before any generic
table).

A sweep records its sampled values on every trial run as search.* params
(looplab.tracking.SEARCH_PARAM: search.beta, search.hp, search.n_layers, ...; the seed
too). The axes are the searched params, seed aside, that take more than one value in the
analysed runs. Two that only make sense together are one axis: n_layers and n_loops are
N⊗R, lo and hi the depth range. Every label the report shows for an axis value comes
from here (`Axis.name`, `format_value`), so the table, the chart, the frontier's series
and the points' labels all write "β=0.25", never "beta=0.25" beside "β=0.25" and "0.25".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from looplab import tracking

SEARCH = "params." + tracking.SEARCH_PARAM  # the points' column prefix of a searched value
SEED = "seed"

# A searched param's name for readers; params not listed keep their own name.
NAMES = {
    "beta": "β",
    "hp": "hole probability",
    "rho": "ρ",
    "p": "hops p",
    "q": "q",
    "arm": "arm",
    "n_layers": "N",
    "n_loops": "R",
    "lr": "learning rate",
    "init_from": "initialisation",
}
# Params that form one axis when both vary: (params, the axis' name, how a value reads).
PAIRS = ((("n_layers", "n_loops"), "N⊗R", "{}⊗{}"), (("lo", "hi"), "depth range", "[{}, {}]"))


def format_value(value, param: str | None = None) -> str:
    """A searched value as the report writes it: numbers in their shortest form (1.0 → 1,
    0.25 → 0.25), an initialisation as the arm it is ("retrofit NAME" for hf:PATH,
    "scratch NAME" for its shape freshly initialised, "scratch" for the preset's),
    anything else as it is. MLflow params arrive as strings."""
    if value is None:
        return "?"
    if param == "init_from":
        kind, _, path = str(value).partition(":")
        name = path.rstrip("/").rpartition("/")[2]
        return {"hf": f"retrofit {name}", "hf-shape": f"scratch {name}"}.get(kind, "scratch")
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:g}" if math.isfinite(number) else str(value)


def param_name(param: str) -> str:
    return NAMES.get(param, param)


def formatted(param: str) -> pl.Expr:
    """A searched param's column (search.<param>) as the report writes its values."""
    return pl.col(SEARCH + param).map_elements(lambda v: format_value(v, param), return_dtype=pl.String)


def searched_label(params: list[str]) -> pl.Expr:
    """ "β=0.25 hole probability=0.5": these searched params named and written as the
    report writes them (a configuration's label); "" for none."""
    if not params:
        return pl.lit("")
    return pl.concat_str([pl.lit(param_name(p) + "=") + formatted(p) for p in params], separator=" ", ignore_nulls=True)


@dataclass(frozen=True)
class Axis:
    name: str  # what the report calls it: β, N⊗R, depth range
    params: tuple[str, ...]  # the searched params behind it
    template: str = "{}"

    @property
    def columns(self) -> list[str]:
        return [SEARCH + p for p in self.params]

    def value_expr(self) -> pl.Expr:
        """The axis' value per row as the report writes it (a string column)."""
        parts = [formatted(p) for p in self.params]
        return pl.format(self.template, *parts) if len(parts) > 1 else parts[0]

    def number_expr(self) -> pl.Expr | None:
        """A numeric position for sorting and charts: the value of a one-param axis (β,
        hole probability; null where it is not a number); None for a pair (N⊗R, a depth
        range), which a chart shows as categories."""
        if len(self.params) == 1:
            return pl.col(self.columns[0]).cast(pl.Float64, strict=False)
        return None


def searched_axes(table: pl.DataFrame) -> list[Axis]:
    """The axes of the runs in `table` (points or aggregated points): every searched
    param but the seed with more than one distinct value, pairs joined, in the order
    the params were recorded."""
    varying = [
        c[len(SEARCH) :]
        for c in table.columns
        if c.startswith(SEARCH) and c != SEARCH + SEED and table[c].drop_nulls().n_unique() > 1
    ]
    axes: list[tuple[int, Axis]] = []  # (where the first param was recorded, the axis)
    used: set[str] = set()
    for params, name, template in PAIRS:
        if all(p in varying for p in params):
            axes.append((varying.index(params[0]), Axis(name, params, template)))
            used.update(params)
    axes += [(varying.index(p), Axis(param_name(p), (p,))) for p in varying if p not in used]
    return [axis for _, axis in sorted(axes, key=lambda pair: pair[0])]


def with_axis_values(table: pl.DataFrame, axes: list[Axis]) -> pl.DataFrame:
    """`table` with one string column per axis, named by the axis (β, N⊗R)."""
    return table.with_columns([axis.value_expr().alias(axis.name) for axis in axes])


def series_name(axes: list[Axis]) -> pl.Expr:
    """ "β=0.25 · N⊗R=2⊗4": a configuration's values along the axes, for chart series."""
    return pl.concat_str([pl.lit(f"{axis.name}=") + axis.value_expr() for axis in axes], separator=" · ")
