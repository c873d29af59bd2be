"""Where runs come from: the tables of an MLflow store, as long polars frames.

Two sources with one interface:

- SqlSource, for a SQL tracking URI (sqlite:///..., postgresql://..., mysql://...):
  reads MLflow's own tables (experiments, runs, tags, params, latest_metrics,
  metrics) with one query per table for all runs of the chosen experiments. The
  schema is MLflow 3.17's (mlflow/store/tracking/dbmodels/models.py and its alembic
  migrations): runs.run_uuid, tags/params (key, value, run_uuid), latest_metrics and
  metrics (key, value, timestamp, step, is_nan, run_uuid); NaN is stored as value 0
  with is_nan set, ±inf as ±1.7976931348623157e308.
- ClientSource, for anything else (an http MLflow server): MlflowClient.search_runs in
  pages of 1,000, and get_metric_history only for the histories asked for.

Each method returns a long frame with fixed column names and types, also when empty:
  experiments: experiment_id, name
  runs:        run_id, experiment_id, run_name, status, start_ms, end_ms, artifact_uri
  tags/params: run_id, key, value
  latest:      run_id, key, value, step
  extrema:     run_id, key, min, max, count      (over each metric's whole history)
  history:     run_id, key, step, value
"""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from analysis.errors import AnalysisError
from looplab import tracking

if TYPE_CHECKING:
    import sqlalchemy

SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
INF_SENTINEL = 1.7976931348623157e308  # how MLflow's SQL store writes ±inf

RUN_SCHEMA = {
    "run_id": pl.String,
    "experiment_id": pl.String,
    "run_name": pl.String,
    "status": pl.String,
    "start_ms": pl.Int64,
    "end_ms": pl.Int64,
    "artifact_uri": pl.String,
}
KV_SCHEMA = {"run_id": pl.String, "key": pl.String, "value": pl.String}
LATEST_SCHEMA = {"run_id": pl.String, "key": pl.String, "value": pl.Float64, "step": pl.Int64}
EXTREMA_SCHEMA = {"run_id": pl.String, "key": pl.String, "min": pl.Float64, "max": pl.Float64, "count": pl.Int64}
HISTORY_SCHEMA = {"run_id": pl.String, "key": pl.String, "step": pl.Int64, "value": pl.Float64}
EXPERIMENT_SCHEMA = {"experiment_id": pl.String, "name": pl.String}

# Metrics whose best value is kept (names.higher_is_better says which way): the
# extrema query reads only these, so training noise (lr, grad_norm) costs nothing.
BEST_SUFFIXES = (tracking.PPL, tracking.LOSS, tracking.ACCURACY)
BEST_INFIXES = (tracking.LM_EVAL,)


def _scheme(uri: str) -> str:
    """The database of a SQLAlchemy URI, driver dropped: sqlite+pysqlite:/// -> sqlite."""
    return uri.split(":", 1)[0].split("+", 1)[0].lower()


def is_sql_uri(uri: str) -> bool:
    return _scheme(uri) in SQL_SCHEMES


def open_source(uri: str, backend: str = "auto") -> SqlSource | ClientSource:
    """auto: SQL for a SQL URI, else the client; "sql" / "client" force one (the
    client also reads SQL stores, through MLflow's own store code)."""
    if backend not in ("auto", "sql", "client"):
        raise AnalysisError(f"backend={backend!r} is invalid; allowed: auto | sql | client")
    if backend == "client" or (backend == "auto" and not is_sql_uri(uri)):
        return ClientSource(uri)
    if not is_sql_uri(uri):
        raise AnalysisError(f"backend=sql needs a SQL tracking URI (sqlite:///..., postgresql://...), not {uri}")
    return SqlSource(uri)


def sqlite_path(uri: str) -> str:
    """The file of a SQLAlchemy sqlite URI: sqlite:///relative.db, sqlite:////abs.db
    (query options after '?' dropped). Parsed by hand: importing SQLAlchemy costs
    0.4 s that a local store does not need."""
    rest = uri.split(":", 1)[1]
    if not rest.startswith("///"):
        return ""  # sqlite:// is an in-memory database
    return rest[3:].split("?", 1)[0]


def wants_best(key: str) -> bool:
    return key.endswith(BEST_SUFFIXES) or any(i in key for i in BEST_INFIXES)


def _finite(expr: pl.Expr) -> pl.Expr:
    """MLflow's ±inf sentinels back to ±inf."""
    return (
        pl.when(expr >= INF_SENTINEL).then(float("inf")).when(expr <= -INF_SENTINEL).then(float("-inf")).otherwise(expr)
    )


