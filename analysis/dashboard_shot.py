"""Serve a store's MLflow dashboard and look at a sweep's view of it in headless Chromium:
what a new user sees at the URL a sweep prints (looplab/dashboard.py). By hand:

    python -m analysis.dashboard_shot --tracking-uri sqlite:///runs/beta/mlflow.db \
        --experiment beta_ablation-local --out dashboard.png

It starts `mlflow server` on a free local port (a tracking server's URI is used as it
is), opens the newest sweep run's view (or --sweep-run's), saves the screenshot and
prints what the rendered page shows: the view (runs table or GenAI overview), the
columns and the cells of the table. Exit status 0 when the runs table rendered with
rows, 1 when not, 2 when there is no browser.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator

from analysis.screenshot import find_browser, run_browser
from looplab import dashboard, dashboard_server, tracking
from looplab.arguments import add_flags, flag, flags_of

SERVER_START_S = 90  # `mlflow server` answers in ~9 s on a quiet machine
BUDGET_MS = 15000  # virtual time for the single-page app's requests and rendering
WINDOW = (1600, 820)
# What the rendered DOM says about the page: the runs table's footer and its cells, or the
# GenAI overview's charts.
RUNS_MARKER = "matching runs"
GENAI_MARKERS = ("Latency", "Overview")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(tracking_uri: str, port: int | None = None, log: Path | None = None) -> Iterator[str]:
    """The dashboard's base URL: a tracking server's own, or a local `mlflow server` over
    the store (looplab/dashboard_server.py: one worker, its process group stopped on exit)."""
    if dashboard.is_server(tracking_uri):
        yield tracking_uri.rstrip("/")
        return
    with dashboard_server.Server(tracking_uri, dashboard.LOCAL_HOST, port or free_port(), log) as server:
        server.wait_healthy(SERVER_START_S)  # else NotServing, a RuntimeError: the log's last line and path
        yield server.base


def sweep_route(tracking_uri: str, experiment: str, sweep_run: str | None = None) -> str:
    """The route of a sweep's view (the newest sweep run of the experiment by default)."""
    mc = tracking.client(tracking_uri)
    found = mc.get_experiment_by_name(experiment)
    if found is None:
        raise LookupError(f"no experiment {experiment!r} in {tracking_uri}")
    if sweep_run is None:
        runs = mc.search_runs(
            [found.experiment_id],
            filter_string=f"tags.{tracking.LEVEL} = '{tracking.SWEEP}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if not runs:
            raise LookupError(f"no sweep run in experiment {experiment!r}")
        sweep_run = runs[0].info.run_id
    name = mc.get_run(sweep_run).info.run_name  # the view's id (sweeps/sweep_record.SweepView)
    return dashboard.runs_route(found.experiment_id, name)


class _GridCells(HTMLParser):
    """Each grid cell's text, by column: a cell's link text where it has a link (the run
    name, beside its colour swatch's hex code), else all its text, whitespace collapsed.
    Only cells that hold a value (AG Grid's `ag-cell-value`), not the row's controls."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: dict[str, list[str]] = {}
        self.column: str | None = None
        self.depth = 0  # open elements inside the current cell
        self.text: list[str] = []
        self.link: list[str] | None = None  # the first link's text, once one opens
        self.in_link = False
        self.has_value = False

    def handle_starttag(self, tag, attrs):
        if self.column is None:
            a = dict(attrs)
            # (a digits-only id is the grid's own selection column, not a run's field)
            if a.get("role") == "gridcell" and a.get("col-id") and not a["col-id"].isdigit():
                self.column, self.depth, self.text, self.link, self.has_value = a["col-id"], 1, [], None, False
            return
        if "ag-cell-value" in (dict(attrs).get("class") or "").split():
            self.has_value = True
        if tag == "a" and self.link is None:
            self.link, self.in_link = [], True
        if tag not in VOID:
            self.depth += 1

    def handle_endtag(self, tag):
        if self.column is None:
            return
        if tag == "a":
            self.in_link = False
        self.depth -= 1
        if self.depth == 0:
            if self.has_value:
                words = " ".join(self.link if self.link is not None else self.text).split()
                self.found.setdefault(self.column, []).append(" ".join(words))
            self.column = None

    def handle_data(self, data):
        if self.column is not None:
            self.text.append(data)
            if self.in_link and self.link is not None:
                self.link.append(data)


def cells(dom: str) -> dict[str, list[str]]:
    """The runs table's cells by column id, e.g. {"params.`search.beta`": ["0.05", "0.25"]}."""
    parser = _GridCells()
    parser.feed(dom)
    return parser.found


def render(
    url: str, screenshot: Path | None = None, *, browser: str | None = None, window: tuple[int, int] = WINDOW
) -> dict:
    """The page at url after its scripts ran: "dom", "view" (runs | genai | unknown),
    "cells" (the runs table's), "screenshot" (its path, when asked for). Raises
    FileNotFoundError without a browser."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError("no Chromium found (apt-get install -y chromium, or set LOOPLAB_CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="looplab-chromium-") as profile:
        args = ["--dump-dom", f"--window-size={window[0]},{window[1]}", url]
        if screenshot is not None:
            Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
            args.insert(0, f"--screenshot={Path(screenshot).resolve()}")
        done = run_browser(browser, args, profile, budget_ms=BUDGET_MS, local=urllib.parse.urlsplit(url).hostname)
    dom = done.stdout
    view = "runs" if RUNS_MARKER in dom else "genai" if all(m in dom for m in GENAI_MARKERS) else "unknown"
    return {
        "dom": dom,
        "view": view,
        "cells": cells(dom),
        "status": done.returncode,
        "screenshot": str(screenshot) if screenshot is not None else None,
    }


@dataclass(frozen=True)
class Shot:
    """The command's options, each field its flag."""

    tracking_uri: str = flag(help="sqlite:///PATH (served here) or http://HOST:PORT")
    experiment: str = flag(help="the sweep's experiment, e.g. beta_ablation-local")
    sweep_run: str | None = flag(None, "the sweep run's id (default: the newest sweep run)")
    out: str = flag("docs/figures/dashboard.png", "where to save the screenshot (PNG)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Screenshot a sweep's MLflow dashboard view in headless Chromium.")
    add_flags(p, Shot)
    shot = flags_of(Shot, p.parse_args(argv))
    if find_browser() is None:
        print("error: no Chromium found (apt-get install -y chromium, or set LOOPLAB_CHROMIUM)", file=sys.stderr)
        return 2
    route = sweep_route(shot.tracking_uri, shot.experiment, shot.sweep_run)
    with serve(shot.tracking_uri) as base:
        found = render(dashboard.url(base, route), Path(shot.out))
    print(f"url: {dashboard.url(base, route)}\nview: {found['view']}\nscreenshot: {found['screenshot']}")
    for column, values in found["cells"].items():
        print(f"{column}: {', '.join(values)}")
    return 0 if found["view"] == "runs" and found["cells"] else 1


if __name__ == "__main__":
    sys.exit(main())
