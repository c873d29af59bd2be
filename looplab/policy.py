"""Exit policies: how a looped model is run and read out.

One value type names every way of running an N⊗R model:

    full            every token runs all R loops, readout at R (the fixed-loop model)
    forced:d        every token runs exactly d loops, readout at d (App. E's ablation)
    dense:q         every token runs all R loops; the gate's threshold rule picks the
                    readout step z(q) (the Ouro gate: no compute is saved)
    skip:q          tokens leave at z(q) and skip the deeper loops for real (CHASE)
    dense / skip with given exit steps (CHASE's depth holes, oracle benchmarks)
    dense-RULE:t    the exit-policy zoo: zero-shot rules that need no trained gate and
    skip-RULE:t     read each step's next-token distribution p^(r) = softmax(head(h^(r)))
                    entropy:τ  exit after step r < R when H(p^(r)) < τ (nats)
                    kl:τ       when KL(p^(r) ‖ p^(r-1)) < τ (nats; Huginn's criterion)
                    stable:k   when argmax p^(r) has been the same for k steps

A policy knows its spec (`skip:0.4`, `skip-entropy:2.5`, parsed back by
`ExitPolicy.parse`), its label for people (`skip q=0.4`, `skip entropy<2.5`) and its
metric prefix (`skip_q0.4_`, `skip_entropy2.5_`); the tracking
contract (looplab/tracking/) composes metric names from it and analysis parses
them back through `ExitPolicy.from_prefix`. Forward, evaluation, lm-eval and the
benchmarks take one policy instead of loose keywords.

The threshold rule is implemented once, here (`GateThreshold`): after each non-final
step r the gate gives λ^(r) = σ(a^(r)), the exit CDF grows as
F^(r) = F^(r-1) + S^(r-1) λ^(r) with survival S^(r) = S^(r-1)(1 − λ^(r)), and a
token's exit step is z(q) = min{r : F^(r) ≥ q}, or R if no step reaches q. Dense and
skip execution, the one-pass readout evaluation and the tests all use this class, so
they decide alike, bit for bit. The zoo's rules are implemented once each, here too
(`EntropyBelow`, `KLBelow`, `StableArgmax`), with the conventions they document
(strict inequalities; KL never exits at step 1; stable counts steps r-k+1..r).
Every rule exits at step r < R only: a token no rule sends out leaves at R.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from looplab.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where tensors are used: analysis reads policy names without it
    import torch

FULL, FORCED, DENSE, SKIP = "full", "forced", "dense", "skip"
DEFAULT_QS = (0.2, 0.4, 0.6, 0.8, 1.0)  # the paper's threshold grid (App. F)
EXECUTIONS = (FULL, FORCED, DENSE, SKIP)
GATE, GIVEN = "gate", "given"
# The zoo: zero-shot rules on each step's next-token distribution (see the module docstring).
ENTROPY, KL, STABLE = "entropy", "kl", "stable"
ZOO_RULES = (ENTROPY, KL, STABLE)


def zoo_kind(execution: str, rule: str) -> str:
    """A zoo policy's kind, its spec without the value: skip-entropy, dense-kl, ..."""
    return f"{execution}-{rule}"


ZOO_KINDS = tuple(zoo_kind(e, r) for r in ZOO_RULES for e in (DENSE, SKIP))
# Default threshold grids a sweep can evaluate: entropy and KL in nats (loosest last:
# larger τ exits earlier), stable's window k in steps (smaller k exits earlier).
ZOO_GRIDS = {
    ENTROPY: (0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0),
    KL: (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1),
    STABLE: (4, 3, 2),
}
# How a zoo policy's label reads, after its execution: skip entropy<2.5, dense KL<0.01,
# skip stable k=2 (ExitPolicy.label; analysis reads the label, never these templates).
ZOO_LABELS = {ENTROPY: "entropy<{}", KL: "KL<{}", STABLE: "stable k={}"}


def number_name(value: float) -> str:
    """0.4 -> '0.4', 1.0 -> '1.0', 0.25 -> '0.25': short, stable names."""
    text = f"{float(value):.4f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _zoo_value(rule: str, value):
    """A zoo rule's threshold, checked: stable's window k an integer >= 2 (k = 1 would
    send every token out at step 1); entropy's and KL's τ a number >= 0 that its
    name keeps (at most 4 decimals), so spec and metric name parse back to it."""
    if rule == STABLE:
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise ConfigError(f"policy stable k={value!r} is invalid; allowed: an integer >= 2")
        return value
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or float(number_name(value)) != float(value)
    ):
        raise ConfigError(
            f"policy {rule} threshold={value!r} is invalid; allowed: a number >= 0 (nats) with at most 4 decimals"
        )
    return float(value)


