"""The memory model (looplab/costs/memory.py) and the resource plan (looplab/costs/resources.py,
the sweeps' dry run): per-block counts against the tensors autograd really keeps, the
whole step against the peak measured on this CPU, and the plan's choices."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import looplab.training.objectives  # noqa: F401 - the stages' losses register themselves (minibatch_loss below)
from looplab.checkpoint import model_from_config, parent_ref
from looplab.config import ConfigError, ModelConfig
from looplab.costs.memory import FP32, GiB, loop_activations, mamba2_block, readout_activations, step_memory
from looplab.costs.resources import flops_per_token, plan_stage
from looplab.models.layers import make_layer
from looplab.presets import get_preset, stage_config
from looplab.stages import get_stage
from looplab.tasks.base import Batch

ROOT = Path(__file__).resolve().parents[1]


def saved_bytes(module_params, fn) -> int:
    """Bytes of the distinct storages autograd saves for backward during fn(),
    parameters excluded (views of one storage count once)."""
    params = {p.untyped_storage().data_ptr() for p in module_params}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


MAMBA_SHAPES = [  # L a multiple of the chunk and not; one and two groups; d_state ≠ headdim
    dict(d_model=32, expand=2, d_state=4, headdim=16, chunk_size=8, ngroups=1),
    dict(d_model=48, expand=2, d_state=8, headdim=8, chunk_size=16, ngroups=2),
    dict(d_model=64, expand=1, d_state=16, headdim=16, chunk_size=32, ngroups=1),
]


@pytest.mark.parametrize("shape", range(len(MAMBA_SHAPES)))
@pytest.mark.parametrize("batch,seq_len", [(3, 48), (2, 37)])
def test_mamba2_block_count_is_what_autograd_saves(shape, batch, seq_len):
    cfg = ModelConfig(vocab_size=64, n_layers=1, n_loops=1, arch="mamba2", **MAMBA_SHAPES[shape])
    layer = make_layer(cfg, "mamba2", 0)
    x = torch.randn(batch, seq_len, cfg.d_model, requires_grad=True)
    counted = saved_bytes(layer.parameters(), lambda: layer[0](x))
    assert mamba2_block(cfg, seq_len, "torch", FP32) * batch * seq_len == pytest.approx(counted, rel=0.01)


@pytest.mark.parametrize("arch", ["transformer", "hybrid"])
def test_attention_and_mlp_counts_are_what_autograd_saves(arch):
    extra = {"attn_layer_idx": (1,)} if arch == "hybrid" else {"d_intermediate": 80}
    cfg = ModelConfig(
        vocab_size=64,
        d_model=48,
        n_layers=2,
        n_loops=1,
        arch=arch,
        attn_head_dim=16,
        rope_dim=8,
        d_state=8,
        headdim=8,
        chunk_size=16,
        **extra,
    )
    layers = [make_layer(cfg, kind, i) for i, kind in enumerate(cfg.layer_kinds())]
    x = torch.randn(3, 40, cfg.d_model, requires_grad=True)

    def run():
        h = x
        for layer in layers:
            for block in layer:
                h = block(h)

    counted = saved_bytes([p for layer in layers for p in layer.parameters()], run)
    assert loop_activations(cfg, 40, "torch", FP32) * 3 * 40 == pytest.approx(counted, rel=0.01)


@pytest.mark.parametrize("stage", ["pretrain", "stage1"])
def test_a_training_forward_saves_R_loops_and_the_readout(stage):
    """The whole model: R loops of blocks, the readout's per-token share and the
    weighted head's LM-head gradient (a fixed size), against one real forward."""
    cfg = stage_config(
        get_preset("debug"),
        stage,
        parent=parent_ref("/x") if get_stage(stage).continues else None,
        overrides={"train.seq_len": 64},
    )
    model = model_from_config(cfg.model, 0)
    ids = torch.randint(0, cfg.model.vocab_size, (3, 64))
    batch = Batch(ids, torch.roll(ids, -1, 1))
    counted = saved_bytes(model.parameters(), lambda: get_stage(stage).minibatch_loss(model, batch, cfg, 0))
    c = cfg.model
    per_token = c.n_loops * loop_activations(c, 64, "torch", FP32) + readout_activations(c, get_stage(stage))
    expected = 3 * 64 * per_token + FP32 * c.vocab_size * c.d_model
    assert expected == pytest.approx(counted, rel=0.02)


