"""The training step's backbone under torch.compile (train.compile): one home for
whether a run compiles and how.

What compiles is one application of the shared backbone M_θ with gradients on (the R
loops of a training forward all call it), not the whole loss: the loss's Python
(exit policies, sampled holes, the chunked head) would break the graph at every
data-dependent branch, and the backbone is where the elementwise work that Inductor
fuses lives (the SSD's decay masks, the conv, SiLU, the norms). Evaluation, decoding
and anything under torch.no_grad run the eager backbone: their shapes vary from call to
call (policies, batch tails, caches) and each new shape would cost a compilation.

Shapes: each new input shape costs a compilation (10-30 s on a 2-core CPU; a dynamic-
shape graph of the hybrid backbone took 110 s there), so the compiled function serves
the first shapes a run meets, at most MAX_SHAPES of them (the dense batch, a last
micro-batch), compiled static; any other shape (skip's packed survivors, CHASE's
holes, whose lengths change from step to step) runs the eager backbone. Same losses as
eager to float rounding (tests/test_compile.py); a run's key does not depend on it (a
cadence-like setting).
"""

from __future__ import annotations

import torch

from looplab.config import COMPILE_CHOICES, ConfigError

AUTO, ON, OFF = "auto", "on", "off"


def compiles(setting: str, device: torch.device) -> bool:
    """Whether a run with train.compile=`setting` compiles its backbone on `device`.
    auto: on CUDA only. On a 2-core CPU compiling `debug`'s backbone took 48 s cold (6 s
    from Inductor's on-disk cache) for a step 0.77x eager's with 1 thread and 0.93x with
    2, which a preset's few hundred steps do not pay back (docs/benchmarks.md)."""
    if setting == AUTO:
        return device.type == "cuda"
    if setting in (ON, OFF):
        return setting == ON
    raise ConfigError(f"TrainConfig.compile={setting!r} is invalid; allowed: {' | '.join(COMPILE_CHOICES)}")


MAX_SHAPES = 2  # static compilations per run: the dense batch and a last micro-batch


class CompiledBackbone:
    """One application of the backbone, compiled for the first MAX_SHAPES input
    signatures it meets and eager for any other (see the module's docstring)."""

    def __init__(self, backbone: torch.nn.Module):
        self.backbone = backbone
        self.compiled = torch.compile(backbone.forward, dynamic=False)
        self.shapes: set[tuple] = set()

    def __call__(self, h, positions=None, seq_idx=None, cache=None):
        signature = (tuple(h.shape), h.dtype, positions is None, seq_idx is None)
        if signature not in self.shapes and len(self.shapes) < MAX_SHAPES:
            self.shapes.add(signature)
        fn = self.compiled if signature in self.shapes else self.backbone
        return fn(h, positions, seq_idx, cache)


def compile_backbone(model) -> None:
    """Give `model` (a LoopedLM) a compiled training backbone: LoopedLM.step calls it
    with gradients on and no cache. The eager module keeps its parameters (the compiled
    function reads the same ones), so state_dict keys and checkpoints do not change."""
    model.compiled_backbone = CompiledBackbone(model.backbone)
