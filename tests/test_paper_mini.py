"""The miniature reproduction (sweeps/paper_mini.py): its declaration, the keyed speed
step, the dry run (the protocol, its power analysis, seeds and pins, headline or
exploratory, the time estimate), and (slow tier) the whole command at toy size: the
verdicts written, marked exploratory, a re-run that trains nothing, one more seed that
trains only it."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from looplab import tracking
from looplab.costs.resources import flops_per_token, row_length
from sweeps import paper_mini, scale_scan
from sweeps.estimate import RAY_START_S, TRIAL_S, estimate, evaluations, makespan
from sweeps.flags import Launch, parse_seeds
from sweeps.protocol import V2, V5
from sweeps.schedule import chains_in_trials, longest_first, owned_costs, replay
from sweeps.sweep import grid_points
from trainables.pipeline import stage_configs

ROOT = Path(__file__).resolve().parents[1]


def test_the_arms_share_their_pretraining_and_the_seeds_are_not_the_scans(tmp_path):
    sweep = paper_mini.lm_sweep()
    configs = {
        (p["arm"], p["n_layers"], p["n_loops"]): stage_configs(sweep.spec, {**p, "seed": 200}, tmp_path)
        for p in grid_points(sweep)
    }
    pretrain = {key: c[0].stage_key() for key, c in configs.items()}
    # The gated arms, their controls and the fixed 1⊗4 are one pre-training; 1⊗1 and 4⊗1 are their own.
    assert (
        pretrain[("ouro", 1, 4)]
        == pretrain[("chase", 1, 4)]
        == pretrain[("fixed", 1, 4)]
        == pretrain[("ouro-matched", 1, 4)]
        == pretrain[("fixed-matched", 1, 4)]
    )
    assert len(set(pretrain.values())) == 3
    ouro, chase, matched = configs[("ouro", 1, 4)], configs[("chase", 1, 4)], configs[("ouro-matched", 1, 4)]
    assert ouro[1].stage_key() == chase[1].stage_key() == matched[1].stage_key()  # one Stage-1 for all three
    assert [c.stage for c in chase] == ["pretrain", "stage1", "chase", "stage2"]
    assert chase[0].train.steps == 800 and all(c.train.steps == 200 for c in chase[1:])
    assert chase[2].hole.sampler == "depth" and (chase[2].hole.lo, chase[2].hole.hi) == (1.85, 3.45)
    assert not set(parse_seeds(scale_scan.SEEDS)) & set(paper_mini.PROTOCOL.seeds)
    # every continued stage continues its parent's data stream: 8 rows a step
    assert [c.train.data_start for c in chase] == [0, 800 * 8, 1000 * 8, 1200 * 8]


def test_the_compared_arms_train_their_weights_equally_long(tmp_path):
    """Step matching, read from the configs the trials train (not the protocol's own
    arithmetic): CHASE, its Ouro control and the fixed-depth control all train their
    backbone for the same number of steps on as many fresh samples (their data streams
    end alike); the stock arms are shown short of it."""
    sweep = paper_mini.lm_sweep()
    weight_steps = {}
    for p in grid_points(sweep):
        configs = stage_configs(sweep.spec, {**p, "seed": 200}, tmp_path)
        weight_steps[p["arm"], p["n_layers"], p["n_loops"]] = sum(
            c.train.steps for c in configs if c.stage != "stage2"
        )  # Stage-2 trains the gate alone
    assert (
        weight_steps["chase", 1, 4] == weight_steps["ouro-matched", 1, 4] == weight_steps["fixed-matched", 1, 4] == 1200
    )
    assert weight_steps["ouro", 1, 4] == 1000 and weight_steps["fixed", 1, 4] == 800
    matched = stage_configs(sweep.spec, {"arm": "ouro-matched", "n_layers": 1, "n_loops": 4, "seed": 200}, tmp_path)
    chase = stage_configs(sweep.spec, {"arm": "chase", "n_layers": 1, "n_loops": 4, "seed": 200}, tmp_path)
    # The Ouro control is CHASE's stage without its holes: same steps, same recipe.
    assert (matched[2].train.steps, matched[2].train.lr, matched[2].train.warmup_steps) == (
        chase[2].train.steps,
        chase[2].train.lr,
        chase[2].train.warmup_steps,
    )
    assert matched[2].stage == "stage1_more" and chase[2].hole.hp == 0.5
    fixed = stage_configs(sweep.spec, {"arm": "fixed-matched", "n_layers": 1, "n_loops": 4, "seed": 200}, tmp_path)
    ends = {
        name: c[-2 if c[-1].stage == "stage2" else -1].as_parent().data_end
        for name, c in (("chase", chase), ("ouro-matched", matched), ("fixed-matched", fixed))
    }
    assert set(ends.values()) == {1200 * 8}  # 1,200 weight steps of fresh samples each


def _quiet_dry_run(monkeypatch, behaviour=None):
    """The dry run without its probes: the estimate stubbed, the behaviour check reading
    `behaviour` (default: exactly the declared first steps)."""
    monkeypatch.setattr(paper_mini, "speed_seconds", lambda *a, **k: 1.0)
    monkeypatch.setattr("sweeps.estimate.estimate", lambda *a, **k: type("E", (), {"text": lambda self: "est"})())
    monkeypatch.setattr("sweeps.fingerprint.training_fingerprint", lambda *a, **k: dict(behaviour or V5.pins.behaviour))


def test_the_dry_run_shows_the_protocol_its_power_analysis_and_the_matched_plan(tmp_path, capsys, monkeypatch):
    _quiet_dry_run(monkeypatch)
    monkeypatch.setattr("sweeps.fingerprint.machine_class", lambda: V5.pins.machine)
    monkeypatch.setattr("sweeps.fingerprint.torch_version", lambda: V5.pins.torch)
    assert paper_mini.main(["--dry-run", "--storage-path", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"digest {V5.digest()}" in out and "correction holm over a fixed family of 10" in out
    assert "shown, not judged here: C4-batch1, C4-growth" in out
    assert (
        "ouro-matched   pretrain 800 → stage1 200 → stage1_more 200 → stage2 200 (gate only): 1200 "
        "weight-training steps" in out
    )
    assert "fixed-matched  pretrain 800 → pretrain_more 400: 1200 weight-training steps" in out
    assert "disclosed: fixed-matched continues pre-training in one 400-step stage" in out
    assert "stage1_more:" in out and "pretrain_more:" in out  # the plan's trials train them
    assert "seeds (the declared ones, inside the digest): lm 500-512 (13); phop 500-507 (8); mano 500-517 (18)" in out
    assert "fresh (not yet used, or first used under this protocol): 500-517" in out
    assert "this run would be the headline" in out
    assert "power analysis" in out and "C3-few" in out and "under-powered" not in out


def test_other_seeds_or_changed_code_make_the_run_exploratory(tmp_path, capsys, monkeypatch):
    """Other seeds, --set, a seed an earlier protocol used, and a stage whose first steps
    moved (a behaviour change in the code) are each named before anything trains."""
    moved = dict(V5.pins.behaviour)
    label = "paper_mini_lm pretrain 1⊗4"
    moved[label] = [v * (1 + 1e-4) for v in moved[label]]
    _quiet_dry_run(monkeypatch, moved)
    assert paper_mini.main(["--dry-run", "--storage-path", str(tmp_path), "--seeds", "900,901"]) == 0
    out = capsys.readouterr().out
    assert "this run would be EXPLORATORY" in out
    assert "the seeds are not the protocol's declared ones" in out
    assert f"{label}: its first steps' losses are" in out and "the code computes something else" in out
    assert (
        paper_mini.main(["--dry-run", "--storage-path", str(tmp_path), "--seeds", "100,303", "--set", "train.steps=10"])
        == 0
    )
    out = capsys.readouterr().out
    assert "modified by --set/--stage-set" in out and f"digest {V5.digest()}" not in out
    assert "--set/--stage-set make another protocol" in out
    assert "    100: first used under 93fe2c4f8c75" in out and "seed 303 was first used under eb7a16dd9c01" in out


def test_a_bad_preset_is_one_line(capsys):
    assert paper_mini.main(["--preset", "local", "--dry-run"]) == 2
    assert "--preset='local' is invalid" in capsys.readouterr().err


def test_the_speed_step_is_keyed_by_content(tmp_path):
    from looplab.checkpoint import load_model, save_model
    from trainables.bench import BenchTarget, SpeedPoint, measure

    save_model(load_model("debug", seed=0), tmp_path / "ckpt")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mc = tracking.client(uri)
    experiment = tracking.ensure_experiment(mc, "speed", tmp_path / "mlflow")
    points = [SpeedPoint(1, 16, "skip:0.5"), SpeedPoint(2, 16, "skip:0.5")]
    target = BenchTarget(str(tmp_path / "ckpt"), "k1", "h", "CHASE")
    kw = dict(repeats=1, threads=1)
    first = measure(mc, experiment, None, target, points=points, **kw)
    assert [r["reused"] for r in first] == [False, False] and all(r["speedup"] > 0 for r in first)
    again = measure(mc, experiment, None, target, points=points + [SpeedPoint(1, 32, "skip:0.5")], **kw)
    assert [r["reused"] for r in again] == [True, True, False]
    assert [r["speedup"] for r in again[:2]] == pytest.approx([r["speedup"] for r in first])
    runs = mc.search_runs([experiment])
    assert len(runs) == 3 and {r.data.tags[tracking.STAGE_KEY] for r in runs} == {"k1"}


def test_the_estimate_probes_each_stage_shape_once(tmp_path):
    protocol = paper_mini.PROTOCOL.with_overrides(
        {
            "train.steps": 5,
            "train.seq_len": 16,
            "task.val_blocks": 2,
            "train.eval_every": 0,
            "train.eval_qs": [0.5, 1.0],
            "model.d_model": 32,
        },
        {},
    )
    sweep = paper_mini.lm_sweep(protocol)
    launch = Launch(storage_path=str(tmp_path), seeds=(0, 1))
    points = [{**p, "seed": s} for p in grid_points(sweep) for s in launch.seeds]
    est = estimate([(sweep, points)], launch, concurrency=2)
    assert est.seconds > 0 and "paper_mini_lm: 20 of 20 stages to train" in est.text()
    cfg = stage_configs(sweep.spec, points[0], tmp_path)[0]
    assert evaluations(cfg) == 1


def test_makespan_starts_each_job_on_the_first_free_slot():
    assert makespan([3, 3, 3], 2) == 6  # three equal chains on two slots: two rounds, not 4.5
    assert makespan([5, 1, 1, 1], 2) == 5
    assert makespan([1, 1, 5], 2) == 6  # order matters: the long job starts last
    assert makespan([2, 2], 4) == 2 and makespan([], 2) == 0


def test_the_estimate_replays_the_schedule(tmp_path, monkeypatch):
    """With every step costing 1 s and evaluations nothing, the estimate of the LM sweep
    at two seeds is the hand-computed schedule. Two shared chains (pre-training 5 steps
    + Stage-1 200) on two slots train inside the trials: each in its chase trial (the
    most work of its own: CHASE + Stage-2, 400), which start first side by side; then
    the other trials longest first, each reusing what the chase trials trained. On four
    slots the chains train first, side by side, each with the machine's half."""
    monkeypatch.setattr("looplab.training.probe.probe_seconds", lambda cfg, steps: (1.0, 0.0))
    sweep = paper_mini.lm_sweep(V2.with_overrides({"train.steps": 5}, {}))  # v2's arms: the schedule by hand
    launch = Launch(storage_path=str(tmp_path), seeds=(0, 1))
    points = [{**p, "seed": s} for p in grid_points(sweep) for s in launch.seeds]  # point-major, as planned
    est = estimate([(sweep, points)], launch, concurrency=2)
    assert [(p["arm"], p["n_layers"], p["n_loops"]) for p in longest_first(sweep, points, str(tmp_path))][:4] == [
        ("chase", 1, 4),
        ("chase", 1, 4),
        ("ouro", 1, 4),
        ("ouro", 1, 4),
    ]
    # Per slot: chase (chain 205 + 400), ouro (Stage-2 200), 4⊗1 and 1⊗1 (5 each), the
    # reused fixed 1⊗4 (nothing); every trial adds TRIAL_S.
    assert est.seconds == pytest.approx(RAY_START_S + (TRIAL_S + 605) + (TRIAL_S + 200) + 3 * TRIAL_S + 10)
    assert "14 of 14 stages to train" in est.text() and "shared chain(s) first" not in est.text()
    wide = estimate([(sweep, points)], launch, concurrency=4)
    # The chains first (205 each, side by side); then chase, chase, ouro, ouro on four
    # slots, the short trials after the ouro ones: chase's 400 is the longest.
    assert wide.seconds == pytest.approx(RAY_START_S + (TRIAL_S + 205) + (TRIAL_S + 400))
    assert "14 of 14 stages to train (2 shared chain(s) first)" in wide.text()


