"""The analysis layer: frontiers, seed aggregation and frontier areas against numbers
worked out by hand; and end to end, runs logged by looplab.tracking to a temporary
MLflow store (shaped like the platform's sweep > trial > stage tree, see
tests/analysis_fixture.py) → `python analysis/frontier.py` → files, artifacts, a
report that renders in headless Chromium (skipped without a browser). Downstream
evaluation runs (level eval) and zero-shot exit-rule metrics from the same fixture:
Fig. 3, Table 4, the downstream columns of Table 3 and App. E/F, the policy zoo."""

from __future__ import annotations

import csv
import html
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

pl = pytest.importorskip("polars")
pytest.importorskip("matplotlib")
pytest.importorskip("plotly")
pytest.importorskip("scipy")
pytest.importorskip("mlflow")

from analysis.aggregate import aggregate_seeds, choose_best_seeds, student_t_quantile  # noqa: E402
from analysis.frontier import (  # noqa: E402
    best_under_budget,
    frontier,
    frontier_area,
    frontier_gap,
    pareto_frontier,
)
from looplab import tracking  # noqa: E402
from looplab.policy import ExitPolicy  # noqa: E402
from looplab.tracking import parse_metric  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
import analysis_fixture as fx  # noqa: E402 (tests/ is on the path: conftest.py)


def pts(rows, labels=None):
    return pl.DataFrame(
        {
            "x": [float(r[0]) for r in rows],
            "y": [float(r[1]) for r in rows],
            "label": labels or [f"p{i}" for i in range(len(rows))],
        }
    )


def on(df):
    return sorted((r["x"], r["y"]) for r in df.filter("on_frontier").iter_rows(named=True))


# ---- frontier ----------------------------------------------------------------------


def test_frontier_removes_dominated_points():
    df = pts([(1, 0.5), (2, 0.4), (2, 0.7), (3, 0.6), (4, 0.9)])
    assert on(pareto_frontier(df, "x", "y")) == [(1, 0.5), (2, 0.7), (4, 0.9)]


def test_frontier_of_a_lower_is_better_quality():
    df = pts([(1, 30.0), (2, 12.0), (3, 15.0), (4, 11.0)])
    assert on(pareto_frontier(df, "x", "y", maximize=False)) == [(1, 30.0), (2, 12.0), (4, 11.0)]


def test_frontier_ties_are_deterministic():
    # equal compute: the better stays; equal quality: the cheaper stays
    assert on(pareto_frontier(pts([(2, 0.65), (2, 0.7), (3, 0.9), (4, 0.9)]), "x", "y")) == [(2, 0.7), (3, 0.9)]
    # exact duplicates: one stays, the same one whatever the input order (tie-break on label)
    for order in ([("b", 0), ("a", 1)], [("a", 0), ("b", 1)]):
        labels = [lab for lab, _ in order]
        kept = pareto_frontier(pts([(1, 0.5), (1, 0.5)], labels), "x", "y").filter("on_frontier")
        assert kept["label"].to_list() == ["a"]


def test_frontier_single_point_and_groups():
    assert on(pareto_frontier(pts([(3, 0.2)]), "x", "y")) == [(3.0, 0.2)]
    df = pts([(1, 0.1), (2, 0.3), (1, 0.4), (2, 0.2)]).with_columns(pl.Series("s", ["a", "a", "b", "b"]))
    flags = pareto_frontier(df, "x", "y", by="s").sort("s", "x")["on_frontier"].to_list()
    assert flags == [True, True, True, False]


def test_frontier_empty_input_says_so():
    with pytest.raises(ValueError, match="no points to build a frontier from"):
        pareto_frontier(pts([]), "x", "y")
    with pytest.raises(ValueError, match="none with both x and y"):
        pareto_frontier(pl.DataFrame({"x": [1.0, None], "y": [None, 2.0]}), "x", "y")
    with pytest.raises(ValueError, match="no column 'z'"):
        pareto_frontier(pts([(1, 1)]), "x", "z")


def test_frontier_area_by_hand():
    a = [(1, 0.5), (2, 0.7), (4, 0.9)]
    b = [(1, 0.4), (3, 0.8)]
    # shared range [1, 3]; steps: a - b = 0.1 on [1, 2), 0.3 on [2, 3)
    assert frontier_area(a, b) == pytest.approx(0.4)
    assert frontier_area(b, a) == pytest.approx(-0.4)
    # linear: a - b is 0.1 at 1, 0.1 at 2 (0.7 - 0.6), 0 at 3 (0.8 - 0.8): trapezoids 0.1 + 0.05
    assert frontier_area(a, b, interpolation="linear") == pytest.approx(0.15)
    gap = frontier_gap(a, b)
    assert (gap["lo"], gap["hi"], gap["mean_gap"]) == (1.0, 3.0, pytest.approx(0.2))
    # lower is better (perplexity): a is 10 lower over [1, 3]: +20, a is the better one
    assert frontier_area([(1, 20), (3, 10)], [(1, 30), (3, 20)], maximize=False) == pytest.approx(20.0)
    # dominated points do not count: (2, 0.1) is below a's frontier
    assert frontier_area(a + [(2, 0.1)], b) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="share no compute range"):
        frontier_area([(1, 0.5), (2, 0.6)], [(3, 0.5), (4, 0.6)])
    assert frontier_area([(2, 0.5)], [(2, 0.4)]) == 0.0  # a zero-width shared range


def test_best_under_budget():
    df = pts([(1, 0.5), (2, 0.7), (2, 0.7), (4, 0.9)], ["a", "c", "b", "d"])
    assert best_under_budget(df, "x", "y", 3)["label"] == "b"  # tie at (2, 0.7): the label order decides
    assert best_under_budget(df, "x", "y", 10)["label"] == "d"
    with pytest.raises(ValueError, match="cheapest needs 1"):
        best_under_budget(df, "x", "y", 0.5)
    assert frontier(df, "x", "y")["label"].to_list() == ["a", "b", "d"]


# ---- aggregation ---------------------------------------------------------------------


def test_student_t_quantiles_match_tables():
    # published two-sided critical values (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2)
    for df, value in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423)):
        assert student_t_quantile(0.975, df) == pytest.approx(value, abs=1e-4)
    assert student_t_quantile(0.95, 9) == pytest.approx(1.8331, abs=1e-4)
    assert student_t_quantile(0.025, 2) == pytest.approx(-4.3027, abs=1e-4)  # symmetric
    for p, df in ((0.975, 0), (1.0, 3), (0.0, 3)):  # scipy would answer nan (or ±inf)
        with pytest.raises(ValueError, match="needs 0 < p < 1 and df >= 1"):
            student_t_quantile(p, df)


