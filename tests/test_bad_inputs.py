"""Every bad input is one line, exit status 2, before anything expensive, naming the
argument as the user typed it (the CLI flag, not an internal field) and what is
allowed; nothing is left behind. One table walks every command and sweep."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from looplab.cli import main as looplab_main

REPO = Path(__file__).resolve().parents[1]
SWEEPS = ("beta_ablation", "adaptive_pipeline", "hole_sweep", "iso_flops", "mano", "phop")
TINY = ["train.steps=2", "train.batch_size=4", "task.eval_count=20", "train.eval_every=0", "model.n_loops=4"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A trained phop-debug checkpoint and damaged copies of it."""
    root = tmp_path_factory.mktemp("ckpt")
    assert looplab_main(["train", "--preset", "phop-debug", "--out", str(root / "run"), *TINY]) == 0
    good = root / "run" / "checkpoint"
    truncated = root / "truncated"
    shutil.copytree(good, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    mismatched = root / "mismatched"
    shutil.copytree(good, mismatched)
    config = json.loads((mismatched / "config.json").read_text())
    config["model"]["d_model"] = 64  # the weights are d_model 32
    (mismatched / "config.json").write_text(json.dumps(config))
    damaged = {}
    for name in ("scrambled", "nan", "integer", "layers", "loops", "header"):
        damaged[name] = root / name
        shutil.copytree(good, damaged[name])
    w = damaged["scrambled"] / "model.safetensors"  # random bytes behind an intact header
    header = 8 + int.from_bytes(w.read_bytes()[:8], "little")
    w.write_bytes(w.read_bytes()[:header] + os.urandom(w.stat().st_size - header))
    from safetensors.torch import load_file, save_file

    state = load_file(str(good / "model.safetensors"))
    for name, change in (
        ("nan", lambda s: s["lm_head.weight"].fill_(float("nan"))),
        ("integer", lambda s: s.__setitem__("norm_f.weight", s["norm_f.weight"].int())),
    ):
        tensors = {k: v.clone() for k, v in state.items()}
        change(tensors)
        save_file(tensors, str(damaged[name] / "model.safetensors"), metadata={"format": "looplab/1"})
        config = json.loads((damaged[name] / "config.json").read_text())
        config.pop("weights_sha256", None)  # as an older looplab wrote it: no digest to catch it
        (damaged[name] / "config.json").write_text(json.dumps(config))
    w = damaged["header"] / "model.safetensors"  # a header of valid JSON whose first entry lacks its offsets
    n = int.from_bytes(w.read_bytes()[:8], "little")
    table = json.loads(w.read_bytes()[8 : 8 + n])
    first = next(k for k in table if k != "__metadata__")
    del table[first]["data_offsets"]
    head = json.dumps(table).encode().ljust(n)[:n] if len(json.dumps(table)) <= n else json.dumps(table).encode()
    w.write_bytes(len(head).to_bytes(8, "little") + head + w.read_bytes()[8 + n :])
    for name, field in (("layers", "n_layers"), ("loops", "n_loops")):
        config = json.loads((damaged[name] / "config.json").read_text())
        config["model"][field] = 10**9
        (damaged[name] / "config.json").write_text(json.dumps(config))
    resumable = root / "resumable"  # a run whose checkpoint was cut short
    shutil.copytree(root / "run", resumable)
    w = resumable / "checkpoint" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    digest = root / "digest"  # what the fuzzer found (tests/test_fuzz.py): a recorded digest that is no digest
    shutil.copytree(good, digest)
    config = json.loads((digest / "config.json").read_text())
    config["weights_sha256"] = -1
    (digest / "config.json").write_text(json.dumps(config))
    metrics_folder = root / "metrics-folder"  # a run folder whose metrics.jsonl is a folder
    (metrics_folder / "metrics.jsonl").mkdir(parents=True)
    return {
        "good": good,
        "truncated": truncated,
        "mismatched": mismatched,
        "resumable": resumable,
        "digest": digest,
        "metrics_folder": metrics_folder,
        **damaged,
    }


LOOPLAB_CASES = [
    # (argv, what the one line must contain)
    (["eval", "--checkpoint", "/nonexistent"], "--checkpoint='/nonexistent' is invalid"),
    (["eval", "--checkpoint", "{truncated}"], "model.safetensors is damaged: truncated"),
    (["eval", "--checkpoint", "{mismatched}"], "model.safetensors disagrees with"),
    (["eval", "--checkpoint", "{scrambled}"], "model.safetensors is damaged: its bytes are not the ones saved"),
    (["eval", "--checkpoint", "{nan}"], "model.safetensors holds non-finite weights (lm_head.weight)"),
    (["eval", "--checkpoint", "{integer}"], "model.safetensors is damaged: norm_f.weight is I32"),
    (["eval", "--checkpoint", "{layers}"], "ModelConfig.n_layers=1000000000 is invalid"),
    (["eval", "--checkpoint", "{header}"], "header's entry"),
    (["eval", "--checkpoint", "{digest}"], "config.json is damaged: weights_sha256=-1, not a JSON string"),
    (["eval", "--checkpoint", "{good}", "--json", "{tmp}"], "allowed: a file path (this is a folder)"),
    (["eval", "--checkpoint", "{good}", "--device", "tpu"], "--device='tpu' is invalid"),
    (["train", "--preset", "phop-debug", "--out", "{good}/config.json"], "allowed: a folder (this is a file)"),
    (["train", "--preset", "phop-debug", "--out", "{good}/config.json/run"], "parent folders can be created"),
    (
        ["train", "--preset", "phop-debug", "--out", "{tmp}/t", "model.attn_layer_idx=5"],
        "override='model.attn_layer_idx=5' is invalid",
    ),
    (
        ["train", "--preset", "debug", "--out", "{tmp}/t", "train.seq_len=100000000"],
        "train.seq_len=100000000 is invalid; allowed: a plan that fits this machine's available memory",
    ),
    (["lm-eval", "--checkpoint", "{good}", "--tasks", "piqa", "--limit", "inf"], "argument --limit"),
    (
        ["bench", "--preset", "phop-debug", "--oracle-mean", "2", "--tracking-uri", "foo://x"],
        "--tracking-uri='foo://x' is invalid",
    ),
    (["generate", "--checkpoint", "{loops}", "--prompt", "hi"], "ModelConfig.n_loops=1000000000 is invalid"),
    (["eval", "--checkpoint", "{good}", "--policies", "skip"], "argument --policies: 'skip' is invalid"),
    (["eval", "--checkpoint", "{good}", "--policies", "forced:9"], "--policies='forced:9' is invalid"),
    (["eval", "--checkpoint", "{good}", "--batch-size", "0"], "argument --batch-size: '0' is invalid"),
    (["train", "--preset", "nope", "--out", "{tmp}/t"], "--preset='nope' is invalid"),
    (
        ["train", "--preset", "phop-debug", "--out", "{tmp}/t", "model.n_loops=0"],
        "override='model.n_loops=0' is invalid",
    ),
    (["train", "--preset", "phop-debug", "--out", "{tmp}/t", "nope=1"], "override 'nope' names no field"),
    (
        ["train", "--preset", "phop-debug", "--out", "{tmp}/t", "train.lr=Infinity"],
        "override='train.lr=inf' is invalid",
    ),
    (["train", "--preset", "phop-debug", "--out", "{tmp}/t", "train.lr=abc"], "override='train.lr=abc' is invalid"),
    (["train", "--preset", "phop-debug", "--out", "{tmp}/t", "train.lr=nan"], "override='train.lr=nan' is invalid"),
    (["train", "--preset", "phop-debug", "--out", "{tmp}/t", "train.lr=1e39"], "override='train.lr=1e+39' is invalid"),
    (
        ["train", "--preset", "phop-debug", "--out", "{tmp}/t", "train.adam_eps=1e-50"],
        "override='train.adam_eps=1e-50' is invalid",
    ),
    (["train", "--preset", "phop-debug", "--out", "{tmp}/t", "exit.beta=NaN"], "override='exit.beta=nan' is invalid"),
    (["train", "--preset", "phop-debug", "--stage", "stage1", "--out", "{tmp}/t"], "--stage stage1 needs --init"),
    (
        ["train", "--preset", "phop-debug", "--stage", "stage1", "--init", "/nope", "--out", "{tmp}/t"],
        "--init='/nope' is invalid",
    ),
    (["train", "--preset", "phop-debug", "--out", "{resumable}", *TINY], "model.safetensors is damaged"),
    (["train", "--preset", "phop-debug", "--out", "{tmp}/t", "--stop-at", "0"], "argument --stop-at: '0' is invalid"),
    (["lm-eval", "--checkpoint", "/nonexistent", "--tasks", "piqa"], "--checkpoint='/nonexistent' is invalid"),
    (["lm-eval", "--checkpoint", "{good}", "--tasks", "nosuchtask"], "--tasks='nosuchtask' is invalid"),
    (["lm-eval", "--checkpoint", "{good}", "--tasks", "piqa", "--policy", "skip"], "argument --policy"),
    (["lm-eval", "--checkpoint", "{good}", "--tasks", "piqa", "--limit", "0"], "argument --limit"),
    (["bench", "--preset", "phop-debug", "--batch", "0", "--oracle-mean", "2"], "argument --batch: '0' is invalid"),
    (["bench", "--preset", "phop-debug", "--batch", "0"], "argument --batch: '0' is invalid"),
    (["bench", "--preset", "phop-debug", "--seq-len", "8,x", "--oracle-mean", "2"], "argument --seq-len"),
    (
        ["bench", "--preset", "phop-debug", "--oracle-mean", "9", "--batch", "1", "--seq-len", "8", "n_loops=4"],
        "--oracle-mean=9.0 is invalid",
    ),
    (["bench", "--preset", "phop-debug", "--batch", "1", "--seq-len", "8"], "needs skip policies or an oracle"),
    (
        [
            "bench",
            "--preset",
            "debug",
            "--packing",
            "varlen",
            "--oracle-mean",
            "2",
            "--batch",
            "1",
            "--seq-len",
            "8",
            "arch=transformer",
        ],
        "--packing='varlen' is invalid for a transformer model",
    ),
    (["bench", "--preset", "nope", "--oracle-mean", "2"], "--preset='nope' is invalid"),
    (["bench", "--checkpoint", "{truncated}", "--oracle-mean", "2"], "model.safetensors is damaged"),
    (
        ["bench", "--preset", "phop-debug", "--policies", "dense:0.5", "--batch", "1", "--seq-len", "8"],
        "--policies='dense:0.5' is invalid",
    ),
    (["data", "mano", "--L", "0"], "argument --L: '0' is invalid"),
    (["data", "phop", "--n", "8", "--p", "7"], "PhopConfig.p=7 is invalid"),
    (["info", "--preset", "nope"], "--preset='nope' is invalid"),
    (["generate", "--checkpoint", "/nonexistent", "--prompt", "hi"], "--checkpoint='/nonexistent' is invalid"),
    (["generate", "--checkpoint", "{good}", "--prompt", "hi", "--max-new-tokens", "0"], "argument --max-new-tokens"),
    (["generate", "--checkpoint", "{good}", "--prompt", "hi", "--policy", "forced:9"], "--policy='forced:9'"),
    (["generate", "--checkpoint", "{good}", "--prompt", "hi", "--temperature", "-1"], "argument --temperature"),
    (["generate", "--checkpoint", "{good}", "--prompt", "hi", "--top-p", "2"], "argument --top-p"),
    (["generate", "--checkpoint", "{truncated}", "--prompt", "hi"], "model.safetensors is damaged"),
    (  # a byte's id indexes past p-hop's 15-row embedding: a line, not an IndexError
        ["generate", "--checkpoint", "{good}", "--prompt", "hi", "--tokenizer", "bytes"],
        "--tokenizer='bytes' is invalid for --checkpoint=",
    ),
    (
        ["bench", "--decode", "--preset", "phop-debug", "--new-tokens", "0", "--oracle-mean", "2"],
        "argument --new-tokens",
    ),
    (
        ["bench", "--preset", "phop-debug", "--dtype", "fp16", "--oracle-mean", "2"],
        "argument --dtype: 'fp16' is invalid; allowed: fp32 | bf16",
    ),
    (
        ["bench", "--decode", "--preset", "phop-debug", "--dtype", "auto", "--oracle-mean", "2"],
        "argument --dtype: 'auto' is invalid; allowed: fp32 | bf16",
    ),
    # Resources against this machine (looplab/costs/machine.py), before anything is allocated: a
    # batch no machine holds (it hung), steps (accepted), a run that cannot end, tokens (hung), threads.
    (
        ["train", "--preset", "debug", "--out", "{tmp}/t", "train.batch_size=1000000000"],
        "train.batch_size=1000000000 is invalid; allowed: a plan that fits this machine's available",
    ),
    (
        ["train", "--preset", "debug", "--out", "{tmp}/t", "train.steps=100000000000000000000"],
        "override='train.steps=100000000000000000000' is invalid; allowed: an integer in [1, 1,000,000,000]",
    ),
    (
        ["train", "--preset", "paper-140m", "--out", "{tmp}/t", "train.steps=1000000000"],
        "train.steps=1000000000 is invalid; allowed: a run that can end",
    ),
    (
        ["generate", "--checkpoint", "{good}", "--prompt", "hi", "--max-new-tokens", "1000000000000"],
        "--max-new-tokens=1000000000000 is invalid; allowed: at most 1,048,576 new tokens",
    ),
    (["bench", "--preset", "phop-debug", "--oracle-mean", "2", "--threads", "0"], "argument --threads: '0' is invalid"),
    (
        ["bench", "--preset", "phop-debug", "--oracle-mean", "2", "--threads", "100000"],
        "argument --threads: '100000' is invalid; allowed: an integer in [1, ",
    ),
    (
        ["bench", "--preset", "debug", "--oracle-mean", "2", "--batch", "1000000", "--seq-len", "1000000"],
        "--seq-len=1000000 is invalid; allowed: a plan that fits this machine's available",
    ),
    (
        [
            "bench",
            "--decode",
            "--preset",
            "debug",
            "--oracle-mean",
            "2",
            "--batch",
            "1",
            "--seq-len",
            "8",
            "--new-tokens",
            "2000000",
        ],
        "--new-tokens=2000000 is invalid",
    ),
    (["bench-arrivals", "--preset", "debug", "--requests", "100000000000"], "--requests=100000000000 is invalid"),
    # Destinations, checked by creating and writing them (root ignores permission bits), before the work:
    (["eval", "--checkpoint", "{good}", "--json", "/proc/looplab.json"], "--json='/proc/looplab.json' is invalid"),
    (["eval", "--checkpoint", "{good}", "--json", "/sys/looplab.json"], "--json='/sys/looplab.json' is invalid"),
    (["eval", "--checkpoint", "{good}", "--json", "/proc/version"], "--json='/proc/version' is invalid"),
    (["eval", "--checkpoint", "{good}", "--json", "{tmp}/" + "j" * 300], "File name too long"),
    (["eval", "--checkpoint", "{good}", "--json", ""], "--json='' is invalid"),
    (
        [
            "bench",
            "--preset",
            "phop-debug",
            "--oracle-mean",
            "2",
            "--batch",
            "1",
            "--seq-len",
            "8",
            "--json",
            "/proc/looplab.json",
        ],
        "--json='/proc/looplab.json' is invalid",
    ),
    (
        [
            "bench-arrivals",
            "--preset",
            "phop-debug",
            "--requests",
            "2",
            "--slots",
            "1",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--json",
            "/sys/looplab.json",
        ],
        "--json='/sys/looplab.json' is invalid",
    ),
    (
        ["lm-eval", "--checkpoint", "{good}", "--tasks", "piqa", "--output", "/proc/looplab.json"],
        "--output='/proc/looplab.json' is invalid",
    ),
    (["doctor", "--quick", "--no-ray", "--markdown", "/proc/looplab.md"], "--markdown='/proc/looplab.md' is invalid"),
    (["train", "--preset", "phop-debug", "--out", "/proc/looplab-run", *TINY], "--out='/proc/looplab-run' is invalid"),
    (["train", "--preset", "phop-debug", "--out", "/sys/looplab-run", *TINY], "--out='/sys/looplab-run' is invalid"),
    (["train", "--preset", "phop-debug", "--out", "{tmp}/" + "r" * 300, *TINY], "File name too long"),
    (["train", "--preset", "phop-debug", "--out", "", *TINY], "--out='' is invalid"),
    (["train", "--preset", "phop-debug", "--out", "{tmp}/a\x1b[2Jb", *TINY], "without control characters"),
    (["eval", "--checkpoint", "{good}", "--json", "{tmp}/a\nb.json"], "without control characters"),
    (["train", "--preset", "phop-debug", "--out", "{metrics_folder}", *TINY], "metrics.jsonl is a folder"),
    (["export", "--checkpoint", "{good}", "/proc/looplab-export"], "OUT_DIR='/proc/looplab-export' is invalid"),
    (["export", "--checkpoint", "{good}", ""], "OUT_DIR='' is invalid"),
    (
        ["bench", "--preset", "phop-debug", "--oracle-mean", "2", "--tracking-uri", "file:///proc/looplab-mlruns"],
        "--tracking-uri='file:///proc/looplab-mlruns' is invalid; allowed: sqlite:///",
    ),
    (
        ["bench", "--preset", "phop-debug", "--oracle-mean", "2", "--tracking-uri", "garbage"],
        "--tracking-uri='garbage' is invalid; allowed: sqlite:///",
    ),
    (
        ["bench", "--preset", "phop-debug", "--oracle-mean", "2", "--tracking-uri", "{tmp}"],
        "is invalid; allowed: sqlite:///",
    ),
    (
        ["bench", "--preset", "phop-debug", "--oracle-mean", "2", "--tracking-uri", "sqlite:////proc/looplab/m.db"],
        "--tracking-uri='sqlite:////proc/looplab/m.db' is invalid",
    ),
    (
        ["bench", "--preset", "phop-debug", "--oracle-mean", "2", "--tracking-uri", "sqlite:///{good}/config.json"],
        "is invalid; allowed: an SQLite database file",
    ),
    (["bench", "--preset", "phop-debug", "--oracle-mean", "2", "--tracking-uri", ""], "--tracking-uri='' is invalid"),
]


@pytest.mark.parametrize("argv, expected", LOOPLAB_CASES, ids=[" ".join(a[:3]) for a, _ in LOOPLAB_CASES])
def test_looplab_command_bad_input_is_one_line(argv, expected, checkpoints, tmp_path, capsys):
    fill = {k: str(v) for k, v in checkpoints.items()} | {"tmp": str(tmp_path)}
    argv = [a.format(**fill) for a in argv]
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as exit_:
        raise SystemExit(looplab_main(argv))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0
        and expected in err
        and ("allowed" in err or "needs" in err or "damaged" in err or "disagrees" in err or "names no field" in err)
    ), err
    assert sorted(tmp_path.rglob("*")) == before  # nothing left behind