class SqlSource:
    """Batch SQL over MLflow's tables: one query per table, never one per run."""

    def __init__(self, uri: str):
        self.uri = uri
        self._conn: sqlite3.Connection | sqlalchemy.Connection
        if _scheme(uri) == "sqlite":
            path = sqlite_path(uri)
            if not path or path == ":memory:" or not Path(path).is_file():
                raise AnalysisError(f"no MLflow store at {path or '(no path)'} (from --tracking-uri {uri})")
            # Read-only: an analysis never creates or migrates a store.
            self._conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        else:
            import sqlalchemy

            self._conn = sqlalchemy.create_engine(uri).connect()
        try:
            self._frame("SELECT run_uuid FROM runs WHERE 1 = 0", {"run_uuid": pl.String})
        except Exception as e:  # noqa: BLE001 -- sqlite3, SQLAlchemy or polars errors alike: say so in one line
            raise AnalysisError(
                f"{uri} is not a readable MLflow tracking store ({type(e).__name__}: {str(e).splitlines()[0]})"
            ) from None

    def _frame(self, query: str, schema: dict) -> pl.DataFrame:
        df = pl.read_database(query, self._conn, schema_overrides=schema, infer_schema_length=None)
        if df.is_empty():
            return pl.DataFrame(schema=schema)
        return df.select([pl.col(c).cast(t) for c, t in schema.items()])

    @staticmethod
    def _ids(experiment_ids: list[str]) -> str:
        # Experiment ids are integers in MLflow's SQL schema; int() keeps the SQL literal safe.
        return ", ".join(str(int(e)) for e in experiment_ids) or "NULL"

    def _of_runs(self, experiment_ids: list[str]) -> str:
        return (
            f"SELECT run_uuid FROM runs WHERE experiment_id IN ({self._ids(experiment_ids)}) "
            "AND lifecycle_stage = 'active'"
        )

    def experiments(self) -> pl.DataFrame:
        return self._frame(
            "SELECT experiment_id, name FROM experiments WHERE lifecycle_stage = 'active'", EXPERIMENT_SCHEMA
        )

    def experiment_of_run(self, run_id: str) -> str | None:
        safe = "".join(c for c in run_id if c.isalnum())  # run ids are hex: nothing else may reach the SQL
        df = self._frame(f"SELECT experiment_id FROM runs WHERE run_uuid = '{safe}'", {"experiment_id": pl.String})
        return df["experiment_id"][0] if df.height else None

    def runs(self, experiment_ids: list[str]) -> pl.DataFrame:
        return self._frame(
            "SELECT run_uuid AS run_id, experiment_id, name AS run_name, status, start_time AS start_ms, "
            "end_time AS end_ms, artifact_uri FROM runs "
            f"WHERE experiment_id IN ({self._ids(experiment_ids)}) AND lifecycle_stage = 'active'",
            RUN_SCHEMA,
        )

    def tags(self, experiment_ids: list[str]) -> pl.DataFrame:
        return self._frame(
            f"SELECT run_uuid AS run_id, key, value FROM tags WHERE run_uuid IN ({self._of_runs(experiment_ids)})",
            KV_SCHEMA,
        )

    def params(self, experiment_ids: list[str]) -> pl.DataFrame:
        return self._frame(
            f"SELECT run_uuid AS run_id, key, value FROM params WHERE run_uuid IN ({self._of_runs(experiment_ids)})",
            KV_SCHEMA,
        )

    def latest(self, experiment_ids: list[str]) -> pl.DataFrame:
        df = self._frame(
            "SELECT run_uuid AS run_id, key, CASE WHEN is_nan THEN NULL ELSE value END AS value, step "
            f"FROM latest_metrics WHERE run_uuid IN ({self._of_runs(experiment_ids)})",
            LATEST_SCHEMA,
        )
        return df.with_columns(_finite(pl.col("value")).alias("value"))

    def extrema(self, experiment_ids: list[str]) -> pl.DataFrame:
        wanted = " OR ".join([f"key LIKE '%{s}'" for s in BEST_SUFFIXES] + [f"key LIKE '%{i}%'" for i in BEST_INFIXES])
        df = self._frame(
            "SELECT run_uuid AS run_id, key, MIN(value) AS min, MAX(value) AS max, COUNT(*) AS count FROM metrics "
            f"WHERE run_uuid IN ({self._of_runs(experiment_ids)}) AND NOT is_nan AND ({wanted}) "
            "GROUP BY run_uuid, key",
            EXTREMA_SCHEMA,
        )
        return df.with_columns(_finite(pl.col("min")).alias("min"), _finite(pl.col("max")).alias("max"))

    def history(self, experiment_ids: list[str], keys: list[str]) -> pl.DataFrame:
        if not keys:
            return pl.DataFrame(schema=HISTORY_SCHEMA)
        names = ", ".join("'" + k.replace("'", "''") + "'" for k in keys)
        # The last value logged at each step wins (a resumed run may log a step twice).
        df = self._frame(
            "SELECT run_uuid AS run_id, key, step, CASE WHEN is_nan THEN NULL ELSE value END AS value, timestamp "
            f"FROM metrics WHERE key IN ({names}) AND run_uuid IN ({self._of_runs(experiment_ids)})",
            {**HISTORY_SCHEMA, "timestamp": pl.Int64},
        )
        return (
            df.sort("timestamp")
            .unique(["run_id", "key", "step"], keep="last")
            .select("run_id", "key", "step", _finite(pl.col("value")).alias("value"))
            .sort("run_id", "key", "step")
        )