@pytest.mark.slow  # 90 s of measured steps on 2 cores: .ci/run runs it after the suite
def test_the_model_is_within_a_quarter_of_the_measured_peak():
    """benchmarks/train_memory.py (memory measured in a child process whose resident
    set follows live tensors: looplab/costs/measured_memory.py): one
    optimizer step per point of the `local` preset (vocab 32,000) at small sizes,
    whole-batch and micro-batched, with and without activation checkpointing."""
    points = "pretrain:0:0,pretrain:0:1,stage1:2:0,stage1:0:1,stage2:0:0"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "train_memory.py"),
            "--batch",
            "4",
            "--seq-len",
            "512",
            "--points",
            points,
            "--threads",
            "1",
            "--repeats",
            "0",
            "--json",
            "/dev/stdout",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout[out.stdout.index("{") :])["rows"]
    assert len(rows) == 5
    for row in rows:
        assert row["measured"] > 50 * 2**20, row  # large enough that allocator noise is small
        assert 0.75 <= row["model"] / row["measured"] <= 1.25, row
    plain, ckpt = rows[0], rows[1]
    assert ckpt["measured"] < 0.5 * plain["measured"]  # checkpointing keeps one loop, not R


def test_micro_batches_and_checkpointing_shrink_the_estimate():
    cfg = stage_config(
        get_preset("local"), "stage1", parent=parent_ref("/x"), overrides={"train.batch_size": 16, "train.seq_len": 512}
    )
    whole, quarter = step_memory(cfg, 16, path="torch"), step_memory(cfg, 4, path="torch")
    assert quarter.activations * 4 == whole.activations and quarter.peak < whole.peak
    ckpt = step_memory(cfg, 16, path="torch", checkpointing=True)
    assert ckpt.activations < whole.activations / cfg.model.n_loops and ckpt.recompute > 0
    # Stage-2 keeps no graph through the backbone: no backbone gradients or moments
    frozen = step_memory(stage_config(get_preset("local"), "stage2", parent=parent_ref("/x")), 8, path="torch")
    assert frozen.gradients == FP32 * (cfg.model.d_model + 1) and frozen.activations < whole.activations


# ---- the plan ------------------------------------------------------------------------------


def paper(stage="pretrain", preset="paper-140m"):
    return stage_config(get_preset(preset), stage, parent=parent_ref("/x") if get_stage(stage).continues else None)


def test_the_paper_plan_fits_80_gib_with_the_largest_micro_batch():
    for stage in ("pretrain", "stage1", "stage2"):
        cfg = paper(stage)
        plan = plan_stage(cfg, ranks=8, device_memory_gib=80)
        rows = cfg.train.batch_size // 8
        assert plan.memory.peak <= 80 * 2**30 and rows % plan.micro_batch == 0
        assert plan.micro_batch * plan.accumulation * plan.ranks == cfg.train.batch_size
        bigger = [m for m in range(plan.micro_batch + 1, rows + 1) if rows % m == 0]
        if bigger:  # the next divisor up would not fit (without checkpointing, which is the first choice)
            assert step_memory(cfg, bigger[0], ranks=8, checkpointing=plan.checkpointing).peak > 80 * 2**30
        assert not plan.checkpointing  # it fits without


@pytest.mark.slow  # 11 s on 2 cores
def test_a_plan_that_cannot_fit_is_one_line_naming_the_flag():
    with pytest.raises(ConfigError, match=r"--gpu-memory=2 is invalid for pretrain: one row of 2048 tokens") as e:
        plan_stage(paper(), ranks=8, device_memory_gib=2)
    assert "\n" not in str(e.value)
    tight = plan_stage(paper(), ranks=8, device_memory_gib=12)  # only with checkpointing
    assert tight.checkpointing and tight.memory.peak <= 12 * 2**30


