"""What reaches the console: looplab's own lines, and of the libraries it drives only
their warnings and errors. Their INFO lines (MLflow's "Creating initial MLflow database
tables...", Optuna's "A new study created in memory ...") go to a log file instead, or
stay where they were with `verbose`.

MLflow and Optuna install their own console handlers on their loggers when imported
(and Optuna again when it first logs), so `quiet_libraries` acts on the handlers they
hold when it is called: a caller calls it after the import that configures them (a
sweep: before it opens its tracking store, and again after it builds Optuna's search).
Repeated calls change nothing more.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

# The libraries whose INFO lines are theirs, not a researcher's: MLflow's (and the
# schema migrations it runs through alembic), Optuna's, Ray's.
LIBRARIES = ("mlflow", "alembic", "optuna", "ray")
# Imported first when installed, so that the handlers their import installs exist to be quieted
CONFIGURED_AT_IMPORT = ("mlflow",)


def quiet_libraries(log_file: str | Path | None = None, verbose: bool = False) -> None:
    """Library console handlers show warnings and errors only; with `log_file`, every
    line the libraries log (at their own levels: MLflow's and Optuna's INFO) is appended
    there as well. `verbose`: leave them as they are (their INFO lines on the console)."""
    if verbose:
        return
    for name in CONFIGURED_AT_IMPORT:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    target = str(Path(log_file).resolve()) if log_file is not None else None
    for name in LIBRARIES:
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setLevel(max(handler.level, logging.WARNING))
        if target is None:
            continue
        # The loggers' own levels stay: what a library keeps quiet (MLflow's alembic below
        # WARNING: seventy schema-migration lines per new database) stays out of the file too.
        if not any(getattr(h, "baseFilename", None) == target for h in logger.handlers):
            file_handler = logging.FileHandler(target)
            file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logger.addHandler(file_handler)
