"""A sweep's stages as the platform derives them: the precedence of overrides, keys
that change when (and only when) a result can, warmups that follow a stage's own
steps, paper budgets in the plan. No Ray: the sweeps' dry-run path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sweeps import adaptive_pipeline, beta_ablation
from sweeps.flags import parser
from trainables.pipeline import stage_configs

REPO = Path(__file__).resolve().parents[1]


def configs_of(module, argv, point):
    """The stage configs of one trial point of a sweep, from its command line."""
    from sweeps.flags import Common

    p = parser("test")
    (module.flags_for("text") if hasattr(module, "flags_for") else module.add_flags)(p)
    args = p.parse_args(argv)
    sweep = module.from_args(Common.from_args(args), args)
    return {c.stage: c for c in stage_configs(sweep.spec, point, "/unused")}


ARM = {"arm": "chase", "seed": 0}


def test_a_sweep_wide_override_reaches_every_stage_over_its_recipe():
    plain = configs_of(adaptive_pipeline, [], ARM)
    assert plain["stage1"].train.lr == 1.5e-4 and plain["pretrain"].train.lr == 3e-3  # recipe vs preset
    lr = configs_of(adaptive_pipeline, ["--set", "train.lr=0.001", "--set", "train.grad_clip=0.3"], ARM)
    assert {s: (c.train.lr, c.train.grad_clip) for s, c in lr.items()} == {
        s: (0.001, 0.3) for s in ("pretrain", "stage1", "chase", "stage2")
    }


def test_a_per_stage_override_reaches_only_its_stage():
    one = configs_of(
        adaptive_pipeline,
        ["--set", "train.lr=0.001", "--stage-set", "chase:train.lr=0.002", "--stage-steps", "stage2=7"],
        ARM,
    )
    assert {s: c.train.lr for s, c in one.items()} == {
        "pretrain": 0.001,
        "stage1": 0.001,
        "chase": 0.002,
        "stage2": 0.001,
    }
    assert {s: c.train.steps for s, c in one.items()} == {"pretrain": 200, "stage1": 200, "chase": 200, "stage2": 7}


def test_own_data_named_relative_to_the_command_is_found_from_a_trials_folder(tmp_path, monkeypatch):
    """Tune runs each trial in a working folder of its own: a relative --set
    task.dataset=notes.jsonl, typed where the file is, reaches the trials absolute (before:
    'not found' in the first trial, the path taken from Ray's folder)."""
    (tmp_path / "notes.jsonl").write_text("".join(f'{{"text": "note {i} " }}\n' for i in range(3)))
    monkeypatch.chdir(tmp_path)
    argv = ["--preset", "debug", "--set", "task.dataset=notes.jsonl", "--stage-set", "stage1:task.dataset=./*.jsonl"]
    sweep_args = parser("test")
    beta_ablation.add_flags(sweep_args)
    from sweeps.flags import Common

    args = sweep_args.parse_args(argv)
    spec = beta_ablation.from_args(Common.from_args(args), args).spec
    assert spec.overrides["task.dataset"] == str(tmp_path / "notes.jsonl")
    assert spec.stage_overrides["stage1"]["task.dataset"] == str(tmp_path / "*.jsonl")
    elsewhere = tmp_path / "ray-trial-folder"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    pretrain, stage1 = stage_configs(spec, {"beta": 0.1, "seed": 0}, tmp_path / "store")
    assert pretrain.stage_key() and stage1.stage_key()  # each reads its data's digest from here


def test_a_stage_with_overridden_steps_gets_its_warmup_from_its_own_steps():
    # App. D: Stage-2 warms up over 1% of its steps, Stage-1 and CHASE over 0.2%.
    long = configs_of(adaptive_pipeline, ["--stage-steps", "stage2=5000,chase=1000"], ARM)
    assert long["stage2"].train.warmup_steps == 50 and long["chase"].train.warmup_steps == 2
    assert long["stage1"].train.warmup_steps == 1  # 0.2% of its 200 steps, at least one
    explicit = configs_of(
        adaptive_pipeline, ["--stage-steps", "stage2=5000", "--stage-set", "stage2:train.warmup_steps=9"], ARM
    )
    assert explicit["stage2"].train.warmup_steps == 9  # an explicit warmup wins


CADENCE = [
    ["--set", "train.log_every=5"],
    ["--set", "train.eval_every=7"],
    ["--set", "train.ckpt_every=3"],
    ["--set", "train.device=cpu"],
    ["--set", "train.eval_batch_size=3"],
    ["--set", "train.ckpt_minutes=1"],
    ["--set", "train.micro_batch_size=2"],
    ["--set", "train.activation_checkpointing=true"],
]


@pytest.mark.parametrize("argv", CADENCE, ids=[" ".join(a) for a in CADENCE])
def test_cadence_and_device_never_change_a_key(argv):
    base = {s: c.stage_key() for s, c in configs_of(adaptive_pipeline, [], ARM).items()}
    assert {s: c.stage_key() for s, c in configs_of(adaptive_pipeline, argv, ARM).items()} == base


@pytest.mark.parametrize(
    "argv, point, changed",
    [
        (["--set", "train.lr=0.001"], ARM, {"pretrain", "stage1", "chase", "stage2"}),
        (["--stage-set", "chase:train.lr=0.001"], ARM, {"chase", "stage2"}),  # and everything downstream of it
        (["--set", "model.n_loops=3", "--depth-range", "1.5-3"], ARM, {"pretrain", "stage1", "chase", "stage2"}),
        (["--set", "exit.beta=0.5"], ARM, {"stage1", "chase", "stage2"}),  # pre-training reads no exit section
        (["--hp", "0.25"], ARM, {"chase", "stage2"}),  # only CHASE reads the holes
        ([], {"arm": "chase", "seed": 1}, {"pretrain", "stage1", "chase", "stage2"}),
    ],
)
def test_what_can_change_a_result_changes_its_stage_and_everything_downstream(argv, point, changed):
    base = {s: c.stage_key() for s, c in configs_of(adaptive_pipeline, [], ARM).items()}
    new = {s: c.stage_key() for s, c in configs_of(adaptive_pipeline, argv, point).items()}
    assert {s for s in base if base[s] != new[s]} == changed


def test_beta_searched_in_stage1_keeps_one_pretraining_and_its_budget_follows_the_preset():
    a = configs_of(beta_ablation, [], {"beta": 0.1, "seed": 0})
    b = configs_of(beta_ablation, [], {"beta": 0.5, "seed": 0})
    assert a["pretrain"].stage_key() == b["pretrain"].stage_key() and a["stage1"].stage_key() != b["stage1"].stage_key()
    assert a["stage1"].train.steps == 40  # 20% of debug's 200
    paper = configs_of(beta_ablation, ["--preset", "paper-140m"], {"beta": 0.1, "seed": 0})
    assert paper["stage1"].train.steps == 2500 and paper["pretrain"].train.steps == 75_000  # App. D


def test_the_platform_edits_no_import_path():
    found = subprocess.run(
        ["grep", "-rn", "sys.path", "sweeps", "trainables", "analysis", "looplab"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert found.stdout == "", found.stdout


@pytest.mark.slow  # 20 s of dry runs on 2 cores: .ci/run runs it after the suite
def test_gpu_memory_fits_micro_batches_without_changing_any_key(capsys):
    """The acceptance dry run: paper-140m on 8 × 80 GiB plans each stage with a printed
    micro-batch × accumulation × ranks and a peak under 80 GiB; the fitted micro-batches
    (unkeyed) leave the stage keys and the sweep's own key as they were."""
    from sweeps.flags import Common, Launch
    from sweeps.launch import main
    from sweeps.sweep import fit_devices, sweep_key, validate

    argv = ["--preset", "paper-140m", "--num-workers", "8", "--gpus-per-worker", "1", "--address", "auto"]
    assert (
        main(
            "test", adaptive_pipeline.add_flags, adaptive_pipeline.from_args, argv + ["--dry-run", "--gpu-memory", "80"]
        )
        == 0
    )
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("  pretrain-") or line.startswith("  stage1-")]
    assert lines and all("micro-batch" in line and "× 8 rank(s)" in line for line in lines)
    for line in lines:
        peak = float(line.split("peak ≈ ")[1].split(" GiB")[0])
        assert 0 < peak <= 80
    assert "GPU-hours" in out

    p = parser("test")
    adaptive_pipeline.add_flags(p)
    args = p.parse_args(argv + ["--gpu-memory", "80"])
    sweep, launch = adaptive_pipeline.from_args(Common.from_args(args), args), Launch.from_args(args)
    points, _ = validate(sweep, launch)
    fitted, plans = fit_devices(sweep, launch, points)
    assert (
        fitted.spec.stage_overrides["pretrain"]["train.micro_batch_size"]
        == plans[next(k for k in plans if k.startswith("pretrain"))].micro_batch
    )
    before = {c.stage_key() for p_ in points for c in stage_configs(sweep.spec, p_, "/unused")}
    after = {c.stage_key() for p_ in points for c in stage_configs(fitted.spec, p_, "/unused")}
    assert before == after and sweep_key(fitted, launch) == sweep_key(sweep, launch)


def test_paper_pipelines_plan_the_papers_stage_budgets():
    steps = {s: c.train.steps for s, c in configs_of(adaptive_pipeline, ["--preset", "paper-140m"], ARM).items()}
    assert steps == {"pretrain": 75_000, "stage1": 2500, "chase": 800, "stage2": 600}  # App. D
    big = configs_of(adaptive_pipeline, ["--preset", "paper-370m"], ARM)
    assert big["chase"].train.steps == 2000 and big["stage2"].train.warmup_steps == 6  # 1% of 600
    assert (
        configs_of(adaptive_pipeline, ["--preset", "paper-140m", "--stage-steps", "chase=100"], ARM)[
            "chase"
        ].train.steps
        == 100
    )


def test_switching_the_backbone_keeps_the_papers_settings_for_it():
    import torch

    from looplab.models.looped import LoopedLM
    from sweeps import iso_flops

    def build(arch):
        (cfg,) = configs_of(
            iso_flops,
            ["--preset", "paper-140m", "--archs", arch, "--pairs", "24x1"],
            {"arch": arch, "n_layers": 24, "n_loops": 1, "seed": 0},
        ).values()
        with torch.device("meta"):
            return cfg, LoopedLM(cfg.model).num_parameters()

    transformer, n = build("transformer")
    assert transformer.model.d_intermediate == 640 and 138e6 < n < 144e6  # App. D: ≈141M, not LLaMA's 219M
    hybrid, _ = build("hybrid")
    assert hybrid.model.attn_layer_idx == (5, 10, 15, 20)
    table3 = configs_of(
        iso_flops,
        ["--preset", "paper-table3", "--archs", "transformer", "--pairs", "6x4"],
        {"arch": "transformer", "n_layers": 6, "n_loops": 4, "seed": 0},
    )["pretrain"]
    assert table3.train.steps == 50_000 and table3.model.d_intermediate == 640  # Table 3: 100B tokens


def test_a_list_valued_override_on_a_preset_family_is_not_a_variant_lookup():
    """attn_layer_idx=[1, 3] on a paper preset: a plain override (lists have no
    preset variant), not a TypeError from hashing the list."""
    from looplab.presets import get_preset, stage_config

    cfg = stage_config(
        get_preset("paper-140m"), "pretrain", overrides={"model.arch": "hybrid", "model.attn_layer_idx": [1, 3]}
    )
    assert cfg.model.attn_layer_idx == (1, 3)


def test_each_mano_level_trains_with_its_own_recipe():
    from sweeps import mano

    recipes = {}
    for L in (10, 16, 24):
        (cfg,) = configs_of(
            mano,
            ["--preset", "mano-L24", "--levels", "10,16,24", "--pairs", "4x6"],
            {"L": L, "n_layers": 4, "n_loops": 6, "seed": 0},
        ).values()
        recipes[L] = (cfg.task.L, cfg.train.steps, cfg.train.lr)
    assert recipes == {10: (10, 80_000, 5e-4), 16: (16, 110_000, 1e-4), 24: (24, 200_000, 5e-5)}  # App. B


def test_phop_is_its_declaration_hops_to_task_p_and_table_2s_pairs():
    """phop.py is only data (depth_grid.DepthTask): --hops reaches task.p, and a paper
    preset gets Table 2's 14 pairs."""
    from sweeps import phop
    from sweeps.flags import Common

    p = parser("test")
    phop.add_flags(p)
    args = p.parse_args(["--preset", "phop-p16", "--hops", "16,32"])
    sweep = phop.from_args(Common.from_args(args), args)
    assert sweep.name == "phop" and sweep.grid == {"p": [16, 32]} and sweep.flags["p"] == "--hops"
    assert len(sweep.points) == 14 and {"n_layers": 1, "n_loops": 12} in sweep.points
    (cfg,) = configs_of(
        phop, ["--preset", "phop-p16", "--hops", "16,32"], {"p": 32, "n_layers": 1, "n_loops": 12, "seed": 0}
    ).values()
    assert (cfg.task.p, cfg.model.n_layers, cfg.model.n_loops) == (32, 1, 12)


def test_a_sweeps_default_seed_is_its_presets(capsys):
    """The paper trains its language models with seed 3407 (App. D): a sweep on a paper
    preset defaults to it, one on a preset of seed 0 to 0; --seeds still overrides."""
    from sweeps import beta_ablation
    from sweeps.launch import main

    def seeds(argv):
        assert main("t", beta_ablation.add_flags, beta_ablation.from_args, [*argv, "--dry-run"]) == 0
        out = capsys.readouterr().out
        return {int(line.split('"seed": ')[1].split("}")[0]) for line in out.splitlines() if '"seed": ' in line}

    assert seeds(["--preset", "paper-140m", "--betas", "0.1"]) == {3407}
    assert seeds(["--preset", "debug", "--betas", "0.1"]) == {0}
    assert seeds(["--preset", "paper-140m", "--betas", "0.1", "--seeds", "1,2"]) == {1, 2}


def test_the_summary_sets_every_path_apart_from_its_label(capsys, tmp_path):
    from sweeps.sweep_record import print_summary
    from trainables.storage import Storage

    report = {"frontier.png": tmp_path / "f.png", "report.html": tmp_path / "r.html"}
    print_summary([["beta"], ["0.1"]], "sqlite:///m.db", "e", "run", Storage(tmp_path), tmp_path, "name", report)
    out = capsys.readouterr().out
    assert f"frontier.png: {report['frontier.png']}" in out and f"report.html: {report['report.html']}" in out