def test_stage_flops_follow_what_each_stage_runs():
    pre, s1, s2 = (flops_per_token(paper(s)) for s in ("pretrain", "stage1", "stage2"))
    assert s1 > pre > s2  # Stage-1 reads R heads; Stage-2 only runs forward
    assert flops_per_token(paper("stage1"), checkpointing=True) > s1
    # paper-140m pre-training: 75,000 × 1024 × 2048 tokens; 308 GPU-hours at 40 % of 989 TFLOP/s
    plan = plan_stage(paper(), ranks=8)
    assert plan.flops == pytest.approx(pre * 75_000 * 1024 * 2048)
    assert plan.gpu_hours(0.4, 989.0) == pytest.approx(plan.flops / (0.4 * 989e12) / 3600)


def test_a_plan_leaves_its_margin_free():
    """Issue: paper-140m-hybrid's Stage-1 planned a 76.1 GiB peak on an 80 GiB device, with
    nothing left for the CUDA context, NCCL and fragmentation. With the margin (4 GiB by
    default) the plan picks the micro-batch whose peak fits the rest."""
    from looplab.config import ParentRef
    from looplab.costs.resources import DEFAULT_MEMORY_MARGIN_GIB
    from looplab.presets import get_preset, stage_config

    stage1 = stage_config(get_preset("paper-140m-hybrid"), "stage1", parent=ParentRef("pretrain", "k", "g"))
    tight = plan_stage(stage1, ranks=8, device_memory_gib=80, margin_gib=0)
    assert tight.memory.peak > (80 - DEFAULT_MEMORY_MARGIN_GIB) * GiB  # what the plan did before
    planned = plan_stage(stage1, ranks=8, device_memory_gib=80)
    assert planned.memory.peak <= (80 - DEFAULT_MEMORY_MARGIN_GIB) * GiB and planned.micro_batch < tight.micro_batch
    with pytest.raises(ConfigError, match="with a margin of 10 GiB beside it"):
        plan_stage(paper(), ranks=8, device_memory_gib=12, margin_gib=10)


def test_a_phop_row_is_one_sample_whatever_train_seq_len_says():
    """p-hop trains on whole samples of n + 4 tokens (train_batch ignores train.seq_len):
    the plan counts those tokens, and its FLOPs and memory do not move with seq_len."""
    plans = [
        plan_stage(
            stage_config(get_preset("phop-debug"), "pretrain", overrides={"task.n": 16, "train.seq_len": seq_len}),
            path="torch",
        )
        for seq_len in (128, 512)
    ]
    t = plans[0].cfg.train
    assert plans[0].tokens == t.steps * t.batch_size * (16 + 4)
    assert plans[0].flops == plans[1].flops and plans[0].memory.peak == plans[1].memory.peak
    assert f"× {t.batch_size} × 20 tokens" in plans[0].line()


@pytest.mark.parametrize(
    "preset, arch", [("debug", "mamba2"), ("phop-induction-debug", "transformer"), ("debug", "hybrid")]
)
def test_the_decoding_cache_is_what_the_cache_allocates(preset, arch):
    """decode_cache_bytes (the machine's check of generate and bench --decode) against a
    real InferenceCache's tensors; attention's grow with the positions, Mamba-2's do not."""
    from looplab.costs.memory import decode_cache_bytes
    from looplab.models.cache import InferenceCache

    overrides = {"arch": arch, **({"attn_layer_idx": (0,)} if arch == "hybrid" else {})}
    cfg = ModelConfig(**{**get_preset(preset).model.__dict__, **overrides})
    model = model_from_config(cfg)
    for rows, capacity in ((1, 8), (3, 40)):
        cache = InferenceCache(model, rows, capacity)
        real = sum(t.numel() * t.element_size() for s in cache.storage if s is not None for t in vars(s).values())
        assert decode_cache_bytes(cfg, rows, capacity) == real
    grows = decode_cache_bytes(cfg, 1, 1000) > decode_cache_bytes(cfg, 1, 10)
    assert grows == (arch != "mamba2")
