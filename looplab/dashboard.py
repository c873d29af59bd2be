"""MLflow's dashboard for a sweep: the URL that opens the sweep's trials in the
model-training (classic runs) view, the saved view behind it, and the command that
serves a local store (`looplab dashboard STORE`; looplab/dashboard_server.py runs it).

What MLflow 3.17.2's UI (mlflow/server/js/build/static/js) does, which this module
follows:

- Its mode (GenAI or Model training) is the URL's `workflowType` query parameter, else
  the browser's stored choice (localStorage `mlflow.workflowType`), else GenAI: the
  experiment tag `mlflow.experimentKind` does not decide it (main.*.js: the hook that
  reads the tag returns the workflow type's kind whenever a feature flag is on, and the
  flag is a constant `() => !0`). So every URL printed here carries
  `workflowType=machine_learning`, and opens the `/runs` tab.
- A saved view is an experiment tag `mlflow.sharedViewState.<id>` holding
  {"name", "createdAt", "updatedAt", "state"}, `state` a JSON text of the runs page's
  search facets (searchFilter, orderByKey, orderByAsc, ...) and its table state
  (selectedColumns, columnOrder, ...; not runsExpanded, which a view never sets);
  `viewStateShareKey=<id>` in the URL applies it, and the page's saved-views menu lists
  it by name. The facets are ignored when the URL carries any
  of them itself, so the filter and order live in the view, not the URL.
- A column is "<params|metrics|tags|attributes>.`<key>`"; nested runs (the tag
  mlflow.parentRunId) nest in the table only while no filter is set and the order is by
  start time; a run's page lists its child runs and links its parent.

No MLflow import here: URLs and the view are text; tracking.save_view writes the view.
"""

from __future__ import annotations

import json
import shlex
from pathlib import PurePosixPath
from typing import Any, Iterable
from urllib.parse import urlencode

from looplab import tracking

WORKFLOW_PARAM = "workflowType"  # the UI's mode: genai | machine_learning
MACHINE_LEARNING = "machine_learning"  # "Model training"
VIEW_PARAM = "viewStateShareKey"
LOCAL_HOST, LOCAL_PORT = "127.0.0.1", 5000  # where the printed `looplab dashboard` command serves a local store
STORE_FILE, SQLITE = "mlflow.db", "sqlite:///"  # a sweep's local store: STORAGE/mlflow.db
PARAMS, METRICS, TAGS = "params", "metrics", "tags"


def is_server(uri: str) -> bool:
    """An MLflow tracking server, as opposed to a store a process opens itself."""
    return uri.startswith(("http://", "https://"))


def column(kind: str, key: str) -> str:
    """A runs-table column, as the UI names it: column("params", "search.beta") ->
    "params.`search.beta`"."""
    if kind not in (PARAMS, METRICS, TAGS):
        raise ValueError(f"kind={kind!r} is invalid; allowed: {PARAMS} | {METRICS} | {TAGS}")
    return f"{kind}.`{key}`"


def trials_filter(sweep_run_id: str) -> str:
    """The search filter of the trials a sweep run started: level trial, child of the
    sweep run (the subtree analysis reads)."""
    return f"tags.{tracking.LEVEL} = '{tracking.TRIAL}' and tags.`{tracking.PARENT_RUN_TAG}` = '{sweep_run_id}'"


def runs_filter(run_ids: Iterable[str]) -> str:
    """The search filter of these runs (a sweep's trials once it knows them, those an
    earlier sweep trained and this one reused included)."""
    quoted = ", ".join(f"'{r}'" for r in sorted(set(run_ids)))
    return f"attributes.run_id IN ({quoted})"


def sweep_view(run_filter: str, searched: Iterable[str], metrics: Iterable[str]) -> dict[str, Any]:
    """The runs page's state for a sweep: the runs of `run_filter` (its trials), ordered
    by the first searched param, with a column per searched param (search.<name>) and per
    headline metric."""
    searched, metrics = list(searched), list(metrics)
    params = [tracking.SEARCH_PARAM + name for name in searched]
    columns = [*(column(PARAMS, p) for p in params), *(column(METRICS, m) for m in metrics)]
    # columnOrder puts the params first (the table's default is metrics, then params).
    state: dict[str, Any] = {"searchFilter": run_filter, "selectedColumns": columns, "columnOrder": columns}
    if params:
        state.update(orderByKey=column(PARAMS, params[0]), orderByAsc=True)
    return state


