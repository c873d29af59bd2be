"""The self-contained HTML report: one file, inline CSS, inline SVG drawn by a small
vanilla-JavaScript renderer from data embedded in the page. No CDN, no fonts, no
images, no requests of any kind: it opens offline from disk or from the MLflow
artifact view.

Interaction: hover a point for its configuration and values (and the seed interval);
click a legend entry to hide or show that series. The script records its outcome on
<body>: data-rendered = the number of charts drawn, data-points = points drawn, and
data-js-error (with the message, also shown at the top) when anything throws, which
analysis/screenshot.py checks in a headless browser.
"""

from __future__ import annotations

import html
import json

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1100px;
color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 4px}.meta{color:#555;font-size:13px}.caption{color:#555;font-size:12px;margin:2px 0 6px}
.notes li{color:#8a5a00}#report-status{font-size:12px;color:#555}#report-status[data-error]{color:#b00;font-weight:bold}
table.paper{border-collapse:collapse;font-size:12px;margin:6px 0 14px;display:block;overflow-x:auto}
table.paper th,table.paper td{border-bottom:1px solid #e3e3e3;padding:3px 8px;text-align:right;white-space:nowrap}
table.paper th{background:#f6f6f6;position:sticky;top:0}table.paper td:first-child,table.paper th:first-child{text-align:left}
.chart{display:inline-block;vertical-align:top;margin:6px 12px 12px 0}.chart svg{background:#fff;border:1px solid #eee}
.legend{font-size:12px;margin-top:4px;max-width:660px}.legend span{cursor:pointer;margin-right:12px;user-select:none;
display:inline-block}.legend span.off{opacity:.35;text-decoration:line-through}.legend i{display:inline-block;width:10px;
height:10px;border-radius:5px;margin-right:4px;vertical-align:middle}
#tip{position:fixed;pointer-events:none;background:rgba(20,20,20,.9);color:#fff;font-size:12px;padding:5px 8px;
border-radius:4px;display:none;max-width:420px;z-index:10}
circle.pt{cursor:pointer}circle.pt:hover{stroke:#000;stroke-width:2}
code{background:#f3f3f3;padding:0 3px}
"""

# The renderer. Charts are SVG markup strings assigned with innerHTML: the HTML parser
# puts <svg> children in the SVG namespace, so no namespace URI appears in the page.
SCRIPT = r"""
(function () {
  'use strict';
  var status = document.getElementById('report-status');
  function fail(message) {
    document.body.setAttribute('data-js-error', message);
    status.setAttribute('data-error', '1');
    status.textContent = 'report script error: ' + message;
  }
  window.onerror = function (message, source, line, column) { fail(message + ' (line ' + line + ':' + column + ')'); };
  function esc(s) {
    return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
  }
  function fmt(v) {
    if (v === null || v === undefined) return '–';
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3);
    return String(Math.round(v * 1e4) / 1e4);
  }
  function niceStep(span, count) {
    var raw = span / Math.max(1, count), mag = Math.pow(10, Math.floor(Math.log10(raw))), r = raw / mag;
    return (r >= 5 ? 10 : r >= 2 ? 5 : r >= 1 ? 2 : 1) * mag;
  }
  function linearTicks(lo, hi) {
    if (hi === lo) { lo -= 1; hi += 1; }
    var step = niceStep(hi - lo, 6), out = [];
    for (var t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(Math.round(t / step) * step);
    return out;
  }
  function logTicks(lo, hi) {
    var out = [];
    for (var e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
      [1, 2, 5].forEach(function (m) { var t = m * Math.pow(10, e); if (t >= lo && t <= hi) out.push(t); });
    }
    return out.length ? out : [lo, hi];
  }
  var tip = document.getElementById('tip');
  function chart(spec, host) {
    var W = 660, H = 400, L = 70, R = 16, T = 30, B = 48;
    var xs = [], ys = [];
    spec.series.forEach(function (s) {
      s.points.forEach(function (p) {
        if (p.x === null || p.y === null) return;
        xs.push(p.x); ys.push(p.y);
        if (p.lo !== null) ys.push(p.lo);
        if (p.hi !== null) ys.push(p.hi);
      });
    });
    spec.hlines.forEach(function (h) { if (h.y !== null) ys.push(h.y); });
    if (!xs.length) { host.innerHTML = '<p class="caption">no points</p>'; return 0; }
    var logY = spec.logY && Math.min.apply(null, ys) > 0;
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x0 === x1) { x0 -= 0.5; x1 += 0.5; }
    var padX = (x1 - x0) * 0.04; x0 -= padX; x1 += padX;
    if (logY) { y0 = y0 / 1.15; y1 = y1 * 1.15; } else {
      if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
      var padY = (y1 - y0) * 0.06; y0 -= padY; y1 += padY;
    }
    function X(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Y(v) {
      var f = logY ? (Math.log(v) - Math.log(y0)) / (Math.log(y1) - Math.log(y0)) : (v - y0) / (y1 - y0);
      return H - B - f * (H - T - B);
    }
    var svg = ['<svg viewBox="0 0 ' + W + ' ' + H + '" width="' + W + '" height="' + H + '" role="img" aria-label="' +
               esc(spec.title) + '">'];
    svg.push('<text x="' + (W / 2) + '" y="18" text-anchor="middle" font-size="14" font-weight="bold">' +
             esc(spec.title) + '</text>');
    linearTicks(x0, x1).forEach(function (t) {
      svg.push('<line x1="' + X(t) + '" x2="' + X(t) + '" y1="' + T + '" y2="' + (H - B) + '" stroke="#eee"/>');
      svg.push('<text x="' + X(t) + '" y="' + (H - B + 16) + '" text-anchor="middle" font-size="11">' + fmt(t) + '</text>');
    });
    (logY ? logTicks(y0, y1) : linearTicks(y0, y1)).forEach(function (t) {
      svg.push('<line x1="' + L + '" x2="' + (W - R) + '" y1="' + Y(t) + '" y2="' + Y(t) + '" stroke="#eee"/>');
      svg.push('<text x="' + (L - 6) + '" y="' + (Y(t) + 4) + '" text-anchor="end" font-size="11">' + fmt(t) + '</text>');
    });
    svg.push('<rect x="' + L + '" y="' + T + '" width="' + (W - L - R) + '" height="' + (H - T - B) +
             '" fill="none" stroke="#999"/>');
    svg.push('<text x="' + ((L + W - R) / 2) + '" y="' + (H - 10) + '" text-anchor="middle" font-size="12">' +
             esc(spec.xLabel) + '</text>');
    svg.push('<text transform="translate(16 ' + ((T + H - B) / 2) + ') rotate(-90)" text-anchor="middle" font-size="12">' +
             esc(spec.yLabel) + (logY ? ' (log)' : '') + '</text>');
    spec.hlines.forEach(function (h) {
      if (h.y === null) return;
      svg.push('<line class="hline" x1="' + L + '" x2="' + (W - R) + '" y1="' + Y(h.y) + '" y2="' + Y(h.y) +
               '" stroke="#888" stroke-dasharray="5 4"><title>' + esc(h.label + ': ' + fmt(h.y)) + '</title></line>');
    });
    var drawn = 0;
    spec.series.forEach(function (s, i) {
      svg.push('<g class="series" data-series="' + i + '">');
      var line = s.line.filter(function (p) { return p[0] !== null && p[1] !== null; });
      if (line.length) {
        var d = 'M' + X(line[0][0]) + ' ' + Y(line[0][1]);
        for (var k = 1; k < line.length; k++) {
          d += s.shape === 'step' ? ' H' + X(line[k][0]) + ' V' + Y(line[k][1]) : ' L' + X(line[k][0]) + ' ' + Y(line[k][1]);
        }
        svg.push('<path d="' + d + '" fill="none" stroke="' + s.color + '" stroke-width="2"' +
                 (s.dashed ? ' stroke-dasharray="6 4"' : '') + '/>');
      }
      s.points.forEach(function (p, j) {
        if (p.x === null || p.y === null) return;
        if (p.lo !== null && p.hi !== null) {
          svg.push('<line x1="' + X(p.x) + '" x2="' + X(p.x) + '" y1="' + Y(p.lo) + '" y2="' + Y(p.hi) + '" stroke="' +
                   s.color + '" stroke-opacity="0.5"/>');
        }
        svg.push('<circle class="pt" cx="' + X(p.x) + '" cy="' + Y(p.y) + '" r="' + (p.frontier ? 5 : 3.5) +
                 '" fill="' + s.color + '" fill-opacity="' + (p.frontier ? 1 : 0.55) + '"' +
                 (p.frontier ? ' stroke="#000" stroke-width="1"' : '') + ' data-series="' + i + '" data-index="' + j +
                 '"><title>' + esc(p.label) + '</title></circle>');
        drawn++;
      });
      svg.push('</g>');
    });
    svg.push('</svg>');
    var legend = spec.series.map(function (s, i) {
      return '<span data-series="' + i + '"><i style="background:' + s.color + '"></i>' + esc(s.name) + '</span>';
    }).join('');
    host.innerHTML = svg.join('') + '<div class="legend">' + legend + '</div>';
    host.querySelectorAll('circle.pt').forEach(function (c) {
      c.addEventListener('mousemove', function (ev) {
        var s = spec.series[+c.getAttribute('data-series')], p = s.points[+c.getAttribute('data-index')];
        var ci = (p.lo !== null && p.hi !== null) ? ' [' + fmt(p.lo) + ', ' + fmt(p.hi) + ']' : '';
        tip.innerHTML = '<b>' + esc(s.name) + '</b><br>' + esc(p.label) + '<br>' + esc(spec.xLabel) + ': ' + fmt(p.x) +
          '<br>' + esc(spec.yLabel) + ': ' + fmt(p.y) + esc(ci) + (p.frontier ? '<br>on the frontier' : '');
        tip.style.display = 'block';
        tip.style.left = (ev.clientX + 14) + 'px';
        tip.style.top = (ev.clientY + 10) + 'px';
      });
      c.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
    });
    host.querySelectorAll('.legend span').forEach(function (item) {
      item.addEventListener('click', function () {
        var g = host.querySelector('g.series[data-series="' + item.getAttribute('data-series') + '"]');
        var hidden = g.style.display === 'none';
        g.style.display = hidden ? '' : 'none';
        item.classList.toggle('off', !hidden);
      });
    });
    return drawn;
  }
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var charts = 0, points = 0;
  data.charts.forEach(function (spec) {
    var host = document.getElementById('chart-' + spec.name);
    if (!host) return;
    points += chart(spec, host);
    charts += 1;
  });
  document.body.setAttribute('data-rendered', String(charts));
  document.body.setAttribute('data-points', String(points));
  if (!document.body.hasAttribute('data-js-error')) {
    status.textContent = 'rendered ' + charts + ' charts, ' + points + ' points';
  }
})();
"""


def _embed(data: dict) -> str:
    """JSON inside <script type="application/json">: '</' escaped so no string ends the element."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")


def render_page(*, title: str, meta: list[str], notes: list[str], sections: list[tuple[str, str]],
                charts: list[dict]) -> str:
    """sections: (heading, inner HTML) in order; a chart's place is <div id="chart-NAME">
    inside some section's HTML (see chart_slot)."""
    meta_html = "".join(f"<div>{html.escape(m)}</div>" for m in meta)
    notes_html = ("<h2>Notes</h2><ul class=\"notes\">" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) +
                  "</ul>") if notes else ""
    body = "".join(f"<h2>{html.escape(h)}</h2>{inner}" for h, inner in sections)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1><div class=\"meta\">{meta_html}</div>"
            f"<div id=\"report-status\">the charts need JavaScript</div>{notes_html}{body}<div id=\"tip\"></div>"
            f"<script type=\"application/json\" id=\"report-data\">{_embed({'charts': charts})}</script>"
            f"<script>{SCRIPT}</script></body></html>\n")


def chart_slot(name: str, caption: str = "") -> str:
    cap = f'<p class="caption">{html.escape(caption)}</p>' if caption else ""
    return f'<div class="chart"><div id="chart-{html.escape(name)}"></div>{cap}</div>'
