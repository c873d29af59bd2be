"""What the HTML report is made of: its inline CSS, its scripts, and each chart as Plotly
figures in JSON (analysis/report/templates/page.html.j2 lays them out). plotly.js (4.6 MB,
Plotly's offline bundle) is a file beside report.html, plotly.min.js, which the page loads
by a relative <script src>: the folder is the report, and a copy of it works anywhere.
No CDN, no fonts, no images, no requests to any host: it opens offline from disk. Where
the page is shown without its folder (MLflow's artifact view serves report.html alone)
the status line says that the charts need plotly.min.js beside it; the tables read.

A ChartSpec (analysis.charts) becomes one figure: per series a marker trace (frontier
points larger and outlined, the seed interval as error bars, hover text with the
point's configuration and values) and, when the series has one, its line in the same
legend group, so a legend click hides both; a reference line (hlines) is a dashed
trace of its own in the legend. Plotly brings zoom, pan, box/lasso selection and PNG
export (the modebar). A chart of more colours than a reader tells apart is drawn as the
PNG draws it: small multiples (analysis/charts.small_multiples), panels side by side in
its slot on the same axis ranges.

The page records its outcome on <body> for analysis/screenshot.py: once every
Plotly.newPlot promise has resolved, data-rendered = the plots drawn (a panel of small
multiples is one) and data-points = the markers in their SVG; data-js-error (with the message, also shown
at the top) when any script throws or a promise rejects.
"""

from __future__ import annotations

import html
import json
import math
import textwrap

from analysis.charts import ChartSpec, Series, legend_entries, small_multiples
from analysis.charts import finite as _finite

