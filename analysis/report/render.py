"""The sections' HTML from the jinja2 templates beside this module (templates/*.html.j2).

Autoescape is on, so every value a template prints is escaped unless it is already
HTML (a Markup: another template's output, or a paper table's own HTML).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import polars as pl
from jinja2.ext import Extension
from markupsafe import Markup

TEMPLATES = Path(__file__).with_name("templates")


class _OneLine(Extension):
    """Drop each line break and the indentation after it from a template's source: the
    templates stay readable, and the page stays one run of tags as the f-strings wrote it.
    So a template's prose must not wrap across lines, nor a tag span two."""

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        return re.sub(r"\n\s*", "", source)


def cell(value) -> str:
    """A table cell: empty for a missing value, four significant digits for a float."""
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@cache
def environment() -> jinja2.Environment:
    """One environment per process: the templates are parsed once."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a misspelt name fails loudly, not as an empty string
        extensions=[_OneLine],
    )
    env.filters["cell"] = cell
    return env


def render(template: str, **values) -> Markup:
    """templates/<template> filled with values, as HTML."""
    return Markup(environment().get_template(template).render(**values))


def _parts() -> Any:
    """templates/parts.html.j2's macros, callable from Python (their names are the template's, untyped)."""
    return environment().get_template("parts.html.j2").module


def html_table(df: pl.DataFrame, caption: str) -> Markup:
    """df as a captioned table in the paper's style (the parts template's table)."""
    return Markup(_parts().table(df, caption))


def chart_slot(name: str, caption: str = "") -> Markup:
    """Where the page draws chart `name` (the parts template's chart_slot)."""
    return Markup(_parts().chart_slot(name, caption))
