"""Open a report.html in headless Chromium, take a screenshot, and check that the page
rendered its charts without script errors. By hand:

    apt-get install -y chromium        # Debian's package; or set LOOPLAB_CHROMIUM=/path/to/chrome
    python analysis/screenshot.py runs/beta/analysis/beta_ablation-*/report.html --out /tmp/report.png

Exit status 0 when the page is fine (prints what it found), 1 when a check fails
(prints which), 2 when there is no such file or no browser. The checks: the DOM after the page's
scripts ran (--dump-dom) carries data-rendered (charts drawn, at least one) and
data-points (points drawn, at least one) on <body>, which the page sets once every
Plotly.newPlot promise has resolved; no data-js-error (set by the page's error and
unhandledrejection handlers); as many Plotly graph divs (class js-plotly-plot) as
charts and as many placed markers (<path class="point" transform="translate(...)">)
as points; no console error; the screenshot decodes as a PNG that is not blank (many
distinct colours, at least 1% of pixels inked: text, axes, points). Chromium runs
with every host name unresolvable, so a page that needed the network would show it.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looplab.arguments import Parser, add_flags, flag, flags_of

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
TIMEOUT_S = 90


def find_browser() -> str | None:
    override = os.environ.get("LOOPLAB_CHROMIUM")
    if override:
        return override if Path(override).is_file() else None
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def run_browser(
    browser: str, args: list[str], profile: str, budget_ms: int = 10000, local: str | None = None
) -> subprocess.CompletedProcess:
    """Headless Chromium on args (a URL and --dump-dom, --screenshot=...), every host
    unresolvable but `local` (e.g. 127.0.0.1, a local server), the page's scripts given
    budget_ms of virtual time."""
    rules = "MAP * ~NOTFOUND" + (f", EXCLUDE {local}" if local else "")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        "--mute-audio",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        f"--host-resolver-rules={rules}",
        f"--virtual-time-budget={budget_ms}",
    ]
    return subprocess.run([browser, *flags, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)]


def _png_stats(path: Path) -> dict:
    from PIL import Image  # Pillow comes with matplotlib

    with Image.open(path) as image:
        rgb = image.convert("RGB")
        width, height = rgb.size
        raw = rgb.resize((max(1, width // 4), max(1, height // 4))).tobytes()
    pixels = [raw[i : i + 3] for i in range(0, len(raw), 3)]
    inked = sum(1 for r, g, b in pixels if r + g + b < 600) / len(pixels)  # text, axes, points: not background
    return {"width": width, "height": height, "distinct_colors": len(set(pixels)), "inked_fraction": inked}


def check_report(html_path, screenshot: Path | None = None, *, browser: str | None = None) -> dict:
    """Render html_path headless; returns what was found, with "problems": a list of
    failed checks (empty when the page is fine). Raises FileNotFoundError without the page
    or without a browser."""
    page = Path(html_path).resolve()
    if not page.is_file():  # before the browser: a missing page is not "no chart rendered"
        raise FileNotFoundError(
            f"report={str(html_path)!r} is invalid: no such file; allowed: a report.html a sweep or "
            "`python -m analysis --out DIR` wrote (the sweep's summary prints its path)"
        )
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError("no Chromium found (apt-get install -y chromium, or set LOOPLAB_CHROMIUM)")
    url = page.as_uri()
    with tempfile.TemporaryDirectory(prefix="looplab-chromium-") as profile:
        dom = run_browser(browser, ["--dump-dom", url], profile)
        shot = Path(screenshot) if screenshot else Path(profile) / "shot.png"
        pic = run_browser(browser, [f"--screenshot={shot}", "--window-size=1280,1800", url], profile)
        found: dict[str, Any] = {
            "dom_bytes": len(dom.stdout),
            "console_errors": _console_errors(dom.stderr + pic.stderr),
        }
        body = re.search(r"<body([^>]*)>", dom.stdout)
        attrs = dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', body.group(1))) if body else {}
        found["charts"] = int(attrs.get("data-rendered", "0") or 0)
        found["points"] = int(attrs.get("data-points", "0") or 0)
        found["js_error"] = attrs.get("data-js-error")
        # Counted in the serialized DOM, apart from the page's own count: Plotly marks each
        # graph div it drew and places each marker with a numeric translate (plotly.js's
        # source text, also in the dump, matches neither pattern).
        found["plots"] = len(re.findall(r'<div [^>]*class="[^"]*\bjs-plotly-plot\b', dom.stdout))
        found["markers"] = len(re.findall(r'<path class="point" transform="translate\([0-9.-]', dom.stdout))
        # What a reader meets first: the section headings in page order, and the legend
        # titles Plotly drew (each chart's "what the series vary in").
        found["headings"] = [html.unescape(h) for h in re.findall(r"<h2>(.*?)</h2>", dom.stdout)]
        found["legend_titles"] = [
            html.unescape(t).strip() for t in re.findall(r'<text class="legendtitletext"[^>]*>(.*?)</text>', dom.stdout)
        ]
        found["screenshot"] = str(shot) if screenshot else None
        found.update(_png_stats(shot) if shot.is_file() else {"distinct_colors": 0, "inked_fraction": 0.0})
    problems = []
    if dom.returncode != 0 or not dom.stdout:
        problems.append(f"chromium --dump-dom failed (status {dom.returncode}): {dom.stderr.strip()[-300:]}")
    if found["js_error"]:
        problems.append(f"script error in the page: {found['js_error']}")
    if found["console_errors"]:
        problems.append(f"console errors: {found['console_errors'][:3]}")
    if found["charts"] < 1:
        problems.append("no chart rendered (body has no data-rendered >= 1)")
    if found["plots"] < found["charts"]:
        problems.append(f"charts reported: {found['charts']}, Plotly graph divs in the DOM: {found['plots']}")
    if found["points"] < 1 or found["markers"] < found["points"]:
        problems.append(f"points reported: {found['points']}, placed markers in the DOM: {found['markers']}")
    if found["distinct_colors"] < 16 or found["inked_fraction"] < 0.01:
        problems.append(
            f"screenshot looks blank ({found['distinct_colors']} colours, {found['inked_fraction']:.2%} inked pixels)"
        )
    found["problems"] = problems
    return found


@dataclass(frozen=True)
class Check:
    """The command's arguments: the report, and --out."""

    report: str = flag(help="path to report.html", argument=True)
    out: str | None = flag(None, "where to save the screenshot (PNG)")


def main(argv: list[str] | None = None) -> int:
    p = Parser(description="Check that a looplab report renders in headless Chromium.")
    add_flags(p, Check)
    options = flags_of(Check, p.parse_args(argv))
    try:
        found = check_report(options.report, Path(options.out) if options.out else None)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key, value in found.items():
        if key != "problems":
            print(f"{key}: {value}")
    for problem in found["problems"]:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if found["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
