"""Evaluation of a looped model on a task's fixed evaluation set under exit policies
(looplab/policy.py): full depth, forced depths, dense and skip at thresholds q, and
the zoo's zero-shot rules (entropy, KL, stable argmax) in dense and skip execution.

Every record has the same fields: policy (its spec, e.g. "skip:0.4"), accuracy (exact
match at the target positions), loss and ppl (mean CE there), mean_exit_step (at the
target positions), executed_loops (mean over all tokens of the loops each ran) and
backbone_flops_per_token (the backbone work actually run), n (target positions).
"""

from __future__ import annotations

import math

import torch

from looplab.devices import autocast_context
from looplab.models.head import head_token_losses, token_losses
from looplab.policy import DENSE, EXIT_RULES, GATE, SKIP, ZOO_RULES, ExitPolicy, exit_rule
from looplab.tasks.base import IGNORE_INDEX, Batch
from looplab.tracking import ACCURACY, BACKBONE_FLOPS, EXECUTED_LOOPS, LOSS, MEAN_EXIT_STEP, PPL


def _record(
    policy: ExitPolicy, correct: int, loss_sum: float, exit_sum: float, loops: float, flops: float, total: int
) -> dict:
    if total == 0:
        raise ValueError("evaluation set has no target positions")
    loss = loss_sum / total
    return {
        "policy": policy.spec,
        ACCURACY: correct / total,
        LOSS: loss,
        PPL: math.exp(min(loss, 50.0)),
        MEAN_EXIT_STEP: exit_sum / total,
        EXECUTED_LOOPS: loops,
        BACKBONE_FLOPS: flops,
        "n": total,
    }


@torch.no_grad()
def evaluate_policy(
    model,
    batch: Batch,
    policy: ExitPolicy,
    *,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    precision: str = "auto",
) -> dict:
    """The record of one policy, from its own forward pass over the evaluation set."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = exit_sum = 0.0
    loops_sum = flops = tokens = 0
    for start in range(0, len(batch), batch_size):
        part = batch.slice(start, start + batch_size).to(device)
        with autocast_context(device, precision):
            out = model(part.ids, policy, readout="none")
            # The chunked head (models/head.py): CE and correctness without (B, L, V) logits.
            losses, right = head_token_losses(model, out.hidden, part.targets, correct=True)
        mask = part.targets != IGNORE_INDEX
        correct, total = correct + int(right[mask].sum()), total + int(mask.sum())
        loss_sum += float(losses.float().sum())
        exit_sum += float(out.exit_step[mask].float().sum())
        loops_sum += out.executed_loops * part.ids.numel()
        flops += out.backbone_flops
        tokens += part.ids.numel()
    model.train(was_training)
    return _record(policy, correct, loss_sum, exit_sum, loops_sum / tokens, flops / tokens, total)


def evaluate_policies(model, batch: Batch, policies, **kw) -> list[dict]:
    """One record per policy, in the order given. Full depth, forced depths and dense
    execution (gate or zoo rule) run every token through the same steps and only read
    out different ones, so they all come from one dense pass (evaluate_readouts); each
    skip policy changes the states themselves and runs its own pass."""
    policies = list(policies)
    readable = [p for p in policies if p.execution != SKIP]
    shared = dict(zip(readable, evaluate_readouts(model, batch, readable, **kw))) if readable else {}
    return [shared[p] if p in shared else evaluate_policy(model, batch, p, **kw) for p in policies]


@torch.no_grad()
def evaluate_readouts(
    model, batch: Batch, policies, *, batch_size: int = 64, device: torch.device | str = "cpu", precision: str = "auto"
) -> list[dict]:
    """The records of full, forced and dense policies (the gate's threshold rule or a
    zoo rule) from one dense pass that keeps every step: per step, each target's CE
    and correctness; a policy then picks one step per token. The LM head runs only on
    the steps some policy reads (all of them for a dense policy; step R alone for full
    depth). Dense zoo rules decide from those same per-step logits: each rule's
    statistic is computed once per step and compared with every threshold of the
    grid (looplab/policy.py), so a dense zoo record equals its own dense run."""
    device = torch.device(device)
    policies = list(policies)
    _check_readout_policies(model, policies)
    was_training = model.training
    model.eval()
    R = model.cfg.n_loops
    read = sorted({r for p in policies for r in (range(1, R + 1) if p.execution == DENSE else [p.loops_run(R)])})
    dense = [p for p in policies if p.execution == DENSE]
    zoo_rules = sorted({p.rule for p in dense if p.rule in ZOO_RULES})
    sums = {p: {"correct": 0, "loss": 0.0, "exit": 0.0} for p in policies}
    total = 0
    for start in range(0, len(batch), batch_size):
        part = batch.slice(start, start + batch_size).to(device)
        mask = part.targets != IGNORE_INDEX
        with autocast_context(device, precision):
            loss_at, correct_at, exit_steps = _read_steps(model, part, read, dense, zoo_rules)
        for policy in policies:
            _add_policy_sums(sums[policy], policy, loss_at, correct_at, exit_steps, part.ids, mask, R)
        total += int(mask.sum())
    model.train(was_training)
    # Every token of these policies runs the same loops (dense all R: its exit only
    # picks the readout; forced d its d); every sequence has the same length. A zoo
    # rule's LM-head and statistic work is its own price, not backbone FLOPs.
    step_flops = model.step_flops(batch.ids.shape[1])
    records = []
    for policy, acc in sums.items():
        loops = policy.loops_run(R)
        records.append(
            _record(
                policy, int(acc["correct"]), acc["loss"], acc["exit"], float(loops), float(loops * step_flops), total
            )
        )
    return records


def _check_readout_policies(model, policies: list[ExitPolicy]) -> None:
    """Full, forced and dense policies with a rule, within the model's loops: what one dense pass reads."""
    for p in policies:
        if p.execution == SKIP or (p.execution == DENSE and p.rule not in EXIT_RULES):
            raise ValueError(
                f"evaluate_readouts reads full, forced and dense policies with a rule (dense:Q, "
                f"dense-entropy:T, ...), not {p.spec}"
            )
        p.check(model.cfg.n_loops)


