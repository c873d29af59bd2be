"""looplab/console.py: the libraries' INFO lines go to the log, not the console, where
a sweep prints its own progress; their warnings stay on the console; --verbose leaves
them all there. Run in a fresh process: MLflow and Optuna configure their handlers when
first imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("optuna")
pytest.importorskip("mlflow")

# What a sweep does: quiet, open a new MLflow store (MLflow announces its tables), build
# Optuna's search (Optuna announces its study), then a library warns.
SCRIPT = """
import logging, sys
from looplab.console import quiet_libraries
log, verbose, db = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
quiet_libraries(log, verbose=verbose)
from mlflow.tracking import MlflowClient
MlflowClient(f"sqlite:///{db}").search_experiments()
import optuna
quiet_libraries(log, verbose=verbose)
optuna.create_study()
logging.getLogger("mlflow").warning("the store is slow")
"""


def run(tmp_path, verbose: bool) -> tuple[str, str]:
    log = tmp_path / "ray.log"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log), "1" if verbose else "0", str(tmp_path / "mlflow.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr, log.read_text() if log.exists() else ""


def test_library_info_goes_to_the_log_and_warnings_stay(tmp_path):
    console, log = run(tmp_path, verbose=False)
    assert "Creating initial MLflow database tables" not in console and "A new study created" not in console
    assert "the store is slow" in console  # a warning is still the researcher's business
    assert "INFO mlflow.store.db.utils: Creating initial MLflow database tables" in log
    assert "INFO optuna" in log and "A new study created in memory" in log
    assert "Running upgrade" not in log  # MLflow keeps alembic's migrations below WARNING; so does the log


def test_verbose_leaves_the_libraries_lines_on_the_console(tmp_path):
    console, log = run(tmp_path, verbose=True)
    assert "Creating initial MLflow database tables" in console and "A new study created" in console
    assert log == ""