def test_seed_aggregation_by_hand():
    df = pl.DataFrame(
        {
            "trial_config_hash": ["A", "A", "A", "B"],
            "seed": [0, 1, 2, 0],
            "accuracy": [0.6, 0.7, 0.8, 0.5],
            "ppl": [12.0, 11.0, None, 9.0],
        }
    )
    out = aggregate_seeds(df, ["accuracy", "ppl"], by=["trial_config_hash"]).sort("trial_config_hash")
    a, b = out.row(0, named=True), out.row(1, named=True)
    assert a["n_seeds"] == 3 and a["seeds"] == [0, 1, 2]
    assert a["accuracy"] == pytest.approx(0.7) and a["accuracy_std"] == pytest.approx(0.1)
    half = 4.302653 * 0.1 / math.sqrt(3)  # t(0.975, 2) · s / √n
    assert (a["accuracy_ci_low"], a["accuracy_ci_high"]) == (pytest.approx(0.7 - half), pytest.approx(0.7 + half))
    # a missing seed value is left out of that metric: ppl over 12 and 11 only, t(0.975, 1)
    assert a["ppl"] == pytest.approx(11.5) and a["ppl_std"] == pytest.approx(math.sqrt(0.5))
    assert a["ppl_ci_high"] == pytest.approx(11.5 + 12.706205 * math.sqrt(0.5) / math.sqrt(2))
    assert b["n_seeds"] == 1 and b["accuracy"] == 0.5 and b["accuracy_std"] is None and b["accuracy_ci_low"] is None


def test_best_of_seeds_by_hand():
    df = pl.DataFrame(
        {
            "trial_config_hash": ["A", "A", "A"],
            "seed": [0, 1, 2],
            "accuracy": [0.6, 0.8, 0.8],
            "ppl": [12.0, 11.0, 10.0],
        }
    )
    out = aggregate_seeds(df, ["accuracy", "ppl"], by=["trial_config_hash"], best_of_seeds="accuracy").row(
        0, named=True
    )
    # 0.8 twice: the lower seed wins, and its ppl comes with it
    assert (out["accuracy"], out["ppl"], out["chosen_seed"]) == (0.8, 11.0, 1)
    assert out["accuracy_ci_low"] is None and out["accuracy_std"] == pytest.approx(0.11547, abs=1e-5)
    points = pl.DataFrame(
        {
            "experiment": ["e"] * 4,
            "trial_config_hash": ["A"] * 4,
            "seed": [0, 0, 1, 1],
            "is_final_stage": [True] * 4,
            "policy": ["full", "skip", "full", "skip"],
            "accuracy": [0.5, 0.3, 0.6, 0.1],
        }
    )
    kept = choose_best_seeds(points, "accuracy")
    assert kept["seed"].unique().to_list() == [1] and kept.height == 2  # a seed's points stay together


def test_metric_names():
    def parsed(name):
        found = parse_metric(name)
        return None if found is None else (found[0].spec, found[1])

    assert parsed("skip_q0.4_ppl") == ("skip:0.4", "ppl")
    assert parsed("forced_d3_executed_loops") == ("forced:3", "executed_loops")
    assert parsed("val_accuracy") == ("full", "accuracy")
    assert parsed("skip_q0.4_lm_eval.piqa") == ("skip:0.4", "lm_eval.piqa")
    assert parsed("val_lm_eval.arc_easy") == ("full", "lm_eval.arc_easy")
    assert parsed("exit_entropy") is None and parsed("skip_q0.4_bogus") is None and parsed("lm_eval.piqa") is None


def test_writer_and_reader_share_the_metric_names(tmp_path):
    """A stage's evaluation record, logged by the platform's writer, read back by the
    analysis through the contract: renaming a metric on either side breaks this."""
    from analysis.load import load_runs
    from analysis.points import evaluation_points

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fx.log_sweep(uri, tmp_path, "contract", arms=("Ouro",), seeds=(0,))
    points = evaluation_points(load_runs(uri, ["contract"]))
    s1 = points.filter(pl.col("stage") == "stage1")
    skip = s1.filter((pl.col("policy") == "skip") & (pl.col("q") == 0.4)).row(0, named=True)
    expected = fx.point_values("Ouro", "stage1", 0, "skip", 0.4, None)
    assert skip["executed_loops"] == pytest.approx(expected["executed_loops"])
    assert skip["ppl"] == pytest.approx(expected["ppl"])
    full = s1.filter(pl.col("policy") == "full").row(0, named=True)
    assert full["ppl"] == pytest.approx(fx.point_values("Ouro", "stage1", 0, "full", None, None)["ppl"])
    assert set(s1["method"].to_list()) == {"Ouro"} and s1["stage_seconds"].to_list()[0] == 20.0


def test_zoo_points_are_their_own_series(tmp_path):
    """Zoo policies (skip-entropy:2.5, dense-kl:0.01, skip-stable:2), logged by the
    platform's writer next to the gate's skip:0.4, read back as points whose policy is
    the zoo kind (one series each), whose q holds the threshold and whose point label
    is the policy's own label."""
    from analysis.load import load_runs
    from analysis.points import evaluation_points
    from looplab import tracking
    from looplab.policy import ExitPolicy

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mc = tracking.client(uri)
    exp_id = tracking.ensure_experiment(mc, "zoo", tmp_path / "mlflow")
    cfg = fx.stage_configs("Ouro", 0, 0.25, tmp_path)[0]
    trial, _ = tracking.open_run(
        mc,
        exp_id,
        name="trial",
        tags=tracking.config_tags(cfg, level=tracking.TRIAL),
        key={tracking.LEVEL: tracking.TRIAL, tracking.STAGE_KEY: cfg.stage_key()},
        params=tracking.config_params(cfg),
    )
    specs = ["full", "skip:0.4", "skip-entropy:2.5", "skip-entropy:0.5", "dense-kl:0.01", "skip-stable:2"]
    tracking.log_record(
        mc,
        trial,
        {
            "kind": "eval",
            "step": 40,
            "policies": [{"policy": s, "ppl": 10.0 + i, "executed_loops": 1.0 + i / 10} for i, s in enumerate(specs)],
        },
    )
    tracking.close_run(mc, trial, ok=True)
    points = evaluation_points(load_runs(uri, ["zoo"]))
    got = {(r["policy"], r["q"]): (r["point"], r["ppl"], r["executed_loops"]) for r in points.iter_rows(named=True)}
    for i, spec in enumerate(specs[1:], start=1):
        policy = ExitPolicy.parse(spec)
        value = policy.q if policy.q is not None else policy.threshold
        assert got[(policy.kind, value)] == (policy.label, 10.0 + i, pytest.approx(1.0 + i / 10)), spec
    assert got[("skip-entropy", 2.5)][0] == "skip entropy<2.5" and got[("skip-stable", 2.0)][0] == "skip stable k=2"
    assert points.filter(pl.col("policy") == "skip").height == 1  # the gate's series holds the gate's points only


# ---- end to end -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    main = fx.log_sweep(uri, root, "chase-debug", lm_eval=True)
    # another sweep with other params (p-hop task, no lm-eval): the mixed-schema partner
    other = fx.log_sweep(
        uri, root, "phop-mixed", arms=("Ouro",), seeds=(0,), preset="phop-debug", extra={"model.n_loops": 4}
    )
    fx.log_untrained_sweep(uri, root, "no-eval")
    fx.log_history(uri, root, "history")
    return {"uri": uri, "root": root, "main": main, "other": other}


def cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, str(REPO / "analysis" / "frontier.py"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        check=False,
    )


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def report(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    # from another working directory, as a researcher would run it
    done = cli(
        "--tracking-uri",
        store["uri"],
        "--experiment",
        "chase-debug",
        "--out",
        str(out),
        "--quality",
        "accuracy",
        cwd=tmp_path_factory.mktemp("elsewhere"),
    )
    assert done.returncode == 0, done.stderr
    return out, done.stdout


def test_cli_writes_every_file(report):
    out, stdout = report
    for name in (
        "frontier.csv",
        "points.csv",
        "aggregated.csv",
        "frontier_areas.csv",
        "report.html",
        "frontier.png",
        "skip_ppl.png",
        "beta_exit_entropy.png",
        "beta_expected_exit_step.png",
        "tables/tables.md",
        "tables/iso_table.md",
        "tables/iso_table.csv",
        "tables/threshold_sweep.md",
        "tables/fixed_loop.csv",
        "tables/skip_vs_full.md",
        "tables/beta_ablation.csv",
        "loops.csv",
        "loops_hidden_norm.png",
        "loops_grad_norm.png",
        "loops_active.png",
        "loops_state_gap.png",
    ):
        assert (out / name).is_file(), name
        assert str(out / name) in stdout  # printed where it is


def test_per_loop_instruments_by_hand(report):
    rows = read_csv(report[0] / "loops.csv")

    def value(method, stage, policy, loop, quantity, q=""):
        (row,) = [
            r
            for r in rows
            if (r["method"], r["stage"], r["policy"], r["loop"], r["quantity"], r["q"])
            == (method, stage, policy, str(loop), quantity, q)
        ]
        return float(row["value"]), int(row["n"])

    # hidden norm r + 0.1 seed, seeds 0 and 1 pooled; the pre-training both arms share counts once per seed
    assert value("fixed", "pretrain", "full", 2, "hidden_norm") == (pytest.approx(2.05), 2)
    assert value("Ouro", "stage1", "full", 3, "grad_norm") == (pytest.approx(1 / 3), 2)
    assert not [r for r in rows if r["stage"] == "stage2" and r["quantity"] == "grad_norm"]  # Stage-2: gate only
    assert value("Ouro", "stage2", "skip", 3, "state_gap", "0.2")[0] == pytest.approx(0.5 * 0.8)
    assert value("CHASE", "stage2", "skip", 3, "state_gap", "0.2")[0] == pytest.approx(0.1 * 0.8)
    assert value("CHASE", "stage2", "skip", 1, "active", "0.4")[0] == pytest.approx(1.0)


def test_points_csv_matches_logged_runs(report):
    rows = read_csv(report[0] / "points.csv")
    # 2 arms × 2 seeds; Ouro: pretrain (full + forced 1..3: depth R is full depth, logged
    # once) + stage1, stage2 (the same + 10 gated); CHASE has one more gated stage
    assert len(rows) == 2 * (4 + 2 * 14) + 2 * (4 + 3 * 14)
    for arm in ("Ouro", "CHASE"):
        for seed in (0, 1):
            for stage in fx.ARMS[arm]:
                for row in (r for r in rows if r["method"] == arm and r["seed"] == str(seed) and r["stage"] == stage):
                    mode = row["policy"]
                    q = float(row["q"]) if row["q"] else None
                    depth = int(row["depth"]) if row["depth"] else None
                    want = fx.point_values(arm, stage, seed, mode, q, depth)
                    assert float(row["accuracy"]) == pytest.approx(want["accuracy"]), row["point"]
                    assert float(row["ppl"]) == pytest.approx(want["ppl"]), row["point"]
                    assert float(row["executed_loops"]) == pytest.approx(want["executed_loops"]), row["point"]


def test_frontier_csv_by_hand(report):
    rows = read_csv(report[0] / "frontier.csv")
    chase_skip = sorted((r for r in rows if r["series"] == "CHASE · skip"), key=lambda r: float(r["compute"]))
    # q = 0.4: executed 2.5; accuracy 0.39 (seed 0) and 0.41 (seed 1)
    q04 = next(r for r in chase_skip if r["q"] == "0.4")
    assert float(q04["compute"]) == pytest.approx(2.5) and float(q04["quality"]) == pytest.approx(0.40)
    half = 12.706205 * math.sqrt(0.0002) / math.sqrt(2)  # t(0.975, 1) · s / √2, s = std(0.39, 0.41)
    assert float(q04["quality_ci_high"]) == pytest.approx(0.40 + half, abs=1e-6)
    assert q04["n_seeds"] == "2" and q04["quality_metric"] == "accuracy"
    assert [r["on_frontier"] for r in chase_skip] == ["true"] * 5  # accuracy rises with every extra loop
    dense = [r for r in rows if r["series"] == "Ouro · dense"]  # all at 4 loops: only the best q survives
    assert [r["q"] for r in dense if r["on_frontier"] == "true"] == ["1.0"]
    assert {r["series"] for r in rows} == {
        "CHASE · dense",
        "CHASE · forced",
        "CHASE · skip",
        "Ouro · dense",
        "Ouro · forced",
        "Ouro · skip",
    }


def test_frontier_areas_csv_by_hand(report):
    rows = {(r["series_a"], r["series_b"]): r for r in read_csv(report[0] / "frontier_areas.csv")}
    # CHASE skip vs Ouro skip over loops [2, 4], steps at 2, 2.5, 3, 3.5 (seed means):
    # CHASE 0.38 + 0.02 k, Ouro 0.14 + 0.08 k (k = 0..4); gaps 0.24, 0.18, 0.12, 0.06, each over 0.5
    area = float(rows[("CHASE · skip", "Ouro · skip")]["area"])
    assert area == pytest.approx(0.5 * (0.24 + 0.18 + 0.12 + 0.06))


def test_png_is_a_real_plot(report):
    from PIL import Image

    from analysis.screenshot import _png_stats

    for name in ("frontier.png", "skip_ppl.png", "beta_exit_entropy.png"):
        with Image.open(report[0] / name) as image:
            assert image.format == "PNG"
        stats = _png_stats(report[0] / name)
        assert stats["width"] > 400 and stats["height"] > 300
        assert stats["distinct_colors"] > 20, name  # axes, text, coloured series: not a blank canvas


def test_html_needs_no_network(report):
    from plotly.offline import get_plotlyjs

    text = (report[0] / "report.html").read_text()
    # plotly.js is the file beside the page, loaded by its name alone: once, never inline
    assert re.findall(r"<script src=[^>]*>", text) == ['<script src="plotly.min.js">']
    assert (report[0] / "plotly.min.js").read_text() == get_plotlyjs()
    bundle = get_plotlyjs()
    assert bundle[:1000] not in text and bundle[-1000:] not in text
    assert "<link" not in text and "@import" not in text
    # plotly.js's own source names URLs (geo topojson, Plotly Cloud) that scatter charts
    # never fetch (the Chromium check runs with every host unresolvable); the page names
    # none, and the "Share chart" (upload to Plotly Cloud) button is off.
    page = text
    assert "http://" not in page and "https://" not in page and "url(" not in page
    assert '"showSendToCloud": false' in page
    assert 'id="report-data"' in text and 'id="chart-frontier"' in text
    assert "PIQA" in text and "Avg." in text  # lm-eval columns appear when the runs logged them


def test_plotly_figure_from_a_chart_spec():
    from analysis.charts import ChartSpec, Point, Series
    from analysis.page import figure

    a = Series(
        "A",
        "#111111",
        [Point(1.0, 0.5, "a<1>", 0.4, 0.7, True), Point(2.0, 0.4, "a2"), Point(3.0, 0.9, "a3", on_frontier=True)],
        line=[(1.0, 0.5), (3.0, 0.9)],
        shape="step",
    )
    b = Series("B", "#222222", [Point(2.0, math.nan, "lost"), Point(2.0, 0.3, "b")], shape="linear")
    spec = ChartSpec("t", "T", "loops", "acc", [a, b], log_y=True, hlines=[(0.8, "ref"), (math.inf, "none")])
    fig = figure(spec).to_plotly_json()
    line, marks, b_marks, ref = fig["data"]  # A's line, A's markers, B's markers (no line), one finite hline
    # A's line and markers toggle together; the legend entry is the markers'
    assert line["mode"] == "lines" and line["line"]["shape"] == "hv" and line["showlegend"] is False
    assert line["legendgroup"] == marks["legendgroup"] != b_marks["legendgroup"]
    assert (list(line["x"]), list(line["y"])) == ([1.0, 3.0], [0.5, 0.9])
    assert marks["mode"] == "markers" and list(marks["x"]) == [1.0, 2.0, 3.0]
    # frontier points larger and outlined
    assert list(marks["marker"]["size"]) == [10, 7, 10]
    assert [w > 0 for w in marks["marker"]["line"]["width"]] == [True, False, True]
    # the seed interval [0.4, 0.7] around 0.5 as asymmetric bars: +0.2, -0.1; none elsewhere
    err = marks["error_y"]
    assert err["array"][0] == pytest.approx(0.2) and err["arrayminus"][0] == pytest.approx(0.1)
    assert list(err["array"][1:]) == [None, None] and list(err["arrayminus"][1:]) == [None, None]
    hover = marks["hovertext"][0]
    assert hover == "<b>A</b><br>a&lt;1&gt;<br>loops: 1<br>acc: 0.5 [0.4, 0.7]<br>on the frontier"
    assert "on the frontier" not in marks["hovertext"][1]
    # a non-finite y is not drawn; no interval, no error bars
    assert list(b_marks["x"]) == [2.0] and "error_y" not in b_marks
    # the reference line spans the drawn x range, dashed, named with its value
    assert (list(ref["x"]), list(ref["y"]), ref["name"]) == ([1.0, 3.0], [0.8, 0.8], "ref (0.8)")
    assert ref["line"]["dash"] == "dash"
    assert fig["layout"]["yaxis"]["type"] == "log" and fig["layout"]["xaxis"]["title"]["text"] == "loops"


def test_speed_chart_draws_each_timings_spread_over_repeats(tmp_path):
    """The prefill chart's x is tokens/s = batch · L / median time; its bar runs from the
    slowest repeat to the fastest (batch · L / max time, / min time), in both renderers;
    a run logged before repeats kept their times has no bar."""
    import polars as pl

    from analysis.bench import IDENTITY, PPL_FULL, QUALITY, SPEED, speed_chart
    from analysis.page import figure
    from analysis.plots import render_png

    tokens = 2 * 64
    rows = []
    for policy, ts, lo, hi, ppl in (("skip:0.2", 0.5, 0.4, 0.8, 12.0), ("skip:0.6", 0.25, None, None, 15.0)):
        rows.append(
            {
                "experiment": "e",
                "checkpoint": "stage2-k",
                "method": "CHASE",
                "stage": "stage2",
                "stage_key": "k",
                "device": "cpu",
                "batch": 2,
                "seq_len": 64,
                "policy": policy,
                "dtype": "fp32",
                "packing": "varlen",
                "executed_loops": 3.0 if policy == "skip:0.2" else 2.0,
                "time_full_s": 1.0,
                "time_skip_s": ts,
                "tokens_per_s_full": tokens / 1.0,
                "tokens_per_s_skip": tokens / ts,
                "tokens_per_s_full_min": tokens / 2.0,
                "tokens_per_s_full_max": tokens / 0.9,
                "tokens_per_s_skip_min": None if hi is None else tokens / hi,
                "tokens_per_s_skip_max": None if lo is None else tokens / lo,
                "speedup": 1.0 / ts,
                "speedup_min": None,
                "speedup_max": None,
                "loop_bound": 1.5,
                "flop_ratio": 1.4,
                "of_flop_ratio": 1.0,
                PPL_FULL: 10.0,
                "ppl": ppl,
                "val_executed_loops": 3.0,
            }
        )
    table = pl.DataFrame(rows).select(*IDENTITY, *SPEED, *QUALITY)
    (series,) = speed_chart(table).series
    full, slow, fast = series.points
    assert (full.x, full.x_lo, full.x_hi) == (128.0, 64.0, pytest.approx(128 / 0.9))
    assert (slow.x, slow.x_lo, slow.x_hi) == (256.0, 160.0, 320.0)
    assert fast.x == 512.0 and fast.x_lo is None and fast.x_hi is None
    marks = figure(speed_chart(table)).to_plotly_json()["data"][-1]
    err = marks["error_x"]
    assert list(err["array"]) == [pytest.approx(128 / 0.9 - 128), 64.0, None]
    assert list(err["arrayminus"]) == [64.0, 96.0, None] and "error_y" not in marks
    assert render_png(speed_chart(table), tmp_path / "speed.png").is_file()


def test_artifacts_on_the_sweep_run(report, store):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store["uri"])
    names = {a.path for a in client.list_artifacts(store["main"]["sweep_run"], "analysis")}
    assert {"analysis/report.html", "analysis/frontier.csv", "analysis/frontier.png", "analysis/tables"} <= names
    assert "artifacts: logged to run " + store["main"]["sweep_run"] in report[1]


