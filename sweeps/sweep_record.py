"""What a sweep records in MLflow and prints: its parent run (keyed by the sweep's
content, adopted on a rerun), its params, the dashboard's saved views of its trials,
the headline figures, the description with the summary table and the report's links,
the closing of runs a dead invocation left RUNNING, and the summary the console shows.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looplab import dashboard, tracking
from sweeps.flags import Launch
from sweeps.sweep import Sweep, keyed_declaration


def open_sweep_run(
    mc,
    experiment_id: str,
    run_name: str,
    key: str,
    preset: str,
    axes: tuple[str, ...] = (),
    params: dict[str, str] | None = None,
) -> str:
    """The sweep's one parent run, keyed by the sweep's content: created once, adopted
    by every later invocation of the same sweep (set RUNNING while it runs), with the
    sweep's params (sweep_params; a run an older invocation made gets them too). Runs an
    earlier invocation left RUNNING under it belong to processes that died: they are
    closed as KILLED, pointing to this invocation; the trials reopen them as they run."""
    sweep_run, status = tracking.open_run(
        mc,
        experiment_id,
        name=run_name,
        key={tracking.LEVEL: tracking.SWEEP, tracking.SWEEP_KEY: key},
        tags={
            tracking.PRESET: preset,
            tracking.GIT_SHA: tracking.git_sha(),
            tracking.COMMAND: " ".join(shlex.quote(a) for a in sys.argv),
            **({tracking.SCAN_AXES: ",".join(axes)} if axes else {}),
        },
        params=params,
    )
    if status == "FINISHED":
        mc.update_run(sweep_run, status="RUNNING")
    if axes and status != "NEW":  # a declaration's axes, also on a run an older invocation made
        mc.set_tag(sweep_run, tracking.SCAN_AXES, ",".join(axes))
    if status != "NEW":
        closed = close_orphans(mc, experiment_id, sweep_run)
        if closed:
            print(f"closed {closed} run(s) an interrupted invocation of this sweep left RUNNING", file=sys.stderr)
    return sweep_run


def searched_names(sweep: Sweep, launch: Launch) -> list[str]:
    """The params the sweep varies, in declaration order: the grid's axes and the paired
    points' keys (--search optuna: the ranges), and the seed when there are several."""
    if launch.search == "grid":
        names = [*sweep.grid, *(k for p in sweep.points for k in p)]
    else:
        names = list(sweep.ranges)
    names += ["seed"] if len(launch.seeds) > 1 else []
    return list(dict.fromkeys(names))


def sweep_params(sweep: Sweep, launch: Launch) -> dict[str, str]:
    """The sweep run's params (tracking.sweep_params): the grid (or the ranges) and the
    fixed settings, read from what the sweep key hashes (sweeps/sweep.keyed_declaration),
    so a run adopted by a later invocation of the same sweep has the same values."""
    declared = keyed_declaration(sweep, launch)
    spec = declared["spec"]
    settings = {
        "preset": spec["preset"],
        "stages": ",".join(spec["stages"]),
        "seeds": list(declared["seeds"]),
        "search": declared["search"],
        "scheduler": declared["scheduler"],
        "searched": spec["searched"],
        "arms": {arm: ",".join(stages) for arm, stages in spec["arms"].items()},
        "set": spec["overrides"],
        "stage_set": spec["stage_overrides"],
    }
    grid_search = launch.search == "grid"
    if not grid_search:
        settings["num_samples"] = declared["num_samples"]
    return tracking.sweep_params(
        declared["grid"] if grid_search else {},
        declared["points"] if grid_search else (),
        {} if grid_search else declared["ranges"],
        settings,
    )


