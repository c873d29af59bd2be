"""What the self-contained HTML report is made of: its inline CSS, its scripts, and each
chart as a Plotly figure in JSON (analysis/report/templates/page.html.j2 lays them out,
with plotly.js inline, Plotly's offline output, written once per page).
No CDN, no fonts, no images, no requests of any kind: it opens offline from disk or in
the MLflow artifact view.

A ChartSpec (analysis.charts) becomes one figure: per series a marker trace (frontier
points larger and outlined, the seed interval as error bars, hover text with the
point's configuration and values) and, when the series has one, its line in the same
legend group, so a legend click hides both; a reference line (hlines) is a dashed
trace of its own in the legend. Plotly brings zoom, pan, box/lasso selection and PNG
export (the modebar).

The page records its outcome on <body> for analysis/screenshot.py: once every
Plotly.newPlot promise has resolved, data-rendered = the charts drawn and
data-points = the markers in their SVG; data-js-error (with the message, also shown
at the top) when any script throws or a promise rejects.
"""

from __future__ import annotations

import html
import json

from analysis.charts import ChartSpec, Series, legend_entries
from analysis.charts import finite as _finite

WIDTH, HEIGHT = 680, 470
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
.chart{display:inline-block;vertical-align:top;margin:6px 12px 12px 0}.chart .plot{border:1px solid #eee}
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
  var drawing = [];
  charts.forEach(function (chart) {
    var host = document.getElementById('chart-' + chart.name);
    if (host) drawing.push(Plotly.newPlot(host, chart.figure.data, chart.figure.layout, chart.config));
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


def figure(spec: ChartSpec):
    """ChartSpec → plotly.graph_objects.Figure (validated by plotly.py)."""
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
    # The x axis and the legend are filled in below, for a legend title and categorical ticks.
    xaxis: dict[str, object] = {
        "title": {"text": html.escape(spec.x_label)},
        "type": "log" if spec.log_x else "linear",
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
    layout = {
        "title": {"text": html.escape(spec.title), "font": {"size": 15}},
        "template": "plotly_white",
        "width": WIDTH,
        "height": HEIGHT,
        "hovermode": "closest",
        "margin": {"l": 70, "r": 20, "t": 50, "b": 40},
        "xaxis": xaxis,
        "yaxis": {
            "title": {"text": html.escape(spec.y_label)},
            "type": "log" if spec.log_y else "linear",
            "zeroline": False,
        },
        "legend": legend,
    }
    if spec.legend_title:
        legend["title"] = {"text": html.escape(spec.legend_title) + "  "}
    if spec.x_ticks:  # a categorical axis drawn at positions 0..k-1, labelled by its values
        xaxis.update(
            tickmode="array",
            tickvals=[x for x, _ in spec.x_ticks],
            ticktext=[html.escape(label) for _, label in spec.x_ticks],
        )
    return go.Figure(data=traces, layout=layout)


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
    """Every chart as its Plotly figure and config, as the JSON the page's DRAW script reads."""
    data = {
        "charts": [
            {"name": spec.name, "figure": figure(spec).to_plotly_json(), "config": _config(spec)} for spec in charts
        ]
    }
    return _embed(data)