def test_tables_have_the_paper_shape(report):
    tables = (report[0] / "tables" / "tables.md").read_text()
    assert "| Arch. | Model | Params / FLOPs | PPL | Acc. (%) | n |" in tables
    assert "| mamba2 | Loop (1⊗4) | 1× / 4× | 6.75 ± 0.71 | 41.00 ± 1.41 | 2 |" in tables  # ppl 6.25 and 7.25
    threshold = read_csv(report[0] / "tables" / "threshold_sweep.csv")
    chase = [
        r for r in threshold if r["label"].startswith("CHASE") and r["stage"] == "stage2" and r["policy"] == "skip"
    ]
    assert [r["q"] for r in chase] == ["1.0", "0.8", "0.6", "0.4", "0.2"]  # as in App. F
    q04 = next(r for r in chase if r["q"] == "0.4")
    # lm-eval: skip at q=0.4 logged the seven tasks; Avg. is their mean (both seeds: 0.30..0.36 + 0.01 s - 0.01)
    assert float(q04["lm_eval.piqa"]) == pytest.approx(0.295)
    assert float(q04["lm_eval_avg"]) == pytest.approx(0.325)
    skip = read_csv(report[0] / "tables" / "skip_vs_full.csv")
    ouro = next(r for r in skip if r["label"].startswith("Ouro") and r["q"] == "0.2")
    assert float(ouro["delta_ppl_pct"]) == pytest.approx((50.5 / 6.75 - 1) * 100)  # skip 50.5 against full 6.75
    assert float(ouro["ideal_speedup"]) == pytest.approx(2.0)