def _value_name(rule: str, value) -> str:
    return str(value) if rule == STABLE else number_name(value)


@dataclass(frozen=True)
class ExitPolicy:
    """How to run and read out a looped model. Build one with the constructors
    (`full`, `forced`, `dense`, `skip`, `given`) or `parse("skip:0.4")`; a bad value
    raises ConfigError with one line naming it."""

    execution: str = FULL  # full | forced | dense | skip
    rule: str = ""  # dense / skip: gate (threshold q) | given (exit_at) | entropy | kl | stable (threshold)
    q: float | None = None  # the gate's threshold (rule gate)
    depth: int | None = None  # forced: the loops every token runs
    threshold: float | int | None = None  # zoo rules: entropy's / KL's τ in nats, stable's window k
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
            elif self.rule in ZOO_RULES:
                object.__setattr__(self, "threshold", _zoo_value(self.rule, self.threshold))
            else:
                raise ConfigError(
                    f"policy rule={self.rule!r} is invalid; allowed: {' | '.join((GATE, GIVEN, *ZOO_RULES))}"
                )
        elif self.execution == FORCED:
            d = self.depth
            if isinstance(d, bool) or not isinstance(d, int) or d < 1:
                raise ConfigError(f"policy depth={d!r} is invalid; allowed: an integer >= 1")
        # One value field per rule, so that equal policies compare (and hash) equal.
        if self.q is not None and self.rule != GATE:
            raise ConfigError(f"policy q={self.q!r} is invalid for rule {self.rule!r}; allowed: q with rule {GATE}")
        if self.threshold is not None and self.rule not in ZOO_RULES:
            raise ConfigError(
                f"policy threshold={self.threshold!r} is invalid for rule {self.rule!r}; allowed: "
                f"threshold with rules {' | '.join(ZOO_RULES)}"
            )

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

    @classmethod
    def zoo(cls, rule: str, value: float | int, execution: str = SKIP) -> "ExitPolicy":
        """A zero-shot rule of the zoo (entropy:τ, kl:τ, stable:k) in dense or skip execution."""
        if execution not in (DENSE, SKIP):
            raise ConfigError(f"policy execution={execution!r} is invalid for rule {rule!r}; allowed: dense | skip")
        return cls(execution, rule, threshold=value)

    # ---- names ----------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """The spec without its value: full | forced | dense | skip | dense-entropy |
        skip-entropy | ... (analysis's `policy` column: one series per kind)."""
        return zoo_kind(self.execution, self.rule) if self.rule in ZOO_RULES else self.execution

    @property
    def spec(self) -> str:
        """The parseable name: full, forced:2, dense:0.4, skip:0.4, skip-entropy:2.5,
        dense-kl:0.01, skip-stable:2 (skip:given is not parseable)."""
        if self.execution == FULL:
            return FULL
        if self.execution == FORCED:
            return f"{FORCED}:{self.depth}"
        if self.rule in ZOO_RULES:
            return f"{self.kind}:{_value_name(self.rule, self.threshold)}"
        return f"{self.execution}:{GIVEN if self.rule == GIVEN else number_name(self._gate_q())}"

    @property
    def label(self) -> str:
        """For people: 'full depth', 'forced d=2', 'skip q=0.4', 'skip entropy<2.5',
        'dense KL<0.01', 'skip stable k=2'."""
        if self.execution == FULL:
            return "full depth"
        if self.execution == FORCED:
            return f"forced d={self.depth}"
        if self.rule in ZOO_RULES:
            return f"{self.execution} " + ZOO_LABELS[self.rule].format(_value_name(self.rule, self.threshold))
        return f"{self.execution} " + ("given exits" if self.rule == GIVEN else f"q={number_name(self._gate_q())}")

    @property
    def metric_prefix(self) -> str:
        """What the policy's evaluation metrics start with: val_, forced_d2_, skip_q0.4_,
        skip_entropy2.5_, dense_kl0.01_, skip_stable2_."""
        if self.execution == FULL:
            return "val_"
        if self.execution == FORCED:
            return f"forced_d{self.depth}_"
        if self.rule == GIVEN:
            raise ConfigError("a policy with given exit steps has no metric name (it is never logged)")
        if self.rule in ZOO_RULES:
            return f"{self.execution}_{self.rule}{_value_name(self.rule, self.threshold)}_"
        return f"{self.execution}_q{number_name(self._gate_q())}_"

    def _gate_q(self) -> float:
        """q of a gate rule (__post_init__ made it a float; the names above reach here for gate rules only)."""
        assert self.q is not None, self.rule
        return self.q

    def __str__(self) -> str:
        return self.spec

    def __repr__(self) -> str:
        return f"ExitPolicy({self.spec})"

    # ---- parsing back -------------------------------------------------------------------
    @classmethod
    def parse(cls, spec: str) -> "ExitPolicy":
        """The inverse of `spec`: 'full' | 'forced:D' | 'dense:Q' | 'skip:Q' |
        '<dense|skip>-entropy:T' | '<dense|skip>-kl:T' | '<dense|skip>-stable:K'."""
        text = str(spec).strip()
        kind, _, value = text.partition(":")
        execution, dash, rule = kind.partition("-")
        if kind == FULL and not value:
            return cls.full()
        zoo = bool(dash) and execution in (DENSE, SKIP) and rule in ZOO_RULES
        try:  # a value of the wrong form is the generic error below; one out of range, its own
            number = int(value) if kind == FORCED or (zoo and rule == STABLE) else float(value)
        except ValueError:
            number = None
        if number is not None and kind == FORCED:
            return cls.forced(int(number))  # parsed with int() above
        if number is not None and kind in (DENSE, SKIP):
            return cls(execution, GATE, q=number)
        if number is not None and zoo:
            return cls.zoo(rule, number, execution)
        raise ConfigError(
            f"policy {text!r} is invalid; allowed: full | forced:D | dense:Q | skip:Q | "
            "dense-entropy:T | skip-entropy:T | dense-kl:T | skip-kl:T | dense-stable:K | "
            "skip-stable:K (e.g. skip:0.4, forced:2, skip-entropy:2.5, skip-stable:2)"
        )

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
        if m["rule"]:
            return cls.parse(f"{zoo_kind(m['execution'], m['rule'])}:{m['q']}")
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

    def loops_of(self, exit_step: torch.Tensor, n_loops: int) -> torch.Tensor:
        """The loops tokens with these exit steps run: the exit step under skip, else
        the fixed count (dense runs every loop whatever its readout step)."""
        fixed = self.loops_run(n_loops)
        return exit_step if fixed is None else exit_step.new_full(exit_step.shape, fixed)

    def check(self, n_loops: int, shape: tuple[int, ...] | None = None) -> None:
        """Checks that need the model: forced depth and given steps within 1..R."""
        if self.execution == FORCED and self.depth is not None and self.depth > n_loops:  # forced: a depth
            raise ConfigError(f"policy depth={self.depth} is invalid; allowed: an integer in [1, R={n_loops}]")
        if self.rule == GIVEN:
            at = self.exit_at
            if (shape is not None and tuple(at.shape) != tuple(shape)) or int(at.min()) < 1 or int(at.max()) > n_loops:
                raise ConfigError(
                    f"policy exit_at must be (B, L) = {tuple(shape or at.shape)} with steps in [1, R={n_loops}]"
                )


# The metric prefixes, as one regular expression with named groups (analysis parses
# metric names with it, in polars too): val_ | forced_d<D>_ | <dense|skip>_q<Q>_ |
# <dense|skip>_<entropy|kl|stable><T>_. Groups: val, depth, execution, rule (the zoo
# rule; empty for the gate) and q (the gate's q, or the zoo rule's τ or k).
PREFIX_PATTERN = re.compile(
    r"(?:(?P<val>val_)|forced_d(?P<depth>[0-9]+)_|(?P<execution>dense|skip)_"
    rf"(?:q|(?P<rule>{'|'.join(ZOO_RULES)}))(?P<q>[0-9]+(?:\.[0-9]+)?)_)"
)


def parse_policies(text: str) -> list[ExitPolicy]:
    """A grid of policies: 'dense:0.2,0.4;skip:0.4;forced:1-4;full;skip-entropy:1.0,2.0;
    dense-kl:0.01;skip-stable:2-3' — groups separated by ';', each a kind with
    comma-separated values (forced and stable take integer ranges A-B)."""
    policies: list[ExitPolicy] = []
    for group in (g.strip() for g in str(text).split(";")):
        if not group:
            continue
        kind, _, values = group.partition(":")
        if kind == FULL or not values:
            policies.append(ExitPolicy.parse(group))
            continue
        for value in (v.strip() for v in values.split(",") if v.strip()):
            lo, dash, hi = value.partition("-")
            if (kind == FORCED or kind.endswith("-" + STABLE)) and dash and lo.isdigit() and hi.isdigit():
                policies.extend(ExitPolicy.parse(f"{kind}:{d}") for d in range(int(lo), int(hi) + 1))
            else:
                policies.append(ExitPolicy.parse(f"{kind}:{value}"))
    if not policies:
        raise ConfigError(
            f"policies {text!r} is invalid; allowed: e.g. dense:0.2,0.4;skip:0.4;forced:1-4;skip-entropy:1.0,2.0"
        )
    return list(dict.fromkeys(policies))  # in order, each once


# What a rule reads after each step r < R: the gate's logits (B, L), or the step's
# next-token logits (B, L, V) = model.logits(h^(r)).
GATE_LOGITS, STEP_LOGITS = "gate_logits", "step_logits"


class ExitRule(ABC):
    """A rule deciding exits step by step. After each step r < R, update(x) reads the
    step's value x (what `reads` names: gate logits, or next-token logits) and returns
    where the rule says exit (bool, the shape of x without a vocabulary axis); the
    caller records a token's first such step as its exit (under skip, among active
    tokens).

    The rule is a pure function of a per-token state: statistic(x, state) -> (the
    statistic, the state the next step needs), with state None at a token's first
    step; decide(statistic) -> bool. update() is the two in sequence on the state it
    keeps for one batch; one dense pass can serve a whole threshold grid (the
    statistic once per step, one decision per threshold: looplab/evaluation/validation.py), and
    depth batching keeps each row's state itself, as its tokens start and advance at
    their own pace (looplab/inference/depth_batching.py)."""

    reads: str

    def __init__(self, value: float | int):
        self.value = value
        self._state = None

    def update(self, x: torch.Tensor) -> torch.Tensor:
        statistic, self._state = self.statistic(x, self._state)
        return self.decide(statistic)

    @staticmethod
    @abstractmethod
    def statistic(x: torch.Tensor, state):
        """(statistic, the state the next step needs) from this step's value x."""

    @staticmethod
    def initial_state(n: int, device):
        """A state for n tokens that statistic() reads exactly as it reads None (the
        same statistic and next state, bit for bit), so tokens at their first step and
        later ones take one call; NotImplemented where a first step differs (kl, stable)."""
        return NotImplemented

    @abstractmethod
    def decide(self, statistic: torch.Tensor) -> torch.Tensor:
        """Which tokens' statistic says exit now: bool."""


class GateThreshold(ExitRule):
    """The threshold rule z(q), decided step by step (see the module docstring): the
    statistic is the exit CDF F^(r) = Σ_{s≤r} λ_s Π_{t<s} (1 − λ_t), its state
    (survival, F); exit where F^(r) ≥ q. The arithmetic is identical in every caller:
    float32 whatever the model's dtype (a first step's F = 0 + 1·λ = λ exactly)."""

    reads = GATE_LOGITS

    @staticmethod
    def statistic(gate_logit, state):
        import torch

        lam = torch.sigmoid(gate_logit.detach().float())
        if state is None:
            return lam, (1 - lam, lam)
        survival, cdf = state
        cdf = cdf + survival * lam
        return cdf, (survival * (1 - lam), cdf)

    @staticmethod
    def initial_state(n: int, device):
        # F = 0 + 1·λ = λ and survival 1·(1 − λ) = 1 − λ exactly: None's first step
        import torch

        return torch.ones(n, device=device), torch.zeros(n, device=device)

    def decide(self, statistic):
        return statistic >= self.value


def threshold_exit_steps(gate_logits: torch.Tensor, q: float) -> torch.Tensor:
    """Each token's exit step z(q) in 1..R from its gate logits (R-1, B, L), by the
    same rule dense and skip execution apply step by step."""
    import torch

    n_loops = gate_logits.shape[0] + 1
    rule = GateThreshold(q)
    exit_step = torch.full(gate_logits.shape[1:], n_loops, dtype=torch.long, device=gate_logits.device)
    for r in range(1, n_loops):
        exit_step = torch.where(rule.update(gate_logits[r - 1]) & (exit_step == n_loops), r, exit_step)
    return exit_step


class StepLogitsRule(ExitRule):
    """A zoo rule: after each step r < R it reads the step's next-token logits (B, L, V)
    (model.logits(h^(r)); under skip, of the scattered full state, exited tokens'
    frozen ones included) and reduces them to a per-token statistic (B, L), compared
    with the policy's threshold.

    Cost: the LM head on every token at every step r < R, plus the statistic (and
    KL's (B, L, V) copy of the previous step). That is the rule's price, not backbone
    work: it is counted nowhere in backbone FLOPs or executed loops. The statistic is
    computed in float32 at least (the model's dtype when wider), on logits detached
    from the graph: a rule decides, it is not trained."""

    reads = STEP_LOGITS


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.log_softmax(logits.detach().to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


class EntropyBelow(StepLogitsRule):
    """entropy:τ — exit after step r < R where H(p^(r)) = −Σ_v p_v log p_v < τ (nats,
    strict: H = τ stays; τ = 0 never exits). log_softmax keeps log p ≤ 0, so every
    term is ≥ 0 and so is H."""

    @staticmethod
    def statistic(logits, state):
        logp = _log_probs(logits)
        return -(logp.exp() * logp).sum(-1), None

    @staticmethod
    def initial_state(n: int, device):
        return None  # stateless: every step reads its logits alone

    def decide(self, statistic):
        return statistic < self.value


class KLBelow(StepLogitsRule):
    """kl:τ — exit after step r < R where KL(p^(r) ‖ p^(r-1)) = Σ_v p^(r)_v (log p^(r)_v
    − log p^(r-1)_v) < τ (nats, strict). At step 1 there is no previous step: its KL is
    +inf, so this rule never exits at step 1 (the earliest exit is step 2). Rounding
    can make a KL of equal distributions slightly negative; it is clamped at 0, so
    τ = 0 never exits."""

    @staticmethod
    def statistic(logits, state):
        import torch

        logp = _log_probs(logits)
        if state is None:
            return torch.full(logp.shape[:-1], float("inf"), dtype=logp.dtype, device=logp.device), logp
        return (logp.exp() * (logp - state)).sum(-1).clamp_min(0.0), logp

    def decide(self, statistic):
        return statistic < self.value


class StableArgmax(StepLogitsRule):
    """stable:k — exit after step r < R where the next-token argmax has been the same at
    the k consecutive steps r-k+1, ..., r (k >= 2; the earliest exit is step k, so
    k >= R never exits early). The statistic is the run length: 1 at step 1, then +1
    when the step's argmax equals the previous step's, else back to 1; exit where it
    is >= k. Ties among maximal logits go to the lowest token id (torch.argmax returns
    the first maximal index), on the logits upcast to float32 at least."""

    @staticmethod
    def statistic(logits, state):
        import torch

        top = logits.detach().to(torch.promote_types(logits.dtype, torch.float32)).argmax(dim=-1)
        if state is None:
            run = torch.ones_like(top)
        else:
            previous, run = state
            run = torch.where(top == previous, run + 1, torch.ones_like(run))
        return run, (top, run)

    def decide(self, statistic):
        return statistic >= self.value


EXIT_RULES: dict[str, type[ExitRule]] = {  # the classes: callers read their reads and statistic
    GATE: GateThreshold,
    ENTROPY: EntropyBelow,
    KL: KLBelow,
    STABLE: StableArgmax,
}


def exit_rule(policy: ExitPolicy) -> ExitRule:
    """The rule object deciding `policy`'s exits step by step (gate or zoo rule), fresh
    for one forward (its state takes the shape of the values it reads)."""
    if policy.rule not in EXIT_RULES:
        raise ConfigError(f"policy {policy.spec!r} has no exit rule; allowed: rules {' | '.join(EXIT_RULES)}")
    value = policy.q if policy.rule == GATE else policy.threshold
    assert value is not None  # __post_init__: a gate rule has its q, a zoo rule its threshold
    return EXIT_RULES[policy.rule](value)


Rounding = Literal["stochastic", "nearest", "floor", "ceil"]
ROUNDINGS: tuple[str, ...] = get_args(Rounding)  # HoleConfig.rounding's choices (round_depth)


def round_depth(depth: np.ndarray, rule: str, rng: np.random.Generator) -> np.ndarray:
    """Fractional target depths to integer exit steps (CHASE's depth holes, and the
    speed benchmark's oracle exits). stochastic: floor(d) + Bernoulli(d − floor(d)),
    so E[step] = d (the default); nearest / floor / ceil: deterministic."""
    if rule == "stochastic":
        base = np.floor(depth)
        return (base + (rng.random(depth.shape) < depth - base)).astype(np.int64)
    if rule == "nearest":
        return np.floor(depth + 0.5).astype(np.int64)
    if rule == "floor":
        return np.floor(depth).astype(np.int64)
    if rule == "ceil":
        return np.ceil(depth).astype(np.int64)
    raise ConfigError(f"rounding={rule!r} is invalid; allowed: {' | '.join(ROUNDINGS)}")