class ClientSource:
    """The MLflow client API, for tracking servers: search_runs pages carry tags,
    params and latest metrics; histories are fetched per (run, key), only for the
    keys asked for, a few requests at a time."""

    PAGE = 1000
    THREADS = 8

    def __init__(self, uri: str):
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        self._runs: dict[tuple[str, ...], list] = {}
        try:
            self._experiments = self._client.search_experiments()
        except Exception as e:  # noqa: BLE001 -- MlflowException, connection errors, bad URIs: one line
            raise AnalysisError(
                f"cannot read the MLflow tracking server at {uri} ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''})"
            ) from None

    def experiments(self) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "experiment_id": [e.experiment_id for e in self._experiments],
                "name": [e.name for e in self._experiments],
            },
            schema=EXPERIMENT_SCHEMA,
        )

    def experiment_of_run(self, run_id: str) -> str | None:
        try:
            return self._client.get_run(run_id).info.experiment_id
        except Exception:  # noqa: BLE001 -- the client raises MlflowException or HTTP errors for an unknown id
            return None

    def _search(self, experiment_ids: list[str]) -> list:
        key = tuple(experiment_ids)
        if key not in self._runs:
            runs: list = []  # mlflow Runs, as self._runs holds them
            token: str | None = None
            while True:
                page = self._client.search_runs(list(experiment_ids), max_results=self.PAGE, page_token=token)
                runs.extend(page)
                token = page.token
                if not token:
                    break
            self._runs[key] = runs
        return self._runs[key]

    def runs(self, experiment_ids: list[str]) -> pl.DataFrame:
        rows = [
            {
                "run_id": r.info.run_id,
                "experiment_id": r.info.experiment_id,
                "run_name": r.info.run_name,
                "status": r.info.status,
                "start_ms": r.info.start_time,
                "end_ms": r.info.end_time,
                "artifact_uri": r.info.artifact_uri,
            }
            for r in self._search(experiment_ids)
        ]
        return pl.DataFrame(rows, schema=RUN_SCHEMA)

    def _kv(self, experiment_ids: list[str], field: str) -> pl.DataFrame:
        rows = [(r.info.run_id, k, v) for r in self._search(experiment_ids) for k, v in getattr(r.data, field).items()]
        return pl.DataFrame(rows, schema=KV_SCHEMA, orient="row")

    def tags(self, experiment_ids: list[str]) -> pl.DataFrame:
        return self._kv(experiment_ids, "tags")

    def params(self, experiment_ids: list[str]) -> pl.DataFrame:
        return self._kv(experiment_ids, "params")

    def latest(self, experiment_ids: list[str]) -> pl.DataFrame:
        # search_runs returns each metric's latest value; its step is not public, so step stays null.
        rows = [(r.info.run_id, k, v, None) for r in self._search(experiment_ids) for k, v in r.data.metrics.items()]
        return pl.DataFrame(rows, schema=LATEST_SCHEMA, orient="row")

    def extrema(self, experiment_ids: list[str], keys: list[str] | None = None) -> pl.DataFrame:
        """Best values need whole histories, one request per (run, key): only for `keys`
        (exact names; the caller keeps the list short). None: no extrema."""
        if not keys:
            return pl.DataFrame(schema=EXTREMA_SCHEMA)
        hist = self.history(experiment_ids, keys)
        return (
            hist.drop_nulls("value")
            .group_by("run_id", "key")
            .agg(
                pl.col("value").min().alias("min"),
                pl.col("value").max().alias("max"),
                pl.len().cast(pl.Int64).alias("count"),
            )
            .select(list(EXTREMA_SCHEMA))
        )

    def history(self, experiment_ids: list[str], keys: list[str]) -> pl.DataFrame:
        pairs = [(r.info.run_id, k) for r in self._search(experiment_ids) for k in keys if k in r.data.metrics]
        if not pairs:
            return pl.DataFrame(schema=HISTORY_SCHEMA)

        def fetch(pair):
            run_id, key = pair
            return [(run_id, key, m.step, m.value, m.timestamp) for m in self._client.get_metric_history(run_id, key)]

        with ThreadPoolExecutor(self.THREADS) as pool:
            rows = [row for chunk in pool.map(fetch, pairs) for row in chunk]
        df = pl.DataFrame(rows, schema={**HISTORY_SCHEMA, "timestamp": pl.Int64}, orient="row")
        return (
            df.sort("timestamp")
            .unique(["run_id", "key", "step"], keep="last")
            .drop("timestamp")
            .with_columns(pl.when(pl.col("value").is_nan()).then(None).otherwise(pl.col("value")).alias("value"))
            .sort("run_id", "key", "step")
        )
