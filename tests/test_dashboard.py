"""MLflow's dashboard for a sweep (issue 28): the URL a sweep prints opens its trials in
MLflow 3.17's model-training view, one row per trial with the searched values and the
headline metrics as columns; the sweep run carries the sweep's params, its headline
metrics and links to its report; trial and stage runs nest under it.

The browser test runs a real tiny β sweep (~35 s on 2 cores), serves its store with
the `looplab dashboard` command the sweep printed, under a busy-loop process per core
(issue 37), and reads the pages at the URLs that command printed in headless Chromium;
it skips without Chromium. The references are independent of looplab/dashboard.py: literal URLs and
view states, the names the installed MLflow's UI bundle spells, the cells Chromium drew.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from looplab import dashboard, tracking
from sweeps import beta_ablation as beta
from sweeps.flags import Common, Launch, parser
from sweeps.launch import main
from sweeps.sweep_record import (
    SweepView,
    searched_names,
    sweep_params,
)

TINY = [
    "--preset",
    "phop-debug",
    "--set",
    "train.steps=4",
    "--set",
    "train.eval_limit=16",
    "--set",
    "train.log_every=2",
    "--set",
    "train.eval_every=0",
    "--stage1-steps",
    "2",
]
BETAS = ("0.05", "0.25")


def test_urls_open_the_runs_tab_in_the_model_training_view():
    route = "/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=beta_ablation-abc"
    assert dashboard.runs_route("7", "beta_ablation-abc") == route
    assert dashboard.url("http://mlflow.lab:8080/", route) == "http://mlflow.lab:8080/#" + route
    # A local store: the command that serves it, then the URLs it will serve.
    local = dashboard.dashboard_lines("sqlite:////data/runs/mlflow.db", "7", "beta_ablation-abc", "r1")
    assert local == [
        "serve it:  looplab dashboard /data/runs",
        "trials:    http://127.0.0.1:5000/#" + route,
        "sweep run: http://127.0.0.1:5000/#/experiments/7/runs/r1?workflowType=machine_learning",
    ]
    served = dashboard.dashboard_lines("http://mlflow.lab:8080", "7", "beta_ablation-abc", "r1")
    assert served == [
        "trials:    http://mlflow.lab:8080/#" + route,
        "sweep run: http://mlflow.lab:8080/#/experiments/7/runs/r1?workflowType=machine_learning",
    ]


def test_sweep_view_is_the_state_the_runs_page_reads():
    state = dashboard.sweep_view(dashboard.trials_filter("r1"), ["beta", "seed"], [tracking.VAL_PPL])
    columns = ["params.`search.beta`", "params.`search.seed`", "metrics.`val_ppl`"]
    assert state == {
        "searchFilter": "tags.level = 'trial' and tags.`mlflow.parentRunId` = 'r1'",
        "orderByKey": "params.`search.beta`",
        "orderByAsc": True,
        "selectedColumns": columns,
        "columnOrder": columns,
    }
    envelope = json.loads(dashboard.view_tag_value("beta_ablation-abc", state, 1234))
    assert {k: envelope[k] for k in ("name", "createdAt", "updatedAt")} == {
        "name": "beta_ablation-abc",
        "createdAt": 1234,
        "updatedAt": 1234,
    }
    assert json.loads(envelope["state"]) == state
    assert dashboard.runs_filter(["b", "a", "b"]) == "attributes.run_id IN ('a', 'b')"


def test_the_installed_mlflow_ui_reads_these_names():
    """The names the URL and the view use, as the installed UI bundle spells them: the
    mode switch, the saved-view tag and URL key, the view's keys; and the kind value its
    selector writes for "Machine learning"."""
    import mlflow

    bundle = "".join(
        p.read_text(errors="replace") for p in (Path(mlflow.__file__).parent / "server/js/build/static/js").glob("*.js")
    )
    for text in (
        '.get("workflowType")',
        'MACHINE_LEARNING="machine_learning"',
        '"mlflow.sharedViewState."',
        '"viewStateShareKey"',
        '"searchFilter","orderByKey","orderByAsc"',
        '"selectedColumns","columnOrder"',
        'CUSTOM_MODEL_DEVELOPMENT="custom_model_development"',
        '"mlflow.experiment.primaryMetric.name"',
        "/experiments/:experimentId/runs",
    ):
        assert text in bundle, text
    assert (tracking.EXPERIMENT_KIND_TAG, tracking.MODEL_TRAINING) == (
        "mlflow.experimentKind",
        "custom_model_development",
    )


def _declaration(argv):
    p = parser("test")
    beta.add_flags(p)
    args = p.parse_args(argv)
    return beta.from_args(Common.from_args(args), args), Launch.from_args(args)


def test_sweep_run_params_name_the_grid_and_the_keyed_settings():
    sweep, launch = _declaration(TINY + ["--betas", "0.05,0.25"])
    params = sweep_params(sweep, launch)
    assert params["grid.beta"] == "[0.05, 0.25]"
    assert params["sweep.searched.beta"] == "exit.beta" and params["sweep.preset"] == "phop-debug"
    assert params["sweep.set.model.n_loops"] == "4" and params["sweep.set.train.steps"] == "4"
    assert params["sweep.stage_set.stage1.train.steps"] == "2" and params["sweep.seeds"] == "[0]"
    assert "sweep.set.train.log_every" not in params  # cadence: not in the sweep key, so not a sweep param
    assert searched_names(sweep, launch) == ["beta"]
    assert searched_names(*_declaration(TINY + ["--seeds", "0,1"])) == ["beta", "seed"]


def test_best_metrics_follow_the_sweeps_mode():
    rows = [{"val_ppl": 3.0, "val_accuracy": 0.5}, {"val_ppl": 2.5, "val_accuracy": None}, {"val_ppl": None}]
    assert tracking.best_metrics(rows, tracking.VAL_PPL, "min", (tracking.VAL_PPL, tracking.VAL_ACCURACY)) == (
        {"best.val_ppl": 2.5},
        1,
    )
    assert tracking.best_metrics(rows, tracking.VAL_PPL, "max", (tracking.VAL_PPL,)) == ({"best.val_ppl": 3.0}, 0)
    assert tracking.best_metrics([{}], tracking.VAL_PPL, "min", (tracking.VAL_PPL,)) == ({}, None)


def test_existing_experiments_are_marked_model_training(tmp_path):
    mc = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    plain = mc.create_experiment("plain", artifact_location=(tmp_path / "a").as_uri())
    genai = mc.create_experiment(
        "genai", artifact_location=(tmp_path / "b").as_uri(), tags={"mlflow.experimentKind": "genai_development"}
    )
    for name, made in (("plain", plain), ("genai", genai)):
        assert tracking.ensure_experiment(mc, name, tmp_path) == made
        assert mc.get_experiment(made).tags["mlflow.experimentKind"] == "custom_model_development"


def test_the_view_lists_the_summarys_trials_also_those_an_earlier_sweep_ran(tmp_path):
    """A rerun with a grown grid is a new sweep run whose reused trials stay under the
    earlier one: at the end the view lists the summary's trial runs by id. MLflow's own
    search parses both filters and finds exactly those trials."""
    sweep, launch = _declaration(TINY + ["--betas", "0.05,0.25"])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mc = tracking.client(uri)
    exp = tracking.ensure_experiment(mc, "beta_ablation-phop-debug", tmp_path)
    earlier, now = (mc.create_run(exp, tags={"level": "sweep"}).info.run_id for _ in range(2))
    old_trial = mc.create_run(exp, tags={"level": "trial", "stage_key": "k1", "mlflow.parentRunId": earlier})
    new_trial = mc.create_run(exp, tags={"level": "trial", "stage_key": "k2", "mlflow.parentRunId": now})
    mc.create_run(exp, tags={"level": "stage", "stage_key": "k2", "mlflow.parentRunId": new_trial.info.run_id})

    def view() -> dict:
        envelope = json.loads(mc.get_experiment(exp).tags["mlflow.sharedViewState.beta_ablation-now"])
        return json.loads(envelope["state"])

    def found(state: dict) -> set[str]:
        return {r.info.run_id for r in mc.search_runs([exp], filter_string=state["searchFilter"])}

    published = SweepView(mc, exp, sweep, launch, now, "beta_ablation-now", uri)
    lines = published.publish()
    assert "viewStateShareKey=beta_ablation-now" in lines
    assert found(view()) == {new_trial.info.run_id}  # at the start: the trials under this sweep run
    assert mc.get_experiment(exp).tags["mlflow.experiment.primaryMetric.name"] == "val_ppl"
    assert published.publish_summary([{"stage_key": "k2"}]) is None
    again = published.publish_summary([{"stage_key": "k1"}, {"stage_key": "k2"}])
    assert again == lines
    assert found(view()) == {old_trial.info.run_id, new_trial.info.run_id}
    assert view()["selectedColumns"][0] == "params.`search.beta`"


# ---- the real thing: a tiny sweep, its store served, the printed URL in Chromium -----------


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("dashboard")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(
            "test",
            beta.add_flags,
            beta.from_args,
            TINY + ["--betas", ",".join(BETAS), "--tracking-uri", uri, "--storage-path", str(root / "store")],
        )
    assert status == 0, out.getvalue()
    return uri, out.getvalue()


def _printed(text: str, label: str) -> str:
    found = re.search(rf"^\s*(?:dashboard:\s+)?{label}\s+(\S+)$", text, re.M)
    assert found, f"no {label!r} line in:\n{text}"
    return found.group(1)


@pytest.mark.ray
@pytest.mark.slow  # a sweep and an MLflow server under load, ~2 min on 2 cores: .ci/run runs it after the suite
def test_printed_url_shows_the_trials_in_the_model_training_view(tiny_sweep, tmp_path):
    from test_dashboard_command import COMMAND, busy_cores, dashboard_command, free_port

    from analysis.dashboard_shot import render
    from analysis.screenshot import _png_stats, find_browser

    uri, out = tiny_sweep
    command = re.search(r"^dashboard:   serve it:  (.+)$", out, re.M).group(1)
    assert shlex.split(command) == ["looplab", "dashboard", str(Path(uri.removeprefix("sqlite:///")).parent)]
    trials_url, sweep_url = _printed(out, "trials:"), _printed(out, "sweep run:")
    assert trials_url.startswith("http://127.0.0.1:5000/#/experiments/")
    assert "workflowType=machine_learning" in trials_url

    mc = tracking.client(uri)
    experiment_id = mc.get_experiment_by_name("beta_ablation-phop-debug").experiment_id
    (sweep_run,) = mc.search_runs([experiment_id], filter_string="tags.level = 'sweep'")
    trials = mc.search_runs([experiment_id], filter_string="tags.level = 'trial'")
    # The sweep run: its grid and settings as params, the best trial's figures as metrics,
    # the report among its artifacts and linked from its description.
    assert sweep_run.data.params["grid.beta"] == "[0.05, 0.25]"
    assert sweep_run.data.params["sweep.searched.beta"] == "exit.beta"
    assert sweep_run.data.metrics["best.val_ppl"] == min(t.data.metrics["val_ppl"] for t in trials)
    assert {"best.val_accuracy", "best.exit_entropy", "best.expected_exit_step"} <= set(sweep_run.data.metrics)
    assert "analysis/report.html" in {a.path for a in mc.list_artifacts(sweep_run.info.run_id, "analysis")}
    note = sweep_run.data.tags["mlflow.note.content"]
    assert (
        f"(#/experiments/{experiment_id}/runs/{sweep_run.info.run_id}/artifacts/analysis/report.html"
        "?workflowType=machine_learning)"
    ) in note
    # The nesting MLflow shows: trials under the sweep run, each trial's stages under it.
    for trial in trials:
        assert trial.data.tags["mlflow.parentRunId"] == sweep_run.info.run_id
        stages = mc.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{trial.info.run_id}'")
        assert sorted(s.data.tags["stage"] for s in stages) == ["pretrain", "stage1"]

    if find_browser() is None:
        pytest.skip("no Chromium (apt-get install -y chromium, or set LOOPLAB_CHROMIUM)")
    port = free_port()  # the printed command on another port than 5000, which may be taken here
    with busy_cores(), dashboard_command([*COMMAND, *shlex.split(command)[2:], "--port", str(port)]) as served:
        local = f"http://127.0.0.1:{port}"
        assert (served.url("trials:"), served.url("sweep run:")) == tuple(
            u.replace("http://127.0.0.1:5000", local) for u in (trials_url, sweep_url)
        )
        page = render(served.url("trials:"), tmp_path / "dashboard.png")
        run_page = render(served.url("sweep run:"))
        default = render(f"{local}/#/experiments/{experiment_id}")  # no mode in the URL: MLflow's own default
    assert served.last == "stopped: no MLflow process left"

    assert page["view"] == "runs", page["dom"][-2000:]
    assert sorted(page["cells"]["params.`search.beta`"]) == list(BETAS)
    for metric in ("val_ppl", "val_accuracy", "exit_entropy", "expected_exit_step"):
        assert len(page["cells"][f"metrics.`{metric}`"]) == 2, metric
    assert "Latency" not in page["dom"]
    stats = _png_stats(tmp_path / "dashboard.png")
    assert stats["distinct_colors"] >= 16 and stats["inked_fraction"] >= 0.01, stats
    # The sweep run's page: its params and metrics counted, its trials listed as child runs.
    assert re.search(r"Parameters \((?!0\))\d+\)", run_page["dom"]), "the sweep run shows no params"
    assert "Child runs" in run_page["dom"]
    for trial in trials:
        assert trial.info.run_name in run_page["dom"]
    # Without the URL's mode MLflow 3.17 opens the GenAI overview, whatever the experiment's
    # kind tag says: the printed URL is what opens the runs.
    assert default["view"] != "runs"


def test_a_trial_page_leads_with_its_searched_values_stages_and_figures():
    summary = {
        tracking.VAL_PPL: 7.98361,
        tracking.VAL_ACCURACY: 0.42381,
        tracking.EXIT_ENTROPY: 0.98322,
        "skip_q0.8_ppl": 7.9,
    }
    text = dashboard.trial_description("beta=0.25 seed=0", ["pretrain", "stage1"], summary)
    lines = text.splitlines()
    assert lines[0] == "**Trial beta=0.25 seed=0**: stages pretrain → stage1."
    assert "| validation perplexity (full depth) | 7.984 |" in lines
    assert "| validation accuracy (full depth) | 0.4238 |" in lines
    assert "| exit entropy (training's last window) | 0.9832 |" in lines
    assert not any("expected exit step" in line or "skip_q0.8" in line for line in lines)  # absent, or not headline
    empty = dashboard.trial_description("seed=1", ["pretrain"], {})
    assert "(no figures: the trial logged none)" in empty and "|---|" not in empty


def test_the_runs_tables_cells_are_read_with_the_run_names_link_text():
    """The shape of MLflow's rendered runs table: the run name is a link beside a colour
    swatch whose hex code is text too; other cells are plain text; the selection column
    holds controls. The name is the link's text, not the swatch's or nothing."""
    from analysis.dashboard_shot import cells

    def cell(column: str, inner: str) -> str:
        return (
            f'<div class="ag-cell" role="gridcell" col-id="{column}"><div class="ag-cell-wrapper">'
            f'<span class="ag-cell-value">{inner}</span></div></div>'
        )

    name = (
        '<div><label><span>#137dae</span><input type="color" value="#137dae"></label>'
        '<a href="#/experiments/1/runs/30ac"><span>trial-50439810aa0e</span></a></div>'
    )
    row = (
        '<div role="row">'
        + cell("1", "<span>Hide run</span>")
        + cell("attributes.`Run Name`", name)
        + cell("runDateAndNestInfo", '<span title="11/27/2026">47 <b>minutes</b> ago</span>')
        + cell("params.`search.seed`", "304")
        + "</div>"
    )
    assert cells(f"<html><body>{row}{row.replace('304', '303')}<p>2 matching runs</p></body></html>") == {
        "attributes.`Run Name`": ["trial-50439810aa0e", "trial-50439810aa0e"],
        "runDateAndNestInfo": ["47 minutes ago", "47 minutes ago"],
        "params.`search.seed`": ["304", "303"],
    }
