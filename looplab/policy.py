"""Exit policies: how a looped model is run and read out.

One value type names every way of running an N⊗R model:

    full            every token runs all R loops, readout at R (the fixed-loop model)
    forced:d        every token runs exactly d loops, readout at d (App. F's ablation)
    dense:q         every token runs all R loops; the gate's threshold rule picks the
                    readout step z(q) (the Ouro gate: no compute is saved)
    skip:q          tokens leave at z(q) and skip the deeper loops for real (CHASE)
    dense / skip with given exit steps (CHASE's depth holes, oracle benchmarks)

A policy knows its spec (`skip:0.4`, parsed back by `ExitPolicy.parse`), its label
for people (`skip q=0.4`) and its metric prefix (`skip_q0.4_`); the tracking
contract (looplab/tracking.py) composes metric names from it and analysis parses
them back through `ExitPolicy.from_prefix`. Forward, evaluation, lm-eval and the
benchmarks take one policy instead of loose keywords.

The threshold rule is implemented once, here (`GateThreshold`): after each non-final
step r the gate gives λ^(r) = σ(a^(r)), the exit CDF grows as
F^(r) = F^(r-1) + S^(r-1) λ^(r) with survival S^(r) = S^(r-1)(1 − λ^(r)), and a
token's exit step is z(q) = min{r : F^(r) ≥ q}, or R if no step reaches q. Dense and
skip execution, the one-pass readout evaluation and the tests all use this class, so
they decide alike, bit for bit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from looplab.config import ConfigError

if TYPE_CHECKING:  # torch is imported where tensors are used: analysis reads policy names without it
    import torch

FULL, FORCED, DENSE, SKIP = "full", "forced", "dense", "skip"
DEFAULT_QS = (0.2, 0.4, 0.6, 0.8, 1.0)  # the paper's threshold grid (App. G)
EXECUTIONS = (FULL, FORCED, DENSE, SKIP)
GATE, GIVEN = "gate", "given"


def number_name(value: float) -> str:
    """0.4 -> '0.4', 1.0 -> '1.0', 0.25 -> '0.25': short, stable names."""
    text = f"{float(value):.4f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


@dataclass(frozen=True)
class ExitPolicy:
    """How to run and read out a looped model. Build one with the constructors
    (`full`, `forced`, `dense`, `skip`, `given`) or `parse("skip:0.4")`; a bad value
    raises ConfigError with one line naming it."""

    execution: str = FULL  # full | forced | dense | skip
    rule: str = ""  # dense / skip: gate (threshold q) | given (exit_at)
    q: float | None = None  # the gate's threshold (rule gate)
    depth: int | None = None  # forced: the loops every token runs
    # rule given: (B, L) exit steps in 1..R. Not part of the policy's identity
    # (a tensor has no stable name); policies with given exits are never logged.
    exit_at: Any = field(default=None, compare=False, repr=False)  # torch.Tensor

    def __post_init__(self) -> None:
        if self.execution not in EXECUTIONS:
            raise ConfigError(f"policy execution={self.execution!r} is invalid; allowed: {' | '.join(EXECUTIONS)}")
        if self.execution in (DENSE, SKIP):
            if self.rule == GATE:
                q = self.q
                if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q <= 1.0:
                    raise ConfigError(f"policy q={q!r} is invalid; allowed: a float in [0, 1]")
                object.__setattr__(self, "q", float(q))
            elif self.rule == GIVEN:
                if getattr(self.exit_at, "dim", lambda: 0)() != 2:
                    raise ConfigError("policy exit_at is invalid; allowed: a (B, L) tensor of exit steps in 1..R")
            else:
                raise ConfigError(f"policy rule={self.rule!r} is invalid; allowed: {GATE} | {GIVEN}")
        elif self.execution == FORCED:
            d = self.depth
            if isinstance(d, bool) or not isinstance(d, int) or d < 1:
                raise ConfigError(f"policy depth={d!r} is invalid; allowed: an integer >= 1")

    # ---- constructors -------------------------------------------------------------
    @classmethod
    def full(cls) -> "ExitPolicy":
        return cls(FULL)

    @classmethod
    def forced(cls, depth: int) -> "ExitPolicy":
        return cls(FORCED, depth=depth)

    @classmethod
    def dense(cls, q: float) -> "ExitPolicy":
        return cls(DENSE, GATE, q=q)

    @classmethod
    def skip(cls, q: float) -> "ExitPolicy":
        return cls(SKIP, GATE, q=q)

    @classmethod
    def given(cls, exit_at: torch.Tensor, execution: str = SKIP) -> "ExitPolicy":
        """Per-token exit steps instead of the gate's decisions (dense or skip)."""
        if execution not in (DENSE, SKIP):
            raise ConfigError(f"given exits need execution dense | skip, not {execution!r}")
        return cls(execution, GIVEN, exit_at=exit_at)

    # ---- names ----------------------------------------------------------------------
    @property
    def spec(self) -> str:
        """The parseable name: full, forced:2, dense:0.4, skip:0.4 (skip:given is not parseable)."""
        if self.execution == FULL:
            return FULL
        if self.execution == FORCED:
            return f"{FORCED}:{self.depth}"
        return f"{self.execution}:{GIVEN if self.rule == GIVEN else number_name(self.q)}"

    @property
    def label(self) -> str:
        """For people: 'full depth', 'forced d=2', 'skip q=0.4'."""
        if self.execution == FULL:
            return "full depth"
        if self.execution == FORCED:
            return f"forced d={self.depth}"
        return f"{self.execution} " + ("given exits" if self.rule == GIVEN else f"q={number_name(self.q)}")

    @property
    def metric_prefix(self) -> str:
        """What the policy's evaluation metrics start with: val_, forced_d2_, skip_q0.4_."""
        if self.execution == FULL:
            return "val_"
        if self.execution == FORCED:
            return f"forced_d{self.depth}_"
        if self.rule == GIVEN:
            raise ConfigError("a policy with given exit steps has no metric name (it is never logged)")
        return f"{self.execution}_q{number_name(self.q)}_"

    def __str__(self) -> str:
        return self.spec

    def __repr__(self) -> str:
        return f"ExitPolicy({self.spec})"

    # ---- parsing back -------------------------------------------------------------------
    @classmethod
    def parse(cls, spec: str) -> "ExitPolicy":
        """The inverse of `spec`: 'full' | 'forced:D' | 'dense:Q' | 'skip:Q'."""
        text = str(spec).strip()
        execution, _, value = text.partition(":")
        try:
            if execution == FULL and not value:
                return cls.full()
            if execution == FORCED and value:
                return cls.forced(int(value))
            if execution in (DENSE, SKIP) and value:
                return cls(execution, GATE, q=float(value))
        except ValueError:
            pass
        raise ConfigError(f"policy {text!r} is invalid; allowed: full | forced:D | dense:Q | skip:Q "
                          "(e.g. skip:0.4, forced:2)")

    @classmethod
    def from_prefix(cls, prefix: str) -> "ExitPolicy | None":
        """The policy whose metric_prefix this is, or None."""
        m = PREFIX_PATTERN.fullmatch(prefix)
        if m is None:
            return None
        if m["val"]:
            return cls.full()
        if m["depth"]:
            return cls.forced(int(m["depth"]))
        return cls(m["execution"], GATE, q=float(m["q"]))

    # ---- what running it costs -----------------------------------------------------------
    def loops_run(self, n_loops: int) -> int | None:
        """The loops every token runs, when the policy fixes it (full, forced, dense);
        None for skip, where the executed loops are measured."""
        if self.execution in (FULL, DENSE):
            return n_loops
        if self.execution == FORCED:
            return self.depth
        return None

    def check(self, n_loops: int, shape: tuple[int, ...] | None = None) -> None:
        """Checks that need the model: forced depth and given steps within 1..R."""
        if self.execution == FORCED and self.depth > n_loops:
            raise ConfigError(f"policy depth={self.depth} is invalid; allowed: an integer in [1, R={n_loops}]")
        if self.rule == GIVEN:
            at = self.exit_at
            if (shape is not None and tuple(at.shape) != tuple(shape)) or int(at.min()) < 1 or int(at.max()) > n_loops:
                raise ConfigError(f"policy exit_at must be (B, L) = {tuple(shape or at.shape)} with steps in "
                                  f"[1, R={n_loops}]")