def _read_steps(model, part: Batch, read: list[int], dense: list[ExitPolicy], zoo_rules: list[str]):
    """One full-depth pass over a part of the batch, keeping every step: each read step's
    per-token CE and correctness, and each dense policy's exit steps (B, L)."""
    R = model.cfg.n_loops
    rules = {p: exit_rule(p) for p in dense}
    exit_steps = {p: torch.full_like(part.ids, R) for p in dense}
    states = dict.fromkeys(zoo_rules)  # each zoo statistic's state, shared by its thresholds
    # Full depth keeping every step's state and gate logits, no logits yet.
    out = model(part.ids, ExitPolicy.full(), all_steps=True, readout="none")
    loss_at, correct_at = {}, {}
    for r in read:  # one LM-head pass per step, reduced at once: no (R, B, L, V) buffer
        if not zoo_rules:  # nothing reads the distribution itself: the chunked head, no (B, L, V) logits
            loss_at[r], correct_at[r] = head_token_losses(model, out.step_hidden[r - 1], part.targets, correct=True)
            loss_at[r] = loss_at[r].float()
        else:
            logits = model.logits(out.step_hidden[r - 1])
            loss_at[r] = token_losses(logits, part.targets).float()
            correct_at[r] = logits.argmax(dim=-1) == part.targets
        if r == R:
            continue
        statistic = {}
        for rule in zoo_rules:
            statistic[rule], states[rule] = EXIT_RULES[rule].statistic(logits, states[rule])
        for policy, decider in rules.items():  # as execution's dense loop: a token's first exit stands
            reached = (
                decider.update(out.gate_logits[r - 1])
                if policy.rule == GATE
                else decider.decide(statistic[policy.rule])
            )
            exit_steps[policy] = torch.where(reached & (exit_steps[policy] == R), r, exit_steps[policy])
    return loss_at, correct_at, exit_steps


def _add_policy_sums(acc: dict, policy: ExitPolicy, loss_at, correct_at, exit_steps, ids, mask, R: int) -> None:
    """Add a part's CE, correct tokens and exit steps under `policy` (its step per token) to acc."""
    if policy.execution == DENSE:
        exit_step = exit_steps[policy]
        losses = torch.stack([loss_at[r] for r in range(1, R + 1)])
        corrects = torch.stack([correct_at[r] for r in range(1, R + 1)])
        pick = (exit_step - 1).unsqueeze(0)
        loss, correct = losses.gather(0, pick)[0], corrects.gather(0, pick)[0]
    else:
        d = policy.loops_run(R)
        assert d is not None  # full or forced (dense was above): every token runs d loops
        exit_step = torch.full_like(ids, d)
        loss, correct = loss_at[d], correct_at[d]
    acc["loss"] += float(loss[mask].sum())
    acc["correct"] += int(correct[mask].sum())
    acc["exit"] += float(exit_step[mask].float().sum())


def format_table(records: list[dict]) -> str:
    rows = ["policy       exit   loops  ppl        acc", "-" * 44]
    for r in records:
        rows.append(
            f"{r['policy']:11s}  {r[MEAN_EXIT_STEP]:5.2f}  {r[EXECUTED_LOOPS]:5.2f}  {r[PPL]:9.4f}  {r[ACCURACY]:.4f}"
        )
    return "\n".join(rows)