def test_replay_waits_for_a_stage_an_earlier_trial_is_training():
    # a trains x (10 s); b, on the other slot, waits for x until 10, then trains 1.
    assert replay([[("x", 10.0)], [("x", None), ("y", 1.0)]], 2) == 11
    # a stage no earlier trial trains is there already: no wait
    assert replay([[("x", None), ("y", 1.0)]], 2) == 1
    assert replay([[("x", 3.0)], [("y", 3.0)], [("x", None), ("z", 1.0)]], 2) == 4


def test_chains_train_in_trials_where_they_fill_the_slots():
    assert chains_in_trials(5, 2) and chains_in_trials(2, 2)
    assert not chains_in_trials(1, 2)  # one chain: it gets both slots' CPUs in a phase of its own
    assert not chains_in_trials(5, 0)  # no cap (a cluster): waiting trials would hold devices
    assert not chains_in_trials(3, 1)  # one slot: no slot left idle to fill


def test_a_shared_stage_costs_once_and_its_owner_starts_before_its_users(tmp_path):
    """Every gated and matched arm needs its seed's pre-training, the gated ones its
    Stage-1 too. Each stage counts once, for one trial of those that need it (the trial
    costs add up to the stages' total), and that trial starts before the others."""
    from trainables.pipeline import stage_dir

    sweep = paper_mini.lm_sweep()
    points = [{**p, "seed": s} for p in grid_points(sweep) for s in (0, 1)]
    cost, _ = owned_costs(sweep, points, str(tmp_path))
    once, users = {}, Counter()
    for p in points:
        for cfg in stage_configs(sweep.spec, p, str(tmp_path)):
            folder = stage_dir(str(tmp_path), cfg)
            once[folder] = flops_per_token(cfg) * cfg.train.steps * cfg.train.batch_size * row_length(cfg)
            users[folder] += 1
    assert sum(cost) == pytest.approx(sum(once.values()))
    order = longest_first(sweep, points, str(tmp_path))
    assert [cost[points.index(p)] for p in order] == sorted(cost, reverse=True)
    first_user: dict[str, int] = {}
    for rank, p in enumerate(order):
        for cfg in stage_configs(sweep.spec, p, str(tmp_path)):
            first_user.setdefault(stage_dir(str(tmp_path), cfg), rank)
    shared = [f for f, n in users.items() if n > 1]
    assert len(shared) == 4  # each seed's pre-training and Stage-1
    assert all(first_user[f] < len(points) // 2 for f in shared)  # their owners in the first half


@pytest.mark.slow
def test_paper_mini_at_toy_size(tmp_path):
    """The whole command on tiny settings: the three sweeps, the speed step, the verdicts and
    the report; then the same command trains nothing, and one more seed trains only it."""
    toy = [
        "--set",
        "train.steps=6",
        "--set",
        "train.seq_len=32",
        "--set",
        "model.d_model=32",
        "--stage-steps",
        "stage1=3,chase=3,stage2=3,stage1_more=3,pretrain_more=6",
        "--storage-path",
        str(tmp_path),
    ]

    def run(seeds: str) -> str:
        done = subprocess.run(
            [sys.executable, "sweeps/paper_mini.py", *toy, "--seeds", seeds],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    out = run("0,1")
    assert "this run is EXPLORATORY" not in out  # the reasons go to stderr, the verdicts say it too
    for claim in (
        "C1",
        "C1-mano",
        "C1-LM",
        "C1-depth",
        "C2",
        "C2-own",
        "C3",
        "C3-few",
        "C4",
        "C4-batch1",
        "C4-padded",
        "C4-growth",
    ):
        assert f"| **{claim}**" in out
    folder = tmp_path / "analysis" / "paper_mini"
    for name in (
        "verdicts.md",
        "verdicts.csv",
        "report.html",
        "lm_trials.csv",
        "phop_trials.csv",
        "mano_trials.csv",
        "speed.csv",
        "speed_records.csv",
        "loops.csv",
    ):
        assert (folder / name).is_file(), name
    assert "Claims: the paper" in (folder / "report.html").read_text()
    stages = set((tmp_path / "stages").iterdir())
    run("0,1")
    assert set((tmp_path / "stages").iterdir()) == stages  # a re-run trains nothing
    run("0,1,2")
    new = set((tmp_path / "stages").iterdir()) - stages
    # seed 2 alone: LM pre-trainings 1⊗4, 1⊗1, 4⊗1, Stage-1, CHASE, Stage-1 continued, three
    # Stage-2, pre-training continued; p-hop's two (1⊗2, 1⊗1) and Mano's two (1⊗2, 1⊗1)
    assert len(new) == 10 + 2 + 2
    # The ledger: other seeds and --set make an exploratory run, and its verdicts say why;
    # the digest is the modified protocol's, not the declared one.
    verdicts = (folder / "verdicts.md").read_text()
    assert "**EXPLORATORY" in verdicts and "--set/--stage-set make another protocol" in verdicts
    assert "| 0 | `" in verdicts and "| 2 | `" in verdicts
    assert paper_mini.PROTOCOL.digest() not in verdicts.split("\n")[0] and "modified by --set/--stage-set" in verdicts
    assert "Holm-compatible" in verdicts and "unmatched arm" in verdicts
    assert "descriptive (not judged here)" in verdicts  # C4-batch1 and C4-growth on a CPU
    ledger = (tmp_path / "protocol_ledger.jsonl").read_text()
    assert '"event": "started"' in ledger and '"exploratory": true' in ledger
