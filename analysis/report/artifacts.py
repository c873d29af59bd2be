"""The report's files as MLflow artifacts (folder `analysis`) of the sweep run."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import polars as pl

from analysis.errors import AnalysisError
from analysis.load import RunSet
from looplab import tracking

ARTIFACT_DIR = "analysis"


def newest_sweep_run(runs: RunSet) -> str | None:
    """The most recently started run tagged level=sweep, the default owner of the artifacts."""
    sweeps = runs.runs.filter(pl.col("level") == tracking.SWEEP).sort("start_time", descending=True)
    return sweeps["run_id"][0] if sweeps.height else None


def local_artifact_dir(runs: RunSet, run_id: str) -> Path | None:
    """The run's artifact folder when its artifact URI is a local path (file:// or
    plain), else None. A run outside the loaded runs (another experiment) goes
    through MLflow."""
    hit = runs.runs.filter(pl.col("run_id") == run_id)
    uri = hit["artifact_uri"][0] if hit.height else None
    if not uri:
        return None
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "" and uri.startswith("/"):
        return Path(uri)
    return None


def log_to_sweep_run(
    runs: RunSet, sweep_run_id: str | None, paths: dict[str, Path], notes: list[str], strict: bool
) -> None:
    """The files this report wrote (not whatever else lies in out_dir), under analysis/."""
    target = sweep_run_id or newest_sweep_run(runs)
    if target is None:
        notes.append("artifacts: not logged, no run tagged level=sweep in the experiments (pass --sweep-run ID)")
        return
    try:
        local = local_artifact_dir(runs, target)
        if local is not None:  # what MLflow's LocalArtifactRepository does, without importing mlflow (4 s)
            for name, path in paths.items():
                dest = local / ARTIFACT_DIR / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)
        else:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=runs.tracking_uri)
            for name, path in paths.items():
                folder = Path(name).parent.as_posix()
                client.log_artifact(
                    target, str(path), artifact_path=ARTIFACT_DIR if folder == "." else f"{ARTIFACT_DIR}/{folder}"
                )
    except Exception as e:  # noqa: BLE001 -- any store failure (permissions, server) must not cost the written files
        message = f"artifacts: logging to run {target} failed ({type(e).__name__}: {str(e).splitlines()[0]})"
        if strict:
            raise AnalysisError(message) from None
        notes.append(message)
        return
    notes.append(f"artifacts: logged to run {target} under {ARTIFACT_DIR}/")
