"""A report is of one sweep (issue 53, item 4): sweeps that share a storage and a preset
share one MLflow experiment, so the report a sweep writes at its end reads that sweep's
runs alone and its page says which sweep it covers; the whole-experiment report lists
every sweep it pools. The console's first line counts the trials a sweep will run.

The store: three sweeps of one experiment, written as the platform writes them
(tests/analysis_fixture.py): a grid over β 0.1 and 0.5, a search that sampled β 0.179388
and 0.243768 (reusing the grid's shared pre-training), and an extension to β 0.1, 0.5
and 1.0 that reuses the grid's two trials whole (they stay under the grid's run) and
trains only β=1. No Ray.
"""

from __future__ import annotations

import csv
import html
import re

import analysis_fixture as fx
import pytest

pytest.importorskip("polars")
pytest.importorskip("plotly")

EXPERIMENT = "beta-shared"
ONE_ARM = dict(arms=("Ouro",), seeds=(0,), declared=True)  # one trial per β, the sweep run's params logged


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-sweeps")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    grid = fx.log_sweep(uri, root, EXPERIMENT, betas=(0.1, 0.5), sweep_key="aaaa", **ONE_ARM)
    search = fx.log_sweep(
        uri, root, EXPERIMENT, betas=(0.179388, 0.243768), sweep_key="bbbb", stored=grid["done"], **ONE_ARM
    )
    extension = fx.log_sweep(
        uri,
        root,
        EXPERIMENT,
        betas=(0.1, 0.5, 1.0),
        sweep_key="cccc",
        stored={**grid["done"], **search["done"]},
        **ONE_ARM,
    )
    return {"uri": uri, "root": root, "grid": grid, "search": search, "extension": extension}


def final_keys(sweep: dict) -> list[str]:
    """The final stage keys of a sweep's trials: what its driver passes to write_report."""
    return [configs[-1].stage_key() for configs in sweep["configs"].values()]


def read_points(out) -> list[dict]:
    with open(out / "points.csv", newline="") as f:
        return list(csv.DictReader(f))


def betas_of(out) -> set[float]:
    return {float(r["params.search.beta"]) for r in read_points(out)}


def trials_of(out) -> set[str]:
    return {r["trial_run_id"] for r in read_points(out)}


def header(out) -> str:
    """The page's header lines, as text."""
    page = (out / "report.html").read_text()
    meta = re.search(r'<div class="meta">(.*?)</div></div>', page).group(1)
    return html.unescape(re.sub(r"<[^>]+>", "\n", meta))


def build(sweeps, out, **options):
    from analysis.report import ReportOptions, build_report

    return build_report(sweeps["uri"], [EXPERIMENT], out, ReportOptions(log_artifacts=False, **options))


def test_the_fixture_is_three_sweeps_sharing_one_experiment(sweeps):
    """The store the other tests read, as the platform leaves it: the extension reran
    the grid's two trials by reusing their runs, which stay under the grid's run."""
    grid, extension = sweeps["grid"], sweeps["extension"]
    assert sorted(extension["reused_trials"]) == sorted(grid["trials"].values())
    assert extension["trials"][("Ouro", 0, 1.0)] not in grid["trials"].values()
    assert len({grid["sweep_run"], sweeps["search"]["sweep_run"], extension["sweep_run"]}) == 3


def test_each_sweeps_report_reads_only_its_own_trials(sweeps, tmp_path):
    """sweeps/runtime.write_report as a sweep's end calls it (with its trials' keys): the
    grid's report has the grid's two trials, the search's the search's two, though all
    five trials share the experiment."""
    from sweeps.runtime import write_report

    for name, betas in (("grid", {0.1, 0.5}), ("search", {0.179388, 0.243768})):
        sweep, out = sweeps[name], tmp_path / name
        assert "report.html" in write_report(sweeps["uri"], EXPERIMENT, sweep["sweep_run"], out, final_keys(sweep))
        assert betas_of(out) == betas
        assert trials_of(out) == set(sweep["trials"].values())


def test_a_sweeps_end_report_has_the_trials_it_reused_whole(sweeps):
    """sweeps/runtime.write_report, as the driver calls it at a sweep's end: with the
    final stage keys of its trials, the extension's report has all three β, the two it
    reused from the grid's run among them, and none of the search's."""
    from sweeps.runtime import write_report

    extension = sweeps["extension"]
    out = sweeps["root"] / "analysis" / "extension"
    paths = write_report(sweeps["uri"], EXPERIMENT, extension["sweep_run"], out, final_keys(extension))
    assert "report.html" in paths
    assert betas_of(out) == {0.1, 0.5, 1.0}
    assert trials_of(out) == set(extension["trials"].values())
    said = header(out)
    assert f"covers sweep {EXPERIMENT}-cccc (key cccc, run {extension['sweep_run']}) alone" in said, said
    assert f"1 trial under its run, 2 trials it reused whole from run {sweeps['grid']['sweep_run']}" in said, said


def test_the_stages_a_sweep_reused_from_another_sweep_are_read_with_their_histories(sweeps):
    """The search trained no pre-training: its trials reused the grid's, whose run sits under
    the grid's sweep run. Its report reads that run too (the reused runs log only final
    values), and no trial of the grid."""
    from analysis.load import load_runs

    search, grid = sweeps["search"], sweeps["grid"]
    runs = load_runs(sweeps["uri"], [EXPERIMENT], sweep_run_id=search["sweep_run"])
    pretrain_key = next(c.stage_key() for c in search["configs"][("Ouro", 0, 0.179388)] if c.stage == "pretrain")
    original = grid["trained"][pretrain_key]
    ids = set(runs.runs["run_id"].to_list())
    assert original in ids
    assert not ids & set(grid["trials"].values())
    # the β diagnostics read the two Stage-1 runs the search trained, one per β
    from analysis.load import beta_histories

    assert sorted(set(beta_histories(runs)["beta"].to_list())) == [0.179388, 0.243768]