def view_tag_value(name: str, state: dict[str, Any], created_ms: int) -> str:
    """The value of a saved view's experiment tag (the UI's envelope)."""
    return json.dumps(
        {
            "name": name,
            "createdAt": int(created_ms),
            "updatedAt": int(created_ms),
            "state": json.dumps(state, sort_keys=True),
        },
        sort_keys=True,
    )


def base_url(uri: str, host: str = LOCAL_HOST, port: int = LOCAL_PORT) -> str:
    """Where the dashboard is: the tracking server itself, or the local server
    `server_command` starts for a store on this machine."""
    return uri.rstrip("/") if is_server(uri) else f"http://{host}:{port}"


def runs_route(experiment_id: str, view: str | None = None) -> str:
    """The runs tab of an experiment in the model-training view (the part after '#')."""
    query = {WORKFLOW_PARAM: MACHINE_LEARNING, **({VIEW_PARAM: view} if view else {})}
    return f"/experiments/{experiment_id}/runs?{urlencode(query)}"


def run_route(experiment_id: str, run_id: str, artifact: str | None = None) -> str:
    """A run's page, or one of its artifacts in the page's artifact browser."""
    path = f"/experiments/{experiment_id}/runs/{run_id}" + (f"/artifacts/{artifact}" if artifact else "")
    return f"{path}?{urlencode({WORKFLOW_PARAM: MACHINE_LEARNING})}"


def url(base: str, route: str) -> str:
    return f"{base.rstrip('/')}/#{route}"


def store_argument(uri: str) -> str:
    """The STORE of `looplab dashboard STORE` for a store's URI: the sweep's storage folder
    when the URI is that folder's mlflow.db, else the URI itself."""
    if uri.startswith(SQLITE):
        path = PurePosixPath(uri[len(SQLITE) :])
        if path.name == STORE_FILE:
            return str(path.parent)
    return uri


def server_command(uri: str, host: str = LOCAL_HOST, port: int = LOCAL_PORT) -> str:
    """The command that serves a local store's dashboard until Ctrl-C: `looplab dashboard`
    (looplab/dashboard_server.py: one worker, no orphans), not a bare `mlflow server`, whose
    4 default workers kept dying on a loaded 2-core machine (issue 37)."""
    flags = ([f"--host {shlex.quote(host)}"] if host != LOCAL_HOST else []) + (
        [f"--port {port}"] if port != LOCAL_PORT else []
    )
    return " ".join(["looplab dashboard", shlex.quote(store_argument(uri)), *flags])


def dashboard_lines(uri: str, experiment_id: str, view: str, sweep_run_id: str) -> list[str]:
    """What a sweep prints about its dashboard: on a server, the URLs of the trials and of
    the sweep run; on a local store, the command that serves it first."""
    base = base_url(uri)
    lines = [] if is_server(uri) else [f"serve it:  {server_command(uri)}"]
    return [
        *lines,
        f"trials:    {url(base, runs_route(experiment_id, view))}",
        f"sweep run: {url(base, run_route(experiment_id, sweep_run_id))}",
    ]


# What a trial's page leads with: the figures a researcher compares across trials, in order.
TRIAL_FIGURES = (
    (tracking.VAL_PPL, "validation perplexity (full depth)"),
    (tracking.VAL_ACCURACY, "validation accuracy (full depth)"),
    (tracking.EXIT_ENTROPY, "exit entropy (training's last window)"),
    (tracking.EXPECTED_EXIT_STEP, "expected exit step (training's last window)"),
)


def trial_description(label: str, lineage: list[str], summary: dict[str, float]) -> str:
    """A trial run's description (Markdown): its searched values, its stages, and its
    headline figures from the last stage. The run charts the last stage's training curves
    and the sweep's headline figures (trainables/trial.py); every policy's figures, one
    point each, are on the stage run, so the description says where they are."""
    rows = [f"| {name} | {summary[key]:.4g} |" for key, name in TRIAL_FIGURES if key in summary]
    table = ["| figure | value |", "|---|---|", *rows] if rows else ["(no figures: the trial logged none)"]
    return "\n".join(
        [
            f"**Trial {label}**: stages {' → '.join(lineage)}.",
            "",
            *table,
            "",
            "The charts below are the last stage's training curves and the sweep's headline figures. "
            "Every policy's figures (one point each: the stage's final evaluation) are on the stage runs "
            "nested under this one, and the sweep run's `analysis/` holds the comparison across trials "
            "(axis.png, report.html).",
        ]
    )