SWEEP_CASES = [
    (
        "beta_ablation",
        ["--storage-path", "/proc/looplab-cannot-create"],
        "--storage-path='/proc/looplab-cannot-create'",
    ),
    ("beta_ablation", ["--betas", "x"], "--betas='x' is invalid"),
    ("beta_ablation", ["--betas", "-1"], "--betas=-1.0 is invalid"),
    ("beta_ablation", ["--betas", "0.1,inf"], "--betas=inf is invalid"),
    ("beta_ablation", ["--stage1-steps", "0"], "--stage1-steps=0 is invalid"),
    ("beta_ablation", ["--seeds", "a"], "--seeds='a' is invalid"),
    ("beta_ablation", ["--preset", "nope"], "--preset='nope' is invalid"),
    ("beta_ablation", ["--set", "train.lr=-1"], "--set='train.lr=-1' is invalid"),
    ("beta_ablation", ["--set", "nokey"], "--set='nokey' is invalid"),
    ("beta_ablation", ["--stage-set", "stage9:train.lr=1"], "--stage-set='stage9:train.lr=1' is invalid"),
    ("beta_ablation", ["--stage-set", "stage1:train.lr=-1"], "--stage-set='stage1:train.lr=-1' is invalid"),
    ("beta_ablation", ["--stage-steps", "stage1=0"], "--stage-steps='stage1=0' is invalid"),
    ("beta_ablation", ["--num-workers", "-1"], "--num-workers=-1 is invalid"),
    ("beta_ablation", ["--cpus-per-worker", "0"], "argument --cpus-per-worker: '0' is invalid"),
    ("beta_ablation", ["--cpus-per-worker", "100000"], "--cpus-per-worker=100000.0 is invalid"),
    (
        "beta_ablation",
        ["--set", "train.batch_size=1000000000"],
        "--set='train.batch_size=1000000000' is invalid; allowed: a plan that fits this machine's available memory",
    ),
    (
        "beta_ablation",
        ["--preset", "paper-140m", "--stage-set", "stage1:train.steps=1000000000", "--dry-run"],
        "--stage-set='stage1:train.steps=1000000000' is invalid; allowed: a run that can end",
    ),
    ("beta_ablation", ["--max-concurrent-trials", "x"], "argument --max-concurrent-trials"),
    ("beta_ablation", ["--gpu-memory", "-1"], "--gpu-memory=-1.0 is invalid"),
    ("beta_ablation", ["--gpu-memory", "0.001", "--memory-margin", "0"], "--gpu-memory=0.001 is invalid for pretrain"),
    ("beta_ablation", ["--gpu-memory", "8", "--memory-margin", "9"], "--memory-margin=9.0 is invalid"),
    ("beta_ablation", ["--mfu", "1.5"], "--mfu=1.5 is invalid"),
    ("beta_ablation", ["--gpu-tflops", "0"], "--gpu-tflops=0.0 is invalid"),
    ("beta_ablation", ["--tracking-uri", "foo://x"], "--tracking-uri='foo://x' is invalid"),
    (
        "beta_ablation",
        ["--tracking-uri", "sqlite:////etc/passwd/mlflow.db"],
        "--tracking-uri='sqlite:////etc/passwd/mlflow.db' is invalid",
    ),
    ("hole_sweep", ["--ranges", "3-2"], "--ranges='3-2' is invalid"),
    ("hole_sweep", ["--ranges", "1-5"], "--ranges='1.0-5.0' is invalid"),
    ("hole_sweep", ["--hps", "1.5"], "--hps=1.5 is invalid"),
    ("hole_sweep", ["--sampler", "random"], "--sampler='random' is invalid"),
    ("adaptive_pipeline", ["--arms", "nope"], "--arms='nope' is invalid"),
    ("adaptive_pipeline", ["--hp", "1.5"], "--hp=1.5 is invalid"),
    ("adaptive_pipeline", ["--depth-range", "3-2"], "--depth-range='3-2' is invalid"),
    ("adaptive_pipeline", ["--baselines"], "--preset='debug' is invalid; allowed: with --baselines: paper-140m"),
    ("iso_flops", ["--task", "nope"], "--task='nope' is invalid"),
    ("iso_flops", ["--archs", "rnn"], "--archs='rnn' is invalid"),
    (
        "iso_flops",
        ["--preset", "paper-140m", "--archs", "hybrid", "--pairs", "6x4"],
        "ModelConfig.attn_layer_idx=(5, 10, 15, 20) is invalid; allowed: distinct integers in [0, n_layers=6) "
        "(at the grid point --archs arch=hybrid, --pairs n_layers=6, --pairs n_loops=4; set it with --set "
        "model.attn_layer_idx=...)",
    ),
    # Empty strings would mean the current folder or the default; repeated values, the same trial twice:
    ("beta_ablation", ["--storage-path", ""], "argument --storage-path: '' is invalid"),
    ("beta_ablation", ["--tracking-uri", ""], "argument --tracking-uri: '' is invalid"),
    ("beta_ablation", ["--seeds", ""], "argument --seeds: '' is invalid"),
    ("beta_ablation", ["--seeds", "0,1,0"], "--seeds='0,1,0' is invalid; allowed: distinct"),
    ("beta_ablation", ["--betas", "0.1,0.1"], "--betas='0.1,0.1' is invalid; allowed: distinct"),
    ("hole_sweep", ["--ranges", "1-2,1.0-2.0"], "--ranges='1-2,1.0-2.0' is invalid; allowed: distinct"),
    ("iso_flops", ["--pairs", "4x1,4X1"], "--pairs='4x1,4X1' is invalid; allowed: distinct"),
    # Tracking stores MLflow cannot write, refused before the work, each in one line:
    ("beta_ablation", ["--tracking-uri", "garbage"], "--tracking-uri='garbage' is invalid; allowed: sqlite:///"),
    (
        "beta_ablation",
        ["--tracking-uri", "file:///proc/looplab-mlruns"],
        "--tracking-uri='file:///proc/looplab-mlruns' is invalid; allowed: sqlite:///",
    ),
    (
        "beta_ablation",
        ["--tracking-uri", "sqlite:////proc/looplab/m.db"],
        "--tracking-uri='sqlite:////proc/looplab/m.db' is invalid",
    ),
    ("beta_ablation", ["--storage-path", "/sys/looplab-cannot-create"], "--storage-path='/sys/looplab-cannot-create'"),
    # Values that used to pass the checks and fail later (issue 52):
    ("beta_ablation", ["--seeds", "99999999999999999999"], "--seeds='99999999999999999999' is invalid"),
    ("beta_ablation", ["--set", "train.seed=99999999999999999999"], "--set='train.seed=99999999999999999999'"),
    ("beta_ablation", ["--set", "train.lr=1e-320"], "--set='train.lr=1e-320' is invalid"),
    ("beta_ablation", ["--set", "train.warmup_steps=1000000"], "--set='train.warmup_steps=1000000' is invalid"),
    ("beta_ablation", ["--tracking-uri", "sqlite:///:memory:"], "--tracking-uri='sqlite:///:memory:' is invalid"),
    ("beta_ablation", ["--storage-path", "/tmp/a\x1b[31mb"], "argument --storage-path: '/tmp/a\\x1b[31mb' is invalid"),
    ("mano", ["--pairs", "1x0"], "--pairs='1x0' is invalid"),
    ("mano", ["--levels", "0"], "--levels=0 is invalid"),
    ("phop", ["--hops", "x"], "--hops='x' is invalid"),
]