# The metric prefixes, as one regular expression with named groups (analysis parses
# metric names with it, in polars too): val_ | forced_d<D>_ | <dense|skip>_q<Q>_.
PREFIX_PATTERN = re.compile(
    r"(?:(?P<val>val_)|forced_d(?P<depth>[0-9]+)_|(?P<execution>dense|skip)_q(?P<q>[0-9]+(?:\.[0-9]+)?)_)")


def parse_policies(text: str) -> list[ExitPolicy]:
    """A grid of policies: 'dense:0.2,0.4;skip:0.4;forced:1-4;full' — groups separated
    by ';', each an execution with comma-separated values (forced takes ranges D1-D2)."""
    policies: list[ExitPolicy] = []
    for group in (g.strip() for g in str(text).split(";")):
        if not group:
            continue
        execution, _, values = group.partition(":")
        if execution == FULL or not values:
            policies.append(ExitPolicy.parse(group))
            continue
        for value in (v.strip() for v in values.split(",") if v.strip()):
            lo, dash, hi = value.partition("-")
            if execution == FORCED and dash and lo.isdigit() and hi.isdigit():
                policies.extend(ExitPolicy.forced(d) for d in range(int(lo), int(hi) + 1))
            else:
                policies.append(ExitPolicy.parse(f"{execution}:{value}"))
    if not policies:
        raise ConfigError(f"policies {text!r} is invalid; allowed: e.g. dense:0.2,0.4;skip:0.4;forced:1-4")
    return list(dict.fromkeys(policies))  # in order, each once


class GateThreshold:
    """The threshold rule z(q), decided step by step (see the module docstring).

    update(gate_logit) after step r < R returns where F^(r) ≥ q; the caller records a
    token's first such step as its exit. The arithmetic is identical in every caller:
    float32 whatever the model's dtype."""

    def __init__(self, like: torch.Tensor, q: float):
        import torch

        self.q = q
        self.survival = torch.ones(like.shape, dtype=torch.float32, device=like.device)
        self.cdf = torch.zeros(like.shape, dtype=torch.float32, device=like.device)

    def update(self, gate_logit: torch.Tensor) -> torch.Tensor:
        import torch

        lam = torch.sigmoid(gate_logit.detach().float())
        self.cdf = self.cdf + self.survival * lam
        self.survival = self.survival * (1 - lam)
        return self.cdf >= self.q


def threshold_exit_steps(gate_logits: torch.Tensor, q: float) -> torch.Tensor:
    """Each token's exit step z(q) in 1..R from its gate logits (R-1, B, L), by the
    same rule dense and skip execution apply step by step."""
    import torch

    n_loops = gate_logits.shape[0] + 1
    rule = GateThreshold(gate_logits[0], q)
    exit_step = torch.full(gate_logits.shape[1:], n_loops, dtype=torch.long, device=gate_logits.device)
    for r in range(1, n_loops):
        exit_step = torch.where(rule.update(gate_logits[r - 1]) & (exit_step == n_loops), r, exit_step)
    return exit_step
