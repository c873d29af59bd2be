"""The page: every section in order, the notes, and the charts' data and scripts, laid
out by templates/page.html.j2 as one self-contained file (no CDN, no requests)."""

from __future__ import annotations

from markupsafe import Markup

from analysis.charts import ChartSpec
from analysis.page import DRAW, GUARD, STYLE, charts_json
from analysis.report.context import Section
from analysis.report.render import render


def render_page(
    *, title: str, meta: list[str], notes: list[str], sections: list[Section], charts: list[ChartSpec]
) -> str:
    """sections: (heading, inner HTML) in order; a chart's place is its chart_slot
    (templates/parts.html.j2) inside some section's HTML."""
    from plotly.offline import get_plotlyjs  # the bundle include_plotlyjs=True inlines

    return render(
        "page.html.j2",
        title=title,
        meta=meta,
        notes=notes,
        # A section's inner HTML is already HTML: the templates' output, or a caller's lead.
        sections=[(heading, Markup(inner)) for heading, inner in sections],
        style=Markup(STYLE),
        data=Markup(charts_json(charts)),
        guard=Markup(GUARD),
        plotly=Markup(get_plotlyjs()),
        draw=Markup(DRAW),
        newline="\n",  # the template's own line breaks are dropped (render.py)
    )