@pytest.mark.parametrize("sweep, argv, expected", SWEEP_CASES, ids=[f"{s} {' '.join(a)}" for s, a, _ in SWEEP_CASES])
def test_sweep_bad_input_is_one_line_before_ray(sweep, argv, expected, tmp_path, capsys):
    import importlib

    import ray

    from sweeps.launch import main

    module = importlib.import_module(f"sweeps.{sweep}")
    add_flags = module.flags_for("text") if sweep == "iso_flops" else module.add_flags
    # Without --dry-run: checks that need the outside world (storage, tracking server) run too.
    storage = ["--storage-path", str(tmp_path / "store")] if "--storage-path" not in argv else []
    with pytest.raises(SystemExit) as exit_:  # argparse's own errors exit; the sweep's checks return 2
        raise SystemExit(main("test", add_flags, module.from_args, [*argv, *storage]))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"error: {expected}" in err and ("allowed" in err or "invalid" in err), err
    assert not ray.is_initialized() and not (tmp_path / "store").exists()  # nothing started, nothing left


# Commands over an existing experiment's store (sweeps/bench.py): a bad flag is one line
# before the store is read, and nothing is created (tests/test_bench_sweep.py has the
# checks that need a store: stages, policies against them, the experiment's name).
SPEED_CASES = [
    (["--grid", "table7"], "--grid='table7' is invalid; allowed: table5-140m | table5-370m | table6 | debug"),
    (["--batches", "1,x"], "--batches='1,x' is invalid"),
    (["--seq-lens", "-2048"], "--seq-lens='-2048' is invalid"),
    (["--policies", "forced:2"], "--policies='forced:2' is invalid; allowed: skip policies"),
    (["--dtype", "fp8"], "--dtype='fp8' is invalid; allowed: fp32 | bf16"),
    (["--packing", "dense"], "--packing='dense' is invalid; allowed: auto | padded | varlen"),
    (["--repeats", "2.5"], "--repeats='2.5' is invalid"),
    (["--cpus", "-1"], "--cpus='-1' is invalid"),
    (["--stages", "stage5"], "--stages='stage5' is invalid"),
    ([], "--tracking-uri="),  # no store at the storage path: not created
]


