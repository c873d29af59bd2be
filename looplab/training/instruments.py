"""Per-loop instruments: what each application of the shared backbone does.

A looped model applies one block R times; its stability (the residual stream's scale,
where the gradient comes from) and its cache holes (what skipping does to the tokens
that keep running) are read per loop r = 1..R. Every stage logs them at each
evaluation, on a fixed diagnostic batch (the first DIAGNOSTIC_ROWS rows of the
evaluation set), as the metrics named by looplab/tracking/names.py's loop_metric
(loop2_hidden_norm, skip_q0.4_loop2_state_gap):

  hidden_norm  RMS of h^(r) over the real tokens, at full depth.
  grad_norm    the norm of the gradient of the stage's training loss that reaches the
               shared block's parameters from application r. The block's gradient is
               the sum over its R applications; each application runs on its own copy
               of the parameters, so one backward pass yields every term, and the terms
               add up to the ordinary gradient. Stages that train the backbone only.
  active       (skip at each q of train.eval_qs, gated stages) the fraction of tokens that run loop r.
  state_gap    (skip at q, gated stages) ‖h_skip^(r) − h_dense^(r)‖ / ‖h_dense^(r)‖ over
               the tokens that run loop r under skip: how far the holes the exited tokens
               leave (absent from every deeper conv window, scan and attention) move the
               states of the tokens that keep running. 0 at loop 1, where nobody has left.

The per-loop cross-entropy is the forced-depth evaluation (forced_d<r>_loss, and val_loss
at r = R), which every stage runs on the whole evaluation set: it is not repeated here.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch

from looplab.devices import autocast_context
from looplab.policy import ExitPolicy
from looplab.tasks.base import Batch
from looplab.tracking import ACTIVE, GRAD_NORM, HIDDEN_NORM, STATE_GAP, loop_metric

DIAGNOSTIC_ROWS = 8


def diagnostic_batch(eval_set: Batch) -> Batch:
    """The rows every instrument reads: the evaluation set's first DIAGNOSTIC_ROWS."""
    return eval_set.slice(0, min(DIAGNOSTIC_ROWS, len(eval_set)))


@contextlib.contextmanager
def per_application_parameters(model) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Inside the block, every model.step call (one application of the backbone) runs on
    fresh leaf copies of the backbone's parameters, appended to the yielded list in call
    order; after a backward pass, copies[r - 1][name].grad is application r's term of the
    parameter's gradient."""
    params = dict(model.backbone.named_parameters())
    copies: list[dict[str, torch.Tensor]] = []

    def step(h, positions=None, seq_idx=None, cache=None):
        mine = {name: p.detach().clone().requires_grad_(True) for name, p in params.items()}
        copies.append(mine)
        return torch.func.functional_call(model.backbone, mine, (h, positions, seq_idx, cache))

    model.step = step  # an instance attribute shadows the method until deleted
    try:
        yield copies
    finally:
        del model.step


def loop_gradient_norms(model, stage, batch: Batch, cfg, step: int) -> list[float]:
    """Per application r of the backbone, the norm of its term of the gradient of the
    stage's training loss on `batch` (see the module docstring). Empty for stages that
    do not train the backbone (Stage-2)."""
    if stage.trains != "all":
        return []
    was_training = model.training
    model.train()
    with torch.enable_grad(), per_application_parameters(model) as copies:
        loss, _ = stage.minibatch_loss(model, batch, cfg, step)
        grads = torch.autograd.grad(loss, [p for c in copies for p in c.values()], allow_unused=True)
    model.train(was_training)
    norms, i = [], 0
    for c in copies:
        part = grads[i : i + len(c)]
        i += len(c)
        norms.append(math.sqrt(sum(float(g.float().pow(2).sum()) for g in part if g is not None)))
    return norms


@torch.no_grad()
def hidden_norms(model, ids: torch.Tensor) -> list[float]:
    """RMS of h^(r) per loop at full depth: (1/√d)·‖h‖ averaged over tokens."""
    out = model(ids, ExitPolicy.full(), all_steps=True, readout="none")
    return [float(h.float().pow(2).mean(-1).sqrt().mean()) for h in out.step_hidden]


@torch.no_grad()
def skip_profile(model, ids: torch.Tensor, policy: ExitPolicy) -> tuple[list[float], list[float]]:
    """Per loop r under the skip policy: the fraction of tokens that run it, and the
    relative distance of their states from the dense run's (module docstring)."""
    dense = model(ids, ExitPolicy.full(), all_steps=True, readout="none").step_hidden
    out = model(ids, policy, all_steps=True, readout="none")
    active, gap = [], []
    for r, (h_skip, h_dense) in enumerate(zip(out.step_hidden, dense), start=1):
        ran = out.exit_step >= r
        active.append(float(ran.float().mean()))
        if not bool(ran.any()):
            gap.append(0.0)
            continue
        diff = (h_skip - h_dense).float()[ran]
        gap.append(float(diff.norm() / h_dense.float()[ran].norm().clamp(min=1e-12)))
    return active, gap


def loop_instruments(model, stage, batch: Batch, cfg, step: int, device) -> dict[str, float]:
    """Every instrument of the module docstring for this stage, as metric name → value
    (looplab/tracking/names.py's loop_metric names)."""
    batch = batch.to(device)
    out: dict[str, float] = {}
    with autocast_context(torch.device(device), cfg.train.precision):
        for r, v in enumerate(hidden_norms(model, batch.ids), start=1):
            out[loop_metric(HIDDEN_NORM, r)] = v
        for r, v in enumerate(loop_gradient_norms(model, stage, batch, cfg, step), start=1):
            out[loop_metric(GRAD_NORM, r)] = v
        if stage.gated:
            for q in cfg.train.eval_qs:
                policy = ExitPolicy.skip(q)
                active, gap = skip_profile(model, batch.ids, policy)
                for r, (a, g) in enumerate(zip(active, gap), start=1):
                    out[loop_metric(ACTIVE, r, policy)] = a
                    out[loop_metric(STATE_GAP, r, policy)] = g
    return out