def test_lm_eval_columns_absent_without_lm_eval(store, tmp_path):
    done = cli("--tracking-uri", store["uri"], "--experiment", "phop-mixed", "--out", str(tmp_path), "--no-log")
    assert done.returncode == 0, done.stderr
    tables = (tmp_path / "tables" / "tables.md").read_text()
    assert "PIQA" not in tables and "Avg." not in tables
    assert "PPL" not in tables.split("### Exit-gate")[0]  # p-hop: accuracy, no perplexity column


def one_line_error(done):
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_unknown_experiment(store, tmp_path):
    line = one_line_error(cli("--tracking-uri", store["uri"], "--experiment", "nope", "--out", str(tmp_path)))
    assert "unknown experiment 'nope'" in line and "chase-debug" in line and "phop-mixed" in line


def test_missing_metrics(store, tmp_path):
    line = one_line_error(cli("--tracking-uri", store["uri"], "--experiment", "no-eval", "--out", str(tmp_path)))
    assert "no evaluation metrics" in line and "loss" in line
    line = one_line_error(
        cli(
            "--tracking-uri",
            store["uri"],
            "--experiment",
            "phop-mixed",
            "--out",
            str(tmp_path),
            "--quality",
            "lm_eval_avg",
            "--no-log",
        )
    )
    assert "no run logged 'lm_eval_avg'" in line


def test_mixed_schema(store, tmp_path):
    # params differ (text vs p-hop task): analysed together with null columns and a note
    done = cli(
        "--tracking-uri",
        store["uri"],
        "--experiment",
        "chase-debug",
        "--experiment",
        "phop-mixed",
        "--out",
        str(tmp_path / "both"),
        "--no-log",
    )
    assert done.returncode == 0, done.stderr
    assert "note: mixed schemas" in done.stdout
    rows = read_csv(tmp_path / "both" / "points.csv")
    assert {r["experiment"] for r in rows} == {"chase-debug", "phop-mixed"}
    # a quality one experiment lacks: a one-line error naming it
    line = one_line_error(
        cli(
            "--tracking-uri",
            store["uri"],
            "--experiment",
            "chase-debug",
            "--experiment",
            "phop-mixed",
            "--out",
            str(tmp_path / "x"),
            "--quality",
            "lm_eval_avg",
            "--no-log",
        )
    )
    assert "mixed schemas" in line and "'phop-mixed'" in line


def test_no_store_and_bad_sweep_run(store, tmp_path):
    line = one_line_error(
        cli("--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}", "--experiment", "x", "--out", str(tmp_path))
    )
    assert "an existing MLflow store" in line
    line = one_line_error(cli("--tracking-uri", store["uri"], "--sweep-run", "0" * 32, "--out", str(tmp_path)))
    assert "no run" in line


def test_build_report_survives_missing_metrics(store, tmp_path):
    from analysis.report import ReportOptions, build_report

    paths = build_report(store["uri"], ["no-eval"], tmp_path, ReportOptions(log_artifacts=False))
    notes = paths["notes.txt"].read_text()
    assert "no evaluation metrics" in notes and paths["report.html"].is_file()
    assert "frontier.csv" not in paths


def test_sweep_scope_and_last_vs_best(store):
    from analysis.load import load_runs
    from analysis.points import evaluation_points

    runs = load_runs(store["uri"], sweep_run_id=store["other"]["sweep_run"])
    assert set(runs.experiments.values()) == {"phop-mixed"}
    assert runs.runs.height == 1 + 1 + 3  # the sweep run, its trial, the trial's stages
    # val_ppl logged 8.0 then 9.0, val_accuracy 0.5 then 0.4: last and best kept apart
    row = evaluation_points(load_runs(store["uri"], ["history"])).row(0, named=True)
    assert (row["ppl"], row["ppl_best"], row["accuracy"], row["accuracy_best"]) == (9.0, 8.0, 0.4, 0.5)
    loss = load_runs(store["uri"], ["history"]).metrics.filter(pl.col("key") == "loss").row(0, named=True)
    assert (loss["last"], loss["best"], loss["min"], loss["max"], loss["count"]) == (2.5, 2.0, 2.0, 3.0, 3)


def test_client_backend_reads_the_same_values(store):
    from analysis.load import load_runs
    from analysis.points import evaluation_points

    runs = load_runs(store["uri"], ["chase-debug"], backend="client")
    points = evaluation_points(runs)
    row = points.filter(
        (pl.col("method") == "CHASE")
        & (pl.col("seed") == 1)
        & (pl.col("stage") == "stage2")
        & (pl.col("point") == "skip q=0.4")
    ).row(0, named=True)
    assert (row["accuracy"], row["executed_loops"]) == (pytest.approx(0.41), pytest.approx(2.5))
    assert any("best values only for" in n for n in runs.notes)