@pytest.mark.parametrize("argv, expected", SPEED_CASES, ids=[" ".join(a) or "no store" for a, _ in SPEED_CASES])
def test_speed_sweep_bad_input_is_one_line(argv, expected, tmp_path, capsys):
    import ray

    from sweeps.bench import main

    assert main(["--experiment", "x", "--storage-path", str(tmp_path / "store"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {expected}") and "allowed" in err, err
    assert not ray.is_initialized() and not (tmp_path / "store").exists()


@pytest.mark.parametrize("command", ["sweeps.bench", "sweeps.evaluate"])
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--storage-path", ""], "argument --storage-path: '' is invalid"),  # not the current folder's store
        (["--tracking-uri", ""], "argument --tracking-uri: '' is invalid"),  # not the storage's default store
    ],
)
def test_store_commands_refuse_empty_paths(command, argv, expected, tmp_path, capsys):
    import importlib

    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(command).main(["--experiment", "x", *argv])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.count("\n") == 0 and expected in err and "allowed" in err, err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--storage-path", "FILE"], "allowed: a folder (this is a file)"),
        (["--storage-path", "/dev/null"], "--storage-path='/dev/null' is invalid; allowed: a folder"),
        (["--tracking-uri", "http://127.0.0.1:9"], "allowed: a reachable MLflow server"),
    ],
)
def test_a_dry_run_checks_destinations_as_the_run_does(argv, expected, tmp_path, capsys):
    """The dry run refuses what the run would refuse, before it measures anything."""
    from sweeps import beta_ablation
    from sweeps.launch import main

    (tmp_path / "file").write_text("")
    argv = [a.replace("FILE", str(tmp_path / "file")) for a in argv]
    storage = [] if "--storage-path" in argv else ["--storage-path", str(tmp_path / "store")]
    code = main("test", beta_ablation.add_flags, beta_ablation.from_args, ["--dry-run", *argv, *storage])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and expected in err, err
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("command", ["sweeps.bench", "sweeps.evaluate", "sweeps.beta_ablation"])
def test_a_storage_path_on_a_symlink_loop_is_one_line(command, tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    argv = ["--dry-run", "--storage-path", str(tmp_path / "a")]
    argv += ["--experiment", "x"] if command != "sweeps.beta_ablation" else []
    done = subprocess.run([sys.executable, "-m", command, *argv], capture_output=True, text=True, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == 2 and err.count("\n") == 0, err
    assert err.startswith(f"error: --storage-path='{tmp_path / 'a'}' is invalid; allowed: a folder"), err


def test_speed_sweep_refuses_repeated_values(tmp_path, capsys):
    from sweeps.bench import main

    assert main(["--experiment", "x", "--storage-path", str(tmp_path / "store"), "--batches", "1,4,1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: --batches='1,4,1' is invalid; allowed: distinct"), err


@pytest.mark.parametrize(
    "out, expected",
    [
        ("", "--out='' is invalid"),
        ("/proc/looplab-analysis", "--out='/proc/looplab-analysis' is invalid"),
        ("{tmp}/" + "a" * 300, "File name too long"),
    ],
)
def test_analysis_out_is_checked_before_reading(out, expected, tmp_path, capsys):
    from analysis.__main__ import main

    store = tmp_path / "mlflow.db"
    store.write_bytes(b"")  # an (empty) store: the --out check comes next
    assert main(["--tracking-uri", f"sqlite:///{store}", "--experiment", "x", "--out", out.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and expected in err and "allowed" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]


def test_speed_sweep_has_a_working_help():
    for command in (
        [sys.executable, str(REPO / "sweeps" / "bench.py"), "--help"],
        [sys.executable, "-m", "sweeps.bench", "--help"],
    ):
        done = subprocess.run(command, capture_output=True, text=True, cwd="/", timeout=120)
        assert done.returncode == 0 and "--experiment" in done.stdout and "table5-140m" in done.stdout, done.stderr


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_sweep_script_has_a_working_help(sweep):
    # Run as a file from anywhere; run as a module (one sweep: the mechanism is the package's, not the script's).
    commands = [[sys.executable, str(REPO / "sweeps" / f"{sweep}.py"), "--help"]]
    if sweep == SWEEPS[0]:
        commands.append([sys.executable, "-m", f"sweeps.{sweep}", "--help"])
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, cwd="/", timeout=120)
        assert done.returncode == 0 and "--preset" in done.stdout, done.stderr[-500:]


def test_unknown_analysis_experiment_is_one_line(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "analysis",
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'none.db'}",
            "--experiment",
            "nope",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
        env={**os.environ},
    )
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
