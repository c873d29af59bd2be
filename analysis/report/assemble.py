"""The page: every section in order, the notes, and the charts' data and scripts, laid
out by templates/page.html.j2; plotly.js is a file beside it (PLOTLY_JS), written once per
report folder and loaded by a relative <script src>, so that the page stays small and the
folder works wherever it is copied (no CDN, no requests)."""

from __future__ import annotations

from pathlib import Path

from markupsafe import Markup

from analysis.charts import ChartSpec
from analysis.page import DRAW, GUARD, STYLE, charts_json
from analysis.report.context import Section
from analysis.report.render import render

PLOTLY_JS = "plotly.min.js"  # beside report.html: Plotly's offline bundle


def render_page(
    *, title: str, meta: list[str], notes: list[str], sections: list[Section], charts: list[ChartSpec]
) -> str:
    """sections: (heading, inner HTML) in order; a chart's place is its chart_slot
    (templates/parts.html.j2) inside some section's HTML. The page loads PLOTLY_JS from
    its own folder (write_plotly_js)."""
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
        plotly=PLOTLY_JS,
        draw=Markup(DRAW),
        newline="\n",  # the template's own line breaks are dropped (render.py)
    )


def write_plotly_js(folder: Path) -> Path:
    """PLOTLY_JS in `folder`, the bundle of the plotly package installed (the version whose
    figures the page's JSON holds); rewritten only when it differs."""
    from plotly.offline import get_plotlyjs

    path = folder / PLOTLY_JS
    bundle = get_plotlyjs()
    if not path.is_file() or path.stat().st_size != len(bundle.encode()) or path.read_text() != bundle:
        path.write_text(bundle)
    return path