def test_the_analysis_command_with_sweep_run_reads_that_sweep_alone(sweeps, tmp_path, capsys):
    from analysis.__main__ import main

    grid = sweeps["grid"]
    argv = ["--tracking-uri", sweeps["uri"], "--sweep-run", grid["sweep_run"], "--no-log"]
    assert main([*argv, "--out", str(tmp_path / "one")]) == 0
    assert betas_of(tmp_path / "one") == {0.1, 0.5}
    # --scope experiment keeps the whole experiment (the files still go to the sweep run)
    assert main([*argv, "--scope", "experiment", "--out", str(tmp_path / "all")]) == 0
    assert betas_of(tmp_path / "all") == {0.1, 0.5, 0.179388, 0.243768, 1.0}
    capsys.readouterr()


def test_without_its_driver_a_sweeps_page_says_which_declared_trials_it_lacks(sweeps, tmp_path, capsys):
    """The command knows no trial keys: the extension's two trials reused whole stay under
    the grid's run and are not read, and the page says so against the 3 its run declares."""
    from analysis.__main__ import main

    extension = sweeps["extension"]
    argv = ["--tracking-uri", sweeps["uri"], "--sweep-run", extension["sweep_run"], "--no-log", "--out", str(tmp_path)]
    assert main(argv) == 0
    capsys.readouterr()
    assert betas_of(tmp_path) == {1.0}
    said = header(tmp_path)
    assert "alone: 1 trial under its run; of the 3 trials it declares, 2 are not read" in said, said


def test_the_trials_a_sweep_recorded_let_the_command_read_it_again_whole(sweeps, tmp_path, capsys):
    """The driver records its trials' final stage keys on the sweep run at its end
    (tracking.SWEEP_TRIALS): the command then reads the extension's three β, the two it
    reused whole from the grid's run among them, as the sweep's own report did."""
    from analysis.__main__ import main
    from looplab import tracking

    extension = sweeps["extension"]
    mc = tracking.client(sweeps["uri"])
    mc.set_tag(extension["sweep_run"], tracking.SWEEP_TRIALS, ",".join(final_keys(extension)))
    try:
        argv = ["--tracking-uri", sweeps["uri"], "--sweep-run", extension["sweep_run"], "--no-log"]
        assert main([*argv, "--out", str(tmp_path)]) == 0
    finally:
        mc.delete_tag(extension["sweep_run"], tracking.SWEEP_TRIALS)  # the fixture is the other tests' too
    capsys.readouterr()
    assert betas_of(tmp_path) == {0.1, 0.5, 1.0}
    assert trials_of(tmp_path) == set(extension["trials"].values())


def test_a_whole_experiment_report_lists_every_sweep_it_pools(sweeps, tmp_path):
    build(sweeps, tmp_path)
    said = header(tmp_path)
    assert f"covers every run of '{EXPERIMENT}': 3 sweeps pooled" in said, said
    lines = [line.strip() for line in said.splitlines() if line.strip().startswith("sweep ")]
    run = {name: sweeps[name]["sweep_run"] for name in ("grid", "search", "extension")}
    assert lines == [
        f"sweep {EXPERIMENT}-aaaa (key aaaa, run {run['grid']}): 2 trials",
        f"sweep {EXPERIMENT}-bbbb (key bbbb, run {run['search']}): 2 trials",
        # the extension's other two trials sit under the grid's run
        f"sweep {EXPERIMENT}-cccc (key cccc, run {run['extension']}): 1 trial of the 3 it declares",
    ]
    assert "python -m analysis --sweep-run ID" in said


# ---- the console's first line ------------------------------------------------------------------
def launch_of(argv, tmp_path):
    """The sweep, its launch settings and its checked trial points, from beta_ablation's command line."""
    from sweeps import beta_ablation
    from sweeps.flags import Common, Launch, parser
    from sweeps.sweep import validate

    p = parser("test")
    beta_ablation.add_flags(p)
    args = p.parse_args([*argv, "--preset", "debug", "--storage-path", str(tmp_path)])
    sweep, launch = beta_ablation.from_args(Common.from_args(args), args), Launch.from_args(args)
    points, _ = validate(sweep, launch)
    return sweep, launch, points


def test_the_headline_counts_the_optuna_samples_not_the_range_corners(tmp_path):
    from sweeps.launch import headline

    sweep, launch, points = launch_of(["--search", "optuna", "--num-samples", "4"], tmp_path)
    assert len(points) == 2  # β's range corners, what the checks ran on: not the trials
    line = headline(sweep, launch, "k", points, tmp_path / "ray.log")
    assert line.startswith("sweep beta_ablation [k]: 4 trial(s): Optuna samples within beta in [0.01, 2] (log);")


def test_the_headline_of_a_grid_counts_points_times_seeds(tmp_path):
    from sweeps.launch import headline

    sweep, launch, points = launch_of(["--betas", "0.1,0.5,1", "--seeds", "0,1"], tmp_path)
    line = headline(sweep, launch, "k", points, tmp_path / "ray.log")
    assert line == f"sweep beta_ablation [k]: 6 trial point(s); Ray's own output goes to {tmp_path / 'ray.log'}"