WIDTH, HEIGHT = 680, 470
PANEL_WIDTH, PANEL_HEIGHT = 520, 430  # small multiples: two side by side within the page's 1100 px
PANEL_TITLE_CHARS = 60  # a panel's title wraps at this many characters (13 px type across its plot)
HLINE_COLOR = "#888"

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1100px;
color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 4px}.meta{color:#555;font-size:13px}.caption{color:#555;font-size:12px;margin:2px 0 6px}
.notes li{color:#8a5a00}#report-status{font-size:12px;color:#555}#report-status[data-error]{color:#b00;font-weight:bold}
table.paper{border-collapse:collapse;font-size:12px;margin:6px 0 14px;display:block;overflow-x:auto}
table.paper th,table.paper td{border-bottom:1px solid #e3e3e3;padding:3px 8px;text-align:right;white-space:nowrap}
table.paper th{background:#f6f6f6;position:sticky;top:0}table.paper td:first-child,table.paper th:first-child{text-align:left}
.chart{display:inline-block;vertical-align:top;margin:6px 12px 12px 0}.chart .panel{border:1px solid #eee;
display:inline-block;vertical-align:top;margin:0 8px 8px 0}
code{background:#f3f3f3;padding:0 3px}
"""

# Runs before plotly.js, so an error while plotly.js itself loads is recorded too.
GUARD = r"""
(function () {
  'use strict';
  function fail(message) {
    document.body.setAttribute('data-js-error', message);
    var status = document.getElementById('report-status');
    status.setAttribute('data-error', '1');
    status.textContent = 'report script error: ' + message;
  }
  window.addEventListener('error', function (e) { fail(e.message + ' (line ' + e.lineno + ':' + e.colno + ')'); });
  window.addEventListener('unhandledrejection', function (e) {
    fail('unhandled rejection: ' + (e.reason && e.reason.message ? e.reason.message : String(e.reason)));
  });
})();
"""

# Draws every chart, then counts what Plotly put in the DOM (not what was asked for).
# No catch: a rejected newPlot, or an error while counting, reaches GUARD's
# unhandledrejection handler.
DRAW = r"""
(function () {
  'use strict';
  var charts = JSON.parse(document.getElementById('report-data').textContent).charts;
  if (typeof Plotly === 'undefined') {
    throw new Error('plotly.min.js did not load: the charts need it beside report.html (open the page in its folder)');
  }
  var drawing = [];
  charts.forEach(function (chart) {
    var host = document.getElementById('chart-' + chart.name);
    if (!host) return;
    chart.panels.forEach(function (panel) {
      var div = document.createElement('div');
      div.className = 'panel';
      host.appendChild(div);
      drawing.push(Plotly.newPlot(div, panel.figure.data, panel.figure.layout, panel.config));
    });
  });
  Promise.all(drawing).then(function (plots) {
    var rendered = 0, points = 0;
    plots.forEach(function (gd) {
      if (!gd.classList.contains('js-plotly-plot')) return;
      rendered += 1;
      points += gd.querySelectorAll('.scatterlayer path.point').length;
    });
    document.body.setAttribute('data-rendered', String(rendered));
    document.body.setAttribute('data-points', String(points));
    if (!document.body.hasAttribute('data-js-error')) {
      document.getElementById('report-status').textContent = 'rendered ' + rendered + ' charts, ' + points + ' points';
    }
  });
})();
"""


def _fmt(v) -> str:
    return f"{v:.5g}" if _finite(v) else "–"


def _hover(spec: ChartSpec, s: Series, p) -> str:
    """Plotly hover text is pseudo-HTML (<b>, <br>, entities): the values are escaped."""
    interval = f" [{_fmt(p.lo)}, {_fmt(p.hi)}]" if _finite(p.lo) and _finite(p.hi) else ""
    lines = [
        f"<b>{html.escape(s.name)}</b>",
        html.escape(p.label),
        f"{html.escape(spec.x_label)}: {_fmt(p.x)}",
        f"{html.escape(spec.y_label)}: {_fmt(p.y)}{interval}",
    ]
    return "<br>".join(lines + (["on the frontier"] if p.on_frontier else []))


def _error_bar(centre: float, low: float | None, high: float | None) -> tuple[float | None, float | None]:
    """An error bar's arms (high − centre, centre − low), both None unless low and high
    are finite: plotly.js draws no bar for a non-numeric error."""
    if _finite(low) and _finite(high):
        return high - centre, centre - low
    return None, None


def _series_traces(spec: ChartSpec, s: Series, group: str) -> list[dict]:
    name = html.escape(s.name)  # legend text is pseudo-HTML too
    pts = [p for p in s.points if _finite(p.x) and _finite(p.y)]
    line = [(x, y) for x, y in s.line if _finite(x) and _finite(y)]
    traces = []
    if line:
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": name,
                "legendgroup": group,
                "showlegend": not pts,
                "hoverinfo": "skip",
                "x": [x for x, _ in line],
                "y": [y for _, y in line],
                "line": {
                    "color": s.color,
                    "width": 2,
                    "shape": "hv" if s.shape == "step" else "linear",
                    "dash": "dot" if s.dotted else "dash" if s.dashed else "solid",
                },
            }
        )
    if pts:
        marker = {
            "color": s.color,
            "size": [10 if p.on_frontier else 7 for p in pts],
            "opacity": [1.0 if p.on_frontier else 0.6 for p in pts],
            "line": {"color": "#000", "width": [1.2 if p.on_frontier else 0 for p in pts]},
        }
        trace: dict[str, object] = {
            "type": "scatter",
            "mode": "markers",
            "name": name,
            "legendgroup": group,
            "marker": marker,
            "x": [p.x for p in pts],
            "y": [p.y for p in pts],
            "hovertext": [_hover(spec, s, p) for p in pts],
            "hovertemplate": "%{hovertext}<extra></extra>",
        }
        for axis, bars in (
            ("error_y", [_error_bar(p.y, p.lo, p.hi) for p in pts]),
            ("error_x", [_error_bar(p.x, p.x_lo, p.x_hi) for p in pts]),
        ):
            if any(up is not None for up, _ in bars):  # null where a point has no interval: plotly.js draws no bar
                trace[axis] = {
                    "type": "data",
                    "symmetric": False,
                    "color": s.color,
                    "thickness": 1,
                    "width": 3,
                    "array": [up for up, _ in bars],
                    "arrayminus": [down for _, down in bars],
                }
        traces.append(trace)
    return traces


def _key_trace(entry: Series) -> dict:
    """A legend entry with nothing drawn: a colour (legend group of its series) or a line style."""
    return {
        "type": "scatter",
        "mode": "lines",
        "name": html.escape(entry.name),
        "legendgroup": f"group:{entry.group}" if entry.group else f"style:{entry.style}",
        "x": [None],
        "y": [None],
        "hoverinfo": "skip",
        "line": {
            "color": entry.color,
            "width": 2,
            "dash": "dot" if entry.dotted else "dash" if entry.dashed else "solid",
        },
    }


def figure(spec: ChartSpec, ranges: tuple[list[float] | None, list[float] | None] = (None, None), panel: bool = False):
    """ChartSpec → plotly.graph_objects.Figure (validated by plotly.py); ranges: its x and
    y axes' ranges (Plotly's units: decades on a log axis), None for Plotly's own; panel:
    one of small multiples, drawn smaller."""
    # Imported here, like matplotlib in analysis.plots: a CLI that stops at a bad
    # experiment name should not pay for it.
    import plotly.graph_objects as go

    entries = legend_entries(spec)
    if entries is None:
        traces = [t for i, s in enumerate(spec.series) for t in _series_traces(spec, s, f"series{i}")]
    else:  # a factored legend: a colour's entry hides its series; the line styles are a key
        traces = [t | {"showlegend": False} for s in spec.series for t in _series_traces(spec, s, f"group:{s.group}")]
        traces += [_key_trace(e) for e in entries]
    xs = [x for t in traces for x in t["x"] if x is not None]
    for y, label in spec.hlines:
        if _finite(y) and xs:  # a trace across the drawn x range: it has a legend entry and works on log axes
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": html.escape(f"{label} ({_fmt(y)})"),
                    "x": [min(xs), max(xs)],
                    "y": [y, y],
                    "hoverinfo": "name",
                    "line": {"color": HLINE_COLOR, "width": 1.5, "dash": "dash"},
                }
            )
    # The axes and the legend are filled in below: shared ranges, a legend title, categorical ticks.
    xaxis: dict[str, object] = {
        "title": {"text": html.escape(spec.x_label)},
        "type": "log" if spec.log_x else "linear",
        "zeroline": False,
    }
    yaxis: dict[str, object] = {
        "title": {"text": html.escape(spec.y_label)},
        "type": "log" if spec.log_y else "linear",
        "zeroline": False,
    }
    legend: dict[str, object] = {
        "orientation": "h",
        "yanchor": "top",
        "y": -0.14,
        "xanchor": "left",
        "x": 0,
        "font": {"size": 11},
    }
    title, top = _title(spec.title, panel)
    layout = {
        "title": title,
        "template": "plotly_white",
        "width": PANEL_WIDTH if panel else WIDTH,
        "height": PANEL_HEIGHT if panel else HEIGHT,
        "hovermode": "closest",
        "margin": {"l": 70, "r": 20, "t": top, "b": 40},
        "xaxis": xaxis,
        "yaxis": yaxis,
        "legend": legend,
    }
    if spec.legend_title:
        legend["title"] = {"text": html.escape(spec.legend_title) + "  "}
    for axis, span in zip((xaxis, yaxis), ranges):
        if span is not None:
            axis["range"] = span
    if spec.x_ticks:  # the spec's own ticks: a category axis' positions 0..k-1, or a numeric axis' values
        xaxis.update(
            tickmode="array",
            tickvals=[x for x, _ in spec.x_ticks],
            ticktext=[html.escape(label) for _, label in spec.x_ticks],
        )
    return go.Figure(data=traces, layout=layout)


def _title(text: str, panel: bool) -> tuple[dict, int]:
    """The layout's title and the top margin it needs. A panel's title, narrower than its
    text, wraps onto lines just above the plot, below where the modebar shows."""
    if not panel:
        return {"text": html.escape(text), "font": {"size": 15}}, 50
    lines = textwrap.wrap(text, PANEL_TITLE_CHARS)
    title = {
        "text": "<br>".join(html.escape(line) for line in lines),
        "font": {"size": 13},
        "y": 1,
        "yref": "paper",
        "yanchor": "bottom",
        # Plotly anchors a title's first line: the lines below it need the room too
        "pad": {"b": 8 + 17 * (len(lines) - 1)},
    }
    return title, 40 + 17 * len(lines)


def _config(spec: ChartSpec) -> dict:
    # No Plotly logo (a link out of an offline page) and no "Share chart" button
    # (plotly.js offers by default to upload the chart to Plotly Cloud); PNG export
    # named after the chart.
    return {
        "displaylogo": False,
        "showSendToCloud": False,
        "toImageButtonOptions": {"format": "png", "filename": spec.name, "scale": 2},
    }


def _embed(data: dict) -> str:
    """JSON inside <script type="application/json">: '</' escaped so no string ends the element."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")


def charts_json(charts: list[ChartSpec]) -> str:
    """Every chart as its panels' Plotly figures and configs (one panel, or small multiples
    on shared ranges), as the JSON the page's DRAW script reads."""
    data = {"charts": [{"name": spec.name, "panels": _panels(spec)} for spec in charts]}
    return _embed(data)


def _panels(spec: ChartSpec) -> list[dict]:
    panels = small_multiples(spec)
    several = len(panels) > 1
    ranges = shared_ranges(panels) if several else (None, None)
    return [{"figure": figure(p, ranges, panel=several).to_plotly_json(), "config": _config(p)} for p in panels]


RANGE_MARGIN = 0.05  # of an axis' span, a side: what Plotly's autorange leaves about a marker


def shared_ranges(panels: list[ChartSpec]) -> tuple[list[float] | None, list[float] | None]:
    """One x and one y range for every panel of a chart: all they draw (points, their
    bars, lines, reference lines, ticks), so that the panels compare as the PNG's do."""
    xs, ys = [], []
    for spec in panels:
        for s in spec.series:
            xs += [v for p in s.points for v in (p.x, p.x_lo, p.x_hi)] + [x for x, _ in s.line]
            ys += [v for p in s.points for v in (p.y, p.lo, p.hi)] + [y for _, y in s.line]
        xs += [x for x, _ in spec.x_ticks]
        ys += [y for y, _ in spec.hlines]
    return _span(xs, panels[0].log_x), _span(ys, panels[0].log_y)


def _span(values: list, log: bool) -> list[float] | None:
    """The range over the finite values (positive ones on a log axis, in decades), with
    RANGE_MARGIN a side; None without any."""
    shown = [math.log10(v) if log else v for v in values if _finite(v) and (v > 0 or not log)]
    if not shown:
        return None
    low, high = min(shown), max(shown)
    margin = (high - low) * RANGE_MARGIN or (0.05 if log else abs(high) * RANGE_MARGIN or 1.0)
    return [low - margin, high + margin]
