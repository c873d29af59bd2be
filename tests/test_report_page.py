"""The report's page reads at any size (issue 53, item 4): a chart of more β than a reader
tells apart is small multiples in the HTML as in the PNG, by one rule; the β axis' tick
labels are short, distinct and never on top of each other; plotly.js is one file beside
report.html, not inline, and the folder works wherever it is copied.

The store: one arm trained at seven β (a grid and a search's samples together: 0.05, 0.1,
0.179388, 0.183162, 0.243768, 0.25, 1), logged as the platform logs (tests/analysis_fixture.py).
"""

from __future__ import annotations

import json
import math
import re

import analysis_fixture as fx
import pytest

pytest.importorskip("polars")
pytest.importorskip("plotly")

BETAS = (0.05, 0.1, 0.179388, 0.183162, 0.243768, 0.25, 1.0)


@pytest.fixture(scope="module")
def seven(tmp_path_factory):
    from analysis.report import ReportOptions, build_report

    root = tmp_path_factory.mktemp("seven-betas")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    fx.log_sweep(uri, root, "seven", arms=("Ouro",), seeds=(0,), betas=BETAS)
    paths = build_report(uri, ["seven"], root / "report", ReportOptions(log_artifacts=False))
    page = paths["report.html"].read_text()
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page).group(1))
    return {"paths": paths, "page": page, "charts": {c["name"]: c["panels"] for c in data["charts"]}}


# ---- tick labels -------------------------------------------------------------------------------
def test_tick_labels_are_the_shortest_that_tell_the_values_apart():
    from analysis.charts import tick_labels

    labels = tick_labels([0.179388, 0.183162, 0.243768, 0.25])
    assert labels == ["0.179", "0.183", "0.244", "0.25"]
    assert len(set(labels)) == 4 and max(map(len, labels)) <= 5
    # three digits unless more are needed to keep two values apart; equal values stay equal
    assert tick_labels([0.1, 0.1001, 0.1]) == ["0.1", "0.1001", "0.1"]
    assert tick_labels([1e-4, 3e-4, 2.0]) == ["0.0001", "0.0003", "2"]


def test_ticks_too_close_to_read_apart_keep_one_label():
    """β at 0.05 … 1 on a log axis: 1.30 decades, an axis of 1.1 × that holding 60 label
    characters, 41.9 characters a decade. By hand, left to right: 0.179 is 23.3 characters
    from 0.05 (needs 5.5): kept; 0.183 is 0.4 from 0.179 (needs 6): left out; 0.244 is 5.6
    (needs 6): left out; 0.25 is 6.04 (needs 5.5): kept; 1 is 25.2 from 0.25: kept."""
    from analysis.charts import spaced_ticks, tick_labels

    values = [0.05, 0.179388, 0.183162, 0.243768, 0.25, 1.0]
    kept = spaced_ticks(list(zip(values, tick_labels(values))), log=True)
    assert kept == [(0.05, "0.05"), (0.179388, "0.179"), (0.25, "0.25"), (1.0, "1")]
    # on a linear axis of 0 … 1 the same labels sit 60 characters apart per unit
    linear = spaced_ticks([(0.0, "0"), (0.05, "0.05"), (0.5, "0.5"), (1.0, "1")])
    assert linear == [(0.0, "0"), (0.5, "0.5"), (1.0, "1")]  # 0.05 is 2.7 characters from 0 (needs 3.5)


def test_the_beta_axis_of_the_page_has_distinct_short_labels_apart(seven):
    (panel,) = seven["charts"]["axis"]
    xaxis = panel["figure"]["layout"]["xaxis"]
    labels, places = xaxis["ticktext"], xaxis["tickvals"]
    # as the unit test above, with 0.1 kept: 12.6 characters from 0.05, 10.6 from 0.179
    assert labels == ["0.05", "0.1", "0.179", "0.25", "1"] and places == [0.05, 0.1, 0.179388, 0.25, 1.0]
    decades = [math.log10(x) for x in places]
    span = (decades[-1] - decades[0]) * 1.1
    for (a, la), (b, lb) in zip(zip(decades, labels), zip(decades[1:], labels[1:])):
        assert (b - a) / span * 60 >= (len(la) + len(lb)) / 2 + 1, (la, lb)


# ---- small multiples -----------------------------------------------------------------------------
def test_a_frontier_of_seven_betas_is_small_multiples_in_the_html_too(seven):
    """7 β × 3 policies: the colours stand for β, one rule (LEGEND_HANDFUL, six) splits
    them 4 + 3 in the HTML as in the PNG, each β with all its policies, on one pair of
    axis ranges."""
    panels = seven["charts"]["frontier"]
    assert len(panels) == 2
    colours = [
        {
            t["marker"]["color"]
            for t in p["figure"]["data"]
            if t.get("legendgroup", "").startswith("group:") and "marker" in t
        }
        for p in panels
    ]
    groups = [
        {t["legendgroup"] for t in p["figure"]["data"] if t.get("legendgroup", "").startswith("group:")} for p in panels
    ]
    assert [len(g) for g in groups] == [4, 3] and not groups[0] & groups[1]
    assert [len(c) for c in colours] == [4, 3]  # a colour per β, six at most on a panel
    assert [p["figure"]["layout"]["title"]["text"].endswith(f"({i} of 2)") for i, p in enumerate(panels, 1)] == [
        True,
        True,
    ]
    ranges = [(p["figure"]["layout"]["xaxis"]["range"], p["figure"]["layout"]["yaxis"]["range"]) for p in panels]
    assert ranges[0] == ranges[1]
    from PIL import Image

    with Image.open(seven["paths"]["frontier.png"]) as png:
        width, _ = png.size
    with Image.open(seven["paths"]["axis.png"]) as one:
        single, _ = one.size
    assert width == 2 * single  # the PNG: the same two panels side by side


def test_one_threshold_for_the_png_and_the_html():
    from analysis import page, plots
    from analysis.charts import small_multiples

    assert plots.small_multiples is small_multiples and page.small_multiples is small_multiples


# ---- plotly.js beside the page ---------------------------------------------------------------------
def test_plotly_js_is_a_file_beside_the_page_not_inline(seven):
    from plotly.offline import get_plotlyjs

    page, bundle = seven["page"], get_plotlyjs()
    assert re.findall(r"<script src=[^>]*>", page) == ['<script src="plotly.min.js">']
    assert bundle[:1000] not in page and len(page) < len(bundle) // 10
    assert seven["paths"]["plotly.min.js"] == seven["paths"]["report.html"].parent / "plotly.min.js"
    assert seven["paths"]["plotly.min.js"].read_text() == bundle


def test_a_copy_of_the_report_folder_draws_every_panel(seven, tmp_path):
    import shutil

    from analysis.screenshot import check_report, find_browser

    if find_browser() is None:
        pytest.skip("no Chromium (apt-get install -y chromium, or set LOOPLAB_CHROMIUM)")
    folder = shutil.copytree(seven["paths"]["report.html"].parent, tmp_path / "moved")
    found = check_report(folder / "report.html")
    assert found["problems"] == [], found
    assert found["plots"] == sum(len(panels) for panels in seven["charts"].values())
