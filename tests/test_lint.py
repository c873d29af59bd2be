"""The linter's floor holds for the whole repository (pyproject.toml's [tool.ruff]):
no unused or undefined names and no syntax errors, anywhere a reader might look."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (the test extra: pip install -e '.[test]')")
    done = subprocess.run(
        [ruff, "check", "--no-cache", str(REPO)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_ruff_catches_an_unused_import(tmp_path):
    """The check is live: a planted unused import fails it under the project's settings."""
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    planted = tmp_path / "planted.py"
    planted.write_text("import os\n")
    done = subprocess.run(
        [ruff, "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(planted)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "F401" in done.stdout, done.stdout + done.stderr