@dataclass(frozen=True)
class SweepView:
    """The sweep's saved view of its trials on the dashboard (named by the sweep run's
    name: its searched params and headline metrics as columns, looplab/dashboard.py) and
    the experiment's primary metric."""

    mc: Any
    experiment_id: str
    sweep: Sweep
    launch: Launch
    sweep_run: str
    run_name: str
    uri: str

    def publish(self, trial_runs: list[str] | None = None) -> str:
        """The view, of the trials under the sweep run or of `trial_runs` (the summary's
        rows, when some of them are trials an earlier sweep ran: they stay under that
        sweep's run); returns the lines that say where to look."""
        mc, experiment_id = self.mc, self.experiment_id
        run_filter = dashboard.runs_filter(trial_runs) if trial_runs else dashboard.trials_filter(self.sweep_run)
        state = dashboard.sweep_view(run_filter, searched_names(self.sweep, self.launch), self.sweep.columns)
        created = mc.get_run(self.sweep_run).info.start_time or 0  # the run's: no timestamp of this invocation
        tracking.save_view(mc, experiment_id, self.run_name, dashboard.view_tag_value(self.run_name, state, created))
        mc.set_experiment_tag(experiment_id, tracking.PRIMARY_METRIC_TAG, self.sweep.metric)
        return dashboard_text(self.uri, experiment_id, self.run_name, self.sweep_run)

    def publish_summary(self, rows: list[dict[str, Any]]) -> str | None:
        """At the end: when some of the summary's trials are runs an earlier sweep started
        (reused, so under that sweep's run), the view lists the summary's trial runs by id
        instead; returns the new lines, or None when the view stays as it was."""
        trial_runs = find_trial_runs(self.mc, self.experiment_id, [r[tracking.STAGE_KEY] for r in rows])
        if not set(trial_runs.values()) - {self.sweep_run}:
            return None
        return self.publish(list(trial_runs))


def dashboard_text(uri: str, experiment_id: str, view: str, sweep_run: str) -> str:
    """dashboard: then, indented, the command that serves a local store and the URLs."""
    lines = dashboard.dashboard_lines(uri, experiment_id, view, sweep_run)
    return "\n".join(f"{'dashboard:' if i == 0 else '':13s}{line}" for i, line in enumerate(lines))


def close_orphans(mc, experiment_id: str, sweep_run: str, reason: str | None = None) -> int:
    """KILLED for every RUNNING run below the sweep run (its trials, their stages, the
    shared stages): the invocation that started them is gone (or the user stopped it)."""
    # MLflow's filter strings have no OR (nor IN on tags): read the experiment's parent
    # links once and walk the tree here.
    below: dict[str, list] = {}
    token = None
    while True:
        page = mc.search_runs([experiment_id], max_results=5000, page_token=token)
        for run in page:
            below.setdefault(run.data.tags.get(tracking.PARENT_RUN_TAG), []).append(run)
        token = page.token
        if not token:
            break
    children, closed = [sweep_run], 0
    while children:
        found = [run for parent in children for run in below.get(parent, [])]
        children = [r.info.run_id for r in found]
        for run in found:
            if run.info.status == "RUNNING":
                mc.set_tag(
                    run.info.run_id, tracking.KILLED_BY, reason or f"sweep run {sweep_run} reopened by a new invocation"
                )
                mc.set_terminated(run.info.run_id, status="KILLED")
                closed += 1
    return closed


def close_stopped_trial(mc, experiment_id: str, stage_key: str) -> None:
    """A trial the scheduler stopped was killed mid-stage: its MLflow runs (the
    trial and its unfinished stages) end KILLED instead of staying RUNNING."""
    trial = tracking.find_run(mc, experiment_id, **{tracking.LEVEL: tracking.TRIAL, tracking.STAGE_KEY: stage_key})
    if trial is None or trial.info.status != "RUNNING":
        return
    children = mc.search_runs(
        [experiment_id],
        filter_string=f"tags.`{tracking.PARENT_RUN_TAG}` = '{trial.info.run_id}' and attributes.status = 'RUNNING'",
    )
    for run in [*children, trial]:
        mc.set_terminated(run.info.run_id, status="KILLED")


def summary_table(sweep: Sweep, rows: list[dict[str, Any]]) -> list[list[str]]:
    """The summary as rows of cells, header first: the searched values, the sweep's
    columns, the final stage's key and the trial's status."""
    params = [k for k in rows[0] if k not in (*sweep.columns, tracking.STAGE_KEY, "status")] if rows else []
    header = [*params, *sweep.columns, tracking.STAGE_KEY, "status"]
    body = [[_cell(r.get(h)) for h in header] for r in sorted(rows, key=lambda r: [str(r.get(p)) for p in params])]
    return [header, *body]