def test_screenshot_of_a_missing_report_says_no_such_file(tmp_path):
    """Said before any browser is looked for, so the same with or without Chromium."""
    missing = tmp_path / "analysis" / "report.html"
    script = Path(__file__).resolve().parents[1] / "analysis" / "screenshot.py"
    done = subprocess.run([sys.executable, str(script), str(missing)], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and "no such file" in done.stderr and str(missing) in done.stderr, done.stderr


@pytest.mark.slow  # 15 s: Chromium over the whole report (the β and downstream reports' checks stay in the suite)
def test_report_renders_in_headless_chromium(report, tmp_path):
    import shutil

    from analysis.screenshot import check_report, find_browser

    if find_browser() is None:
        pytest.skip("no Chromium (apt-get install -y chromium, or set LOOPLAB_CHROMIUM)")
    # the folder is the report: a copy of it elsewhere draws every chart
    folder = shutil.copytree(report[0], tmp_path / "copied")
    found = check_report(folder / "report.html", tmp_path / "shot.png")
    assert found["problems"] == [], found
    # frontier, skip, two β charts and the four per-loop instruments
    assert found["charts"] == 8 and found["points"] >= 30
    assert found["plots"] == 8 and found["markers"] == found["points"]
    text = (folder / "report.html").read_text()
    # the check does catch a page whose script throws
    hook = "var charts = JSON.parse("
    assert text.count(hook) == 1
    broken = folder / "broken.html"
    broken.write_text(text.replace(hook, "nope(); " + hook))
    assert any("script error" in p for p in check_report(broken)["problems"])
    # and the page alone, without plotly.min.js beside it (as MLflow's artifact view serves
    # it): nothing drawn, and it says why
    alone = tmp_path / "alone" / "report.html"
    alone.parent.mkdir()
    alone.write_text(text)
    problems = check_report(alone)["problems"]
    assert any("plotly.min.js did not load" in p for p in problems), problems
    assert any("no chart rendered" in p for p in problems), problems


# ---- downstream evaluations (level eval) and the policy zoo ------------------------------------
@pytest.fixture(scope="module")
def downstream(tmp_path_factory):
    """A store with the fixture sweep plus its downstream evaluation runs (written by the
    platform's writer), a sweep with zero-shot rule metrics, and a superseded evaluation;
    the reports of the first two."""
    from analysis.report import ReportOptions, build_report

    root = tmp_path_factory.mktemp("downstream")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    logged = fx.log_sweep(uri, root, "downstream-debug")
    written = fx.log_evaluations(uri, root, "downstream-debug", logged)
    zoo = fx.log_sweep(uri, root, "zoo-debug", seeds=(0,))
    fx.log_zoo_rules(uri, zoo)
    reports = {
        name: build_report(uri, [name], root / name, ReportOptions(log_artifacts=False))
        for name in ("downstream-debug", "zoo-debug")
    }
    return {"uri": uri, "root": root, "logged": logged, "written": written, "reports": reports}


def test_evaluation_runs_attach_to_every_stage_run_of_their_key(downstream):
    from analysis.load import load_runs
    from analysis.points import evaluation_points

    # pretrain: forced 1..3 + full, once (shared by 2 trials per seed); 2 final stage2 × 10 policies; × 2 tasks × 2 seeds
    assert downstream["written"] == 2 * 2 * (4 + 2 * 10)
    points = evaluation_points(load_runs(downstream["uri"], ["downstream-debug"]))
    pre = points.filter((pl.col("stage") == "pretrain") & (pl.col("policy") == "forced"))
    # each trial's pretrain run (both reuse one training) shows the evaluations of that stage key
    assert pre.height == 2 * 2 * 3 and pre["trial_run_id"].n_unique() == 4
    for r in pre.iter_rows(named=True):
        want = [
            fx.downstream_accuracy(r["method"], "pretrain", r["seed"], ExitPolicy.forced(r["depth"]), i)
            for i in range(2)
        ]
        assert (r["lm_eval.piqa"], r["lm_eval.arc_easy"]) == (pytest.approx(want[0]), pytest.approx(want[1]))
        assert r["lm_eval_avg"] == pytest.approx(sum(want) / 2)
        assert r["lm_eval_loops"] == r["depth"] and r["lm_eval_flops"] == 1000.0 * r["depth"]
        # the pre-training stage evaluates its forced depths on the validation set too (the fixed-depth curve)
        assert r["ppl"] == pytest.approx(100.0 / r["depth"] ** 2 + r["seed"]) and r["executed_loops"] == r["depth"]
    # downstream executed loops stay apart from the validation set's
    skip = points.filter((pl.col("stage") == "stage2") & (pl.col("point") == "skip q=0.4")).row(0, named=True)
    assert (skip["executed_loops"], skip["lm_eval_loops"]) == (pytest.approx(2.5), pytest.approx(2.44))
    assert skip["lm_eval_loops.piqa"] == pytest.approx(2.44) and skip["lm_eval_seconds"] == pytest.approx(1.22)


def test_fig3_downstream_accuracy_against_executed_loops_by_hand(downstream):
    rows = read_csv(downstream["root"] / "downstream-debug" / "downstream.csv")
    assert {r["series"] for r in rows} == {
        "forced depth (1⊗4)",
        "Ouro · dense",
        "Ouro · skip",
        "CHASE · dense",
        "CHASE · skip",
    }
    # the pre-trained model at forced depths 1..4 (full as 4), once: accuracy 0.25 + 0.02 d + 0.01 seed + 0.01 task,
    # averaged over the two tasks (+0.005) and seeds 0, 1 (+0.005)
    forced = sorted((r for r in rows if r["series"].startswith("forced")), key=lambda r: float(r["compute"]))
    assert [(float(r["compute"]), round(float(r["quality"]), 6)) for r in forced] == [
        (1.0, 0.28),
        (2.0, 0.30),
        (3.0, 0.32),
        (4.0, 0.34),
    ]
    # CHASE skip at q = 0.6: 1.4 + 2.6 q loops on the tasks; 0.34 + 0.005 + 0.01 seed, per seed 0.345 and 0.355
    q06 = next(r for r in rows if r["series"] == "CHASE · skip" and r["q"] == "0.6")
    assert float(q06["compute"]) == pytest.approx(2.96) and float(q06["quality"]) == pytest.approx(0.35)
    half = 12.706205 * math.sqrt(0.00005) / math.sqrt(2)  # t(0.975, 1) · s / √2, s = std(0.345, 0.355)
    assert float(q06["quality_ci_high"]) == pytest.approx(0.35 + half, abs=1e-6) and q06["n_seeds"] == "2"
    assert (downstream["root"] / "downstream-debug" / "downstream.png").is_file()
    # the report's own frontier, on the downstream average, reads the loops run on the tasks too
    frontier = read_csv(downstream["root"] / "downstream-debug" / "frontier.csv")
    assert {(r["quality_metric"], r["compute_metric"]) for r in frontier} == {("lm_eval_avg", "lm_eval_loops")}


def test_downstream_table_columns_by_hand(downstream):
    tables = downstream["root"] / "downstream-debug" / "tables"
    # Table 4: fixed full; per gated method and execution the q with the best Avg. (skip: below R loops)
    # and the paper's representative q = 0.8, one row when they agree, the Choice column saying which
    picks = {(r["label"].split()[0], r["policy"], r["choice"]): r for r in read_csv(tables / "exit_gate.csv")}
    both = "q=0.8 and best Avg."
    assert {k: picks[k]["q"] for k in picks} == {
        ("fixed", "full", ""): "",
        ("CHASE", "dense", both): "0.8",
        ("CHASE", "skip", "best Avg."): "0.6",
        ("CHASE", "skip", "q=0.8 (the paper's)"): "0.8",
        ("Ouro", "dense", both): "0.8",
        ("Ouro", "skip", both): "0.8",
    }
    assert float(picks[("CHASE", "skip", "best Avg.")]["lm_eval_avg"]) == pytest.approx(0.35)
    assert float(picks[("Ouro", "skip", both)]["exec_loops"]) == pytest.approx(
        3.48
    )  # 0.26 + ...: the best that saves loops
    assert float(picks[("fixed", "full", "")]["lm_eval_avg"]) == pytest.approx(0.34)
    # App. E: the pre-trained model's forced depths, downstream, each depth once
    fixed = [r for r in read_csv(tables / "fixed_loop.csv") if r["stage"] == "pretrain"]
    assert [(r["depth"], round(float(r["lm_eval_avg"]), 6)) for r in fixed] == [
        ("1", 0.28),
        ("2", 0.30),
        ("3", 0.32),
        ("4", 0.34),
    ]
    assert {r["label"] for r in fixed} == {"fixed 1⊗4"}
    # App. F: the tasks and the loops executed on them beside the validation columns
    g = next(
        r
        for r in read_csv(tables / "threshold_sweep.csv")
        if r["label"].startswith("CHASE") and r["stage"] == "stage2" and r["policy"] == "skip" and r["q"] == "0.4"
    )
    assert float(g["lm_eval_loops"]) == pytest.approx(2.44) and float(g["executed_loops"]) == pytest.approx(2.5)
    assert float(g["lm_eval_avg"]) == pytest.approx(0.34)  # 0.34 - 0.25 · 0.2² + 0.005 + 0.005
    # Table 3: the pre-trained model at full depth with its task columns
    md = (tables / "tables.md").read_text()
    assert "| Arch. | Model | Params / FLOPs | PPL | Acc. (%) | PIQA | ARC-E | Avg. | n |" in md
    assert "| Model | Exit | q | Choice | Exec. | PPL | PIQA | ARC-E | Avg. | n |" in md


def test_policy_zoo_against_the_learned_gate_by_hand(downstream):
    from looplab.tracking import METRIC_PATTERN

    # the zoo's prefixes and the gate's parse with one pattern (the gate's rule group is empty)
    for name, rule, value in (
        ("skip_entropy2.5_accuracy", "entropy", "2.5"),
        ("dense_kl0.01_ppl", "kl", "0.01"),
        ("skip_stable2_executed_loops", "stable", "2"),
        ("skip_q0.4_ppl", None, "0.4"),
    ):
        m = METRIC_PATTERN.match(name)
        assert (m["rule"], m["q"]) == (rule, value)
    rows = {(r["method"], r["rule"]): r for r in read_csv(downstream["root"] / "zoo-debug" / "zoo.csv")}
    assert set(rows) == {
        ("CHASE", "skip-entropy"),
        ("CHASE", "dense-kl"),
        ("Ouro", "skip-entropy"),
        ("Ouro", "dense-kl"),
    }
    # CHASE: gate skip (loops 1.5 + 2.5 q, accuracy 0.29 + 0.04 loops) against the rule (loops 4 - t, 0.05 lower)
    # over [2, 3.5]: steps 0.37-0.32, 0.39-0.32, 0.41-0.36, each 0.5 wide
    chase = rows[("CHASE", "skip-entropy")]
    assert float(chase["area"]) == pytest.approx(0.5 * (0.05 + 0.07 + 0.05))
    assert (float(chase["compute_from"]), float(chase["compute_to"])) == (2.0, 3.5)
    assert chase["gate"] == "CHASE · skip" and chase["note"] == "the gate is better"
    # Ouro: gate 0.13, 0.21, 0.29 at 2, 2.5, 3; rule 0.11 (2) and 0.27 (3): 0.5 · (0.02 + 0.10 + 0.02)
    assert float(rows[("Ouro", "skip-entropy")]["area"]) == pytest.approx(0.07)
    # dense runs all R loops under either: a zero-width range
    assert float(rows[("CHASE", "dense-kl")]["area"]) == 0.0 and rows[("CHASE", "dense-kl")]["note"] == "a tie"
    assert "zoo.png" in downstream["reports"]["zoo-debug"]
    points = read_csv(downstream["root"] / "zoo-debug" / "points.csv")
    rule = next(r for r in points if r["point"] == "skip entropy<1.0" and r["method"] == "CHASE")
    assert (rule["policy"], float(rule["q"]), float(rule["executed_loops"])) == ("skip-entropy", 1.0, 3.0)


def test_newest_evaluation_wins_when_settings_change(downstream):
    """Two evaluations of one stage, task and policy under other settings (another limit:
    another key): the newer one's values, and a note."""
    from analysis.load import load_runs
    from analysis.points import evaluation_points
    from trainables.eval_tasks import EvalTask
    from trainables.evaluation import Checkpoint, Evaluation, open_eval_run

    uri, logged = downstream["uri"], downstream["logged"]
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name("downstream-debug").experiment_id
    cfg = logged["configs"][("Ouro", 0, 0.25)][0]
    checkpoint = Checkpoint(
        "ckpt", "pretrain", cfg.stage_key(), cfg.config_hash(), ("pretrain",), fx.R, logged["trained"][cfg.stage_key()]
    )
    task = EvalTask("piqa", "paper", 5, "acc_norm", "hub:fixture", "1")
    run, status = open_eval_run(mc, exp, Evaluation(checkpoint, "forced:1", task, limit=50))
    assert status == "NEW"  # another limit, another key
    tracking.log_metrics(mc, run, tracking.downstream_metrics(ExitPolicy.forced(1), "piqa", accuracy=0.9, loops=1.0))
    tracking.close_run(mc, run, ok=True)
    runs = load_runs(uri, ["downstream-debug"])
    points = evaluation_points(runs)
    row = points.filter((pl.col("stage_key") == cfg.stage_key()) & (pl.col("point") == "forced d=1")).row(0, named=True)
    assert row["lm_eval.piqa"] == 0.9 and any("superseded" in n for n in runs.notes)
    mc.delete_run(run)  # the module's other tests read this experiment


def test_downstream_report_renders_in_headless_chromium(downstream, tmp_path):
    from analysis.screenshot import check_report, find_browser

    html_text = downstream["reports"]["downstream-debug"]["report.html"].read_text()
    assert 'id="chart-downstream"' in html_text and "Downstream evaluation with exit gates" in html_text
    assert 'id="chart-zoo"' in downstream["reports"]["zoo-debug"]["report.html"].read_text()
    if find_browser() is None:
        pytest.skip("no Chromium (apt-get install -y chromium, or set LOOPLAB_CHROMIUM)")
    found = check_report(downstream["reports"]["downstream-debug"]["report.html"], tmp_path / "shot.png")
    assert found["problems"] == [], found
    # frontier, Fig. 3, skip, two β charts and the four per-loop instruments
    assert found["charts"] == 9 and found["plots"] == 9


# ---- the searched axis first (issue 28) ---------------------------------------------------------
@pytest.fixture(scope="module")
def beta_sweep(tmp_path_factory):
    """A β ablation's store: one arm, β ∈ {0.5, 0.1} (logged in that order), seeds 0 and 1."""
    from analysis.report import ReportOptions, build_report

    root = tmp_path_factory.mktemp("beta")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    fx.log_sweep(uri, root, "beta-debug", arms=("Ouro",), seeds=(0, 1), betas=(0.5, 0.1))
    paths = build_report(uri, ["beta-debug"], root / "report", ReportOptions(log_artifacts=False, quality="accuracy"))
    return {"root": root, "paths": paths}


def test_the_report_opens_with_the_searched_axis_by_hand(beta_sweep):
    paths = beta_sweep["paths"]
    rows = read_csv(paths["axis.csv"])
    # One row per β, in numeric order (not the order logged), written as the report writes β.
    assert [r["β"] for r in rows] == ["0.1", "0.5"]
    t = 12.7062047  # Student's t, 97.5 %, one degree of freedom
    for row in rows:
        # The fixture's full depth is forced depth R = 4: accuracy 0.1 · 4 + 0.02 · seed → 0.40, 0.42.
        assert int(row["seeds"]) == 2
        assert float(row["accuracy"]) == pytest.approx(0.41)
        half = t * math.sqrt(0.0002) / math.sqrt(2)  # sample std of {0.40, 0.42} is √0.0002
        assert float(row["accuracy low"]) == pytest.approx(0.41 - half)
        assert float(row["accuracy high"]) == pytest.approx(0.41 + half)
        # Skip at q = 0.8 on the Ouro gate: 1.5 + 2.5 q loops, accuracy 0.05 + 0.4 q + 0.02 · seed.
        assert float(row["skip q=0.8 loops"]) == pytest.approx(3.5)
        assert float(row["skip q=0.8 accuracy"]) == pytest.approx(0.38)
    # The final stage's last training record: expected exit step 4 − β_stage (its own config's β).
    for row, beta in zip(rows, (0.1, 0.5)):
        final = fx.stage_configs("Ouro", 0, beta, beta_sweep["root"])[-1]
        assert float(row["expected exit step"]) == pytest.approx(4.0 - final.exit.beta)

    page = paths["report.html"].read_text()
    headings = re.findall(r"<h2>(.*?)</h2>", page)
    assert html.unescape(headings[0]) == "The searched axis: β"
    assert headings.index("Compute–quality frontier") > headings.index("β diagnostics")
    assert "2 seeds (0, 1)" in page  # never a bare "seeds: 0, 1"


def test_the_frontier_splits_its_series_by_the_searched_axis(beta_sweep):
    rows = read_csv(beta_sweep["paths"]["frontier.csv"])
    series = {r["series"] for r in rows}
    assert {"β=0.1 · dense", "β=0.1 · skip", "β=0.5 · dense", "β=0.5 · skip"} <= series
    assert not any("beta" in s for s in series)
    # the points' labels name β as the report does
    labels = {r["label"] for r in read_csv(beta_sweep["paths"]["points.csv"])}
    assert labels and all("β=" in label and "beta=" not in label for label in labels if "Ouro" in label)


def test_a_sweep_without_a_varied_axis_has_no_axis_section(report):
    out, _ = report
    assert not (out / "axis.csv").exists()  # one β: nothing varied, so no such section


def test_searched_axes_join_pairs_and_skip_the_seed():
    from analysis.axis import SEARCH, searched_axes

    table = pl.DataFrame(
        {
            SEARCH + "n_layers": ["1", "2"],
            SEARCH + "n_loops": ["4", "2"],
            SEARCH + "seed": ["0", "1"],
            SEARCH + "beta": ["0.25", "0.25"],
            SEARCH + "hp": ["0.5", "1.0"],
        }
    )
    axes = searched_axes(table)
    assert [a.name for a in axes] == ["N⊗R", "hole probability"]
    values = table.select([a.value_expr().alias(a.name) for a in axes])
    assert values.rows() == [("1⊗4", "0.5"), ("2⊗2", "1")]


def test_beta_report_renders_the_axis_first_in_headless_chromium(beta_sweep, tmp_path):
    from analysis.screenshot import check_report, find_browser

    if find_browser() is None:
        pytest.skip("no Chromium (apt-get install -y chromium, or set LOOPLAB_CHROMIUM)")
    found = check_report(beta_sweep["paths"]["report.html"], tmp_path / "shot.png")
    assert found["problems"] == [], found
    assert found["headings"][0] == "The searched axis: β"
    assert "β · policy" in found["legend_titles"]  # the frontier's legend says what its series vary in


# ---- the report says what it shows (issue 37, item 3) -----------------------------------------------------
def test_per_loop_instruments_split_by_the_searched_axis_with_their_n(beta_sweep):
    rows = read_csv(beta_sweep["paths"]["loops.csv"])
    hidden = {(r["stage"], r["β"], r["n"]) for r in rows if r["quantity"] == "hidden_norm" and r["loop"] == "2"}
    # one line per β for the gated stages, the pre-training both β continue once ("shared"), 2 seeds each
    assert hidden == {
        ("stage1", "0.1", "2"),
        ("stage1", "0.5", "2"),
        ("stage2", "0.1", "2"),
        ("stage2", "0.5", "2"),
        ("pretrain", "shared", "2"),
    }
    page = html.unescape(beta_sweep["paths"]["report.html"].read_text())
    assert "stage1 · Ouro · β=0.1 (n=2)" in page and "pretrain · fixed · β shared (n=2)" in page
    found = re.search(r"<h3>What this sweep found</h3><p>(.*?)</p>", page).group(1)
    assert "Every β value has the same accuracy (0.41)" in found and "within the seed noise" in found


def test_captions_say_bars_only_where_intervals_are_drawn():
    from analysis.charts import ChartSpec, Point, Series, bars_phrase, legend_entries

    def spec(*pts, n=1):
        return ChartSpec("c", "t", "x", "y", [Series(f"s{i}", "#000", list(pts)) for i in range(n)])

    assert bars_phrase(spec(Point(0, 1, "a"))) == "one seed: no interval"
    assert bars_phrase(spec(Point(0, 1, "a", 0.5, 1.5))) == "bars: the seed interval"
    assert bars_phrase(spec(Point(0, 1, "a", 0.5, 1.5), Point(1, 1, "b"))).endswith("where a point has one")
    # 5 colours × 3 line styles: a legend of 8 entries, not 15; a handful stays one entry per series
    styles = {"full": (False, False), "dense": (True, False), "skip": (False, True)}
    many = ChartSpec(
        "f",
        "t",
        "x",
        "y",
        [
            Series(f"{b} · {p}", f"#00000{i}", dashed=d, dotted=o, group=b, style=p)
            for i, b in enumerate(["β=0.1", "β=0.3", "β=0.5", "β=0.7", "β=0.9"])
            for p, (d, o) in styles.items()
        ],
    )
    entries = legend_entries(many)
    assert [e.name for e in entries] == ["β=0.1", "β=0.3", "β=0.5", "β=0.7", "β=0.9", "full", "dense", "skip"]
    assert legend_entries(ChartSpec("f", "t", "x", "y", many.series[:6])) is None
    from analysis.page import figure

    shown = [t for t in figure(many).to_plotly_json()["data"] if t.get("showlegend", True)]
    assert len(shown) == 8


def test_many_series_without_factors_become_small_multiples_on_shared_limits(tmp_path):
    """Fourteen series whose colours stand for nothing common: three panels of at most six,
    as even as 14 splits (5, 5, 4), each with its legend; the PNG draws them on the same
    limits. A handful stays one."""
    from analysis.charts import LEGEND_HANDFUL, ChartSpec, Point, Series, small_multiples
    from analysis.plots import render_png

    series = [Series(f"run {i}", f"#{i:02d}0000", [Point(float(i), float(i * i), "p")]) for i in range(14)]
    spec = ChartSpec("many", "fourteen runs", "x", "y", series)
    panels = small_multiples(spec)
    assert [len(p.series) for p in panels] == [5, 5, 4] and all(len(p.series) <= LEGEND_HANDFUL for p in panels)
    assert [p.title for p in panels] == ["fourteen runs (1 of 3)", "fourteen runs (2 of 3)", "fourteen runs (3 of 3)"]
    assert [s.name for p in panels for s in p.series] == [s.name for s in series]  # none lost, order kept
    assert small_multiples(ChartSpec("few", "t", "x", "y", series[:6])) == [ChartSpec("few", "t", "x", "y", series[:6])]
    from PIL import Image

    width, _ = Image.open(render_png(spec, tmp_path / "many.png")).size
    one_width, _ = Image.open(render_png(panels[0], tmp_path / "one.png")).size
    assert width == 3 * one_width  # three panels in a row