def find_trial_runs(mc, experiment_id: str, stage_keys: list[str]) -> dict[str, str | None]:
    """The trial runs of these final stage keys, each with its parent run (the sweep run
    that started it): one paged query over the experiment's trials."""
    wanted, found, token = set(stage_keys), {}, None
    while True:
        page = mc.search_runs(
            [experiment_id],
            filter_string=f"tags.{tracking.LEVEL} = '{tracking.TRIAL}'",
            max_results=5000,
            page_token=token,
        )
        found.update(
            {
                r.info.run_id: r.data.tags.get(tracking.PARENT_RUN_TAG)
                for r in page
                if r.data.tags.get(tracking.STAGE_KEY) in wanted
            }
        )
        token = page.token
        if not token:
            return found


def log_headline(mc, sweep_run: str, sweep: Sweep, rows: list[dict[str, Any]]) -> None:
    """The sweep run's headline metrics: the best trial's summary columns (best.<column>,
    by the sweep's metric and mode), and the best trial's run name as a tag."""
    metrics, best = tracking.best_metrics(rows, sweep.metric, sweep.mode, sweep.columns)
    if best is None:
        return
    tracking.log_metrics(mc, sweep_run, metrics)
    mc.set_tag(sweep_run, tracking.BEST_TRIAL, tracking.trial_run_name(rows[best][tracking.STAGE_KEY]))


def describe_sweep_run(
    mc,
    sweep_run: str,
    sweep: Sweep,
    table: list[list[str]],
    report: dict[str, Path],
    experiment_id: str | None = None,
    view: str | None = None,
) -> None:
    """The sweep run's description on the dashboard: the summary table, a link to the
    trials' view, and links to the report's files (artifacts of this run, under analysis/)."""
    header, *body = table
    lines = [
        f"**{sweep.name}** on preset `{sweep.spec.preset}`",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in body),
    ]
    if experiment_id is not None and view:
        lines += ["", f"[The trials, one row each]({'#' + dashboard.runs_route(experiment_id, view)})"]
    if report:  # the report, its headline figure and its tables; every file is in the run's artifacts
        shown: list[str] = [name for name in ("report.html", "frontier.png", "tables/tables.md") if name in report]
        shown += ["tables"] if any(name.startswith("tables/") for name in report) else []
        files = [
            f"[{name}]({'#' + dashboard.run_route(experiment_id, sweep_run, 'analysis/' + name)})"
            if experiment_id is not None
            else f"`analysis/{name}`"
            for name in shown
        ]
        lines += ["", f"Report: {' · '.join(files)} (all {len(report)} files: this run's artifacts, under `analysis/`)"]
    if "report.html" in report:
        lines += ["", f"On this machine: `{report['report.html']}`."]
    tracking.set_description(mc, sweep_run, "\n".join(lines))


def print_summary(
    table: list[list[str]],
    uri: str,
    experiment: str,
    sweep_run: str,
    store,
    local: Path,
    run_name: str,
    report: dict[str, Path] | None = None,
    links: str | None = None,
) -> None:
    header, *body = table
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(header)]
    print("\n" + "  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in body:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    print(f"\nMLflow:      {uri}  experiment {experiment!r}, sweep run {sweep_run}")
    print(links or f"dashboard:   {uri if dashboard.is_server(uri) else dashboard.server_command(uri)}")
    print(f"checkpoints: {store.path('stages')}")
    print(f"Ray results: {store.path('ray_tune', run_name)}  (Ray's log: {local / 'logs' / 'ray.log'})")
    if report:
        for name in ("frontier.png", "report.html"):
            if name in report:
                print(f"{name + ':':12s} {report[name]}")  # a space even after the 13-character frontier.png:
    print(
        f"re-plot:     python -m analysis --tracking-uri {uri} --experiment {experiment} --sweep-run {sweep_run} "
        f"--out {local / 'analysis' / run_name}"
    )


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)
