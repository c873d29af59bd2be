"""The miniature's protocol, frozen: what sweeps/paper_mini.py runs and how its verdicts
are decided, declared once, hashed, and kept with a history and a ledger of seeds.

A verdict is only as good as the order in which it was reached: the regime, the arms,
the claims' tests and nulls, the seeds and their number, the confidence and the
correction are fixed *before* the seeds that judge them are trained. So:

  Protocol   the whole declaration (presets, regimes, stage steps, arms, points, the
             timed step, claims and their rules, confidence, correction) with a content
             digest over everything that decides a verdict. From v5 on it also declares
             its seeds (a block, and how many of it each sweep trains: a power
             analysis sized them, sweeps/power_analysis.py) and its Pins, both inside
             the digest; v1-v4 kept their seeds outside it.
  Pins       what else decides a verdict, declared as values and checked before a run
             trains (sweeps/fingerprint.py): the claims family, the torch version, the
             machine class, the stages' resolved configs, what the claims code
             computes, and each stage shape's first steps. A departure is named in one
             line and makes the run exploratory.
  HISTORY    every protocol the miniature has had, in order, with the seeds it scored
             and what its verdicts were (the committed record: those seeds were seen
             while the next protocol was chosen).
  Ledger     which seeds were used under which digest: HISTORY, then the committed
             ledger (sweeps/protocol_ledger.jsonl), then the store's
             (STORAGE/protocol_ledger.jsonl, read and written through the store, local
             or remote). A seed's line is written when its first stage starts, with the
             machine, the commit and whether the checkout was dirty; a seed is *fresh*
             for a protocol when its first line anywhere is under that protocol's digest.
             Only fresh seeds, the declared ones, on a run without departures, make the
             headline; any other run is exploratory and says so.

Changing PROTOCOL after its seeds were used is allowed and shown, never hidden: add the
old one to HISTORY with its verdicts (tests/test_protocol.py pins the digests, so a
change cannot pass unnoticed) and judge the new one on seeds it has not seen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from looplab.errors import ConfigError
from looplab.keys import digest
from looplab.stages import ARMS, DEFAULT_STAGE, FIXED_MATCHED_ARM, OURO_MATCHED_ARM, get_stage

CORRECTIONS = ("holm", "none")
DIGEST_LENGTH = 12
SWEEPS = ("lm", "phop", "mano")  # the miniature's sweeps, as Pins.seeds names them
# The sweep whose trials each claim reads: C1 p-hop's, C1-mano Mano's, every other claim
# the LM's (and its CHASE models' timed prefills).
CLAIM_SWEEP = {"C1": "phop", "C1-mano": "mano"}


@dataclass(frozen=True)
class Pins:
    """What a protocol pins beyond its declaration (v5 on; sweeps/fingerprint.py checks
    each before a run trains).

      family     the claims Holm's correction judges: a fixed family (a claim without
                 a result counts as p = 1); the protocol's other claims are shown and
                 never judged (a GPU phenomenon on a CPU, analysis.claims.Claim.gpu_only)
      seeds      per sweep (SWEEPS), how many of the protocol's seed block judge: the
                 block's first n (a power analysis sized them)
      torch      the torch version it was declared under
      machine    its machine class (sweeps/fingerprint.machine_class)
      stages     the digest of every stage's resolved config (fingerprint.stages_digest)
      analysis   the digest of what the claims code computes on a fixed input
      behaviour  each stage shape's first steps' losses (fingerprint.training_fingerprint)"""

    family: tuple[str, ...]
    seeds: dict[str, int]
    torch: str
    machine: str
    stages: str
    analysis: str
    behaviour: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, n in self.seeds.items():
            if name not in SWEEPS or not isinstance(n, int) or n < 2:
                raise ConfigError(
                    f"Pins.seeds[{name!r}]={n!r} is invalid; allowed: {' | '.join(SWEEPS)} -> an integer >= 2"
                )


@dataclass(frozen=True)
class GpuSpeed:
    """Where the claims a CPU cannot test are judged (v5 on): a GPU at the paper's
    setting (Table 5: the 140M model's shape, context 2048, survivors padded to each
    batch's largest count, bf16 autocast, skip at q = 0.2), timed at batch 1 and at 64.
    Each seed is a fresh model of the shape whose exit gate is spread (its weights drawn
    at gate_spread) so that tokens exit across the loops: what is judged is the
    machine's regime (does skip's prefill speedup grow from a latency-bound batch 1 to a
    compute-bound batch 64?), not a trained gate's pattern, which the miniature's C4
    measures on a CPU. Holm's correction over these claims alone
    (sweeps/gpu_claims.py; scripts/device_check.sh runs it)."""

    claims: tuple[str, ...] = ("C4-batch1", "C4-growth")
    preset: str = "paper-140m"
    seq_len: int = 2048
    batches: tuple[int, ...] = (1, 64)
    packing: str = "padded"
    dtype: str = "bf16"
    policy: str = "skip:0.2"
    gate_spread: float = 5.0
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)


@dataclass(frozen=True)
class Protocol:
    name: str  # a label for people ("v3: ..."); the digest is the identity
    lm_preset: str
    lm_regime: dict[str, Any]  # sweep-wide overrides of every LM stage
    stage_steps: dict[str, int]  # each continued stage's steps
    arms: dict[str, tuple[str, ...]]  # arm -> its stages
    lm_points: tuple[tuple[str, int, int], ...]  # (arm, N, R)
    phop_preset: str
    phop_regime: dict[str, Any]
    phop_hops: tuple[int, ...]
    phop_pairs: tuple[tuple[int, int], ...]  # (N, R): the looped model, then its N⊗1
    speed_points: tuple[tuple[int, str, str], ...]  # (batch, packing, dtype) of the timed prefills
    speed_policy: str
    claim_rules: dict[str, dict[str, Any]]  # claim -> its rule (analysis.claims.Claim.rule())
    matched: dict[str, str] = field(default_factory=dict)  # claim -> the step-matched arm its verdict reads
    confidence: float = 0.95
    correction: str = "none"
    seeds: tuple[int, ...] = ()  # the default judges (outside the digest)
    # A run's --set (both sweeps) and --stage-set (the LM's stages): another protocol.
    overrides: dict[str, Any] = field(default_factory=dict)
    stage_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Mano (C1-mano), opt-in: a protocol without it hashes as it did before these fields existed
    mano_preset: str = ""
    mano_regime: dict[str, Any] = field(default_factory=dict)
    mano_levels: tuple[int, ...] = ()
    mano_pairs: tuple[tuple[int, int], ...] = ()  # (N, R): the looped model, then its N⊗1
    # v5 on, opt-in: the seeds and Pins enter the digest (a protocol without pins hashes as before)
    pins: Pins | None = None
    gpu_speed: GpuSpeed | None = None  # v5 on: where the GPU claims are judged (in the digest when set)
    # Differences between compared arms the protocol does not remove but states (outside
    # the digest: prose; what they describe is in it)
    disclosed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._check_statistics()
        self._check_arms_and_pairs()
        self._check_claims_and_seeds()

    def _check_statistics(self) -> None:
        if self.correction not in CORRECTIONS:
            raise ConfigError(f"Protocol.correction={self.correction!r} is invalid; allowed: {' | '.join(CORRECTIONS)}")
        if not 0.5 < self.confidence < 1.0:
            raise ConfigError(f"Protocol.confidence={self.confidence!r} is invalid; allowed: a float in (0.5, 1)")

    def _check_arms_and_pairs(self) -> None:
        for arm, _, _ in self.lm_points:
            if arm not in self.arms:
                raise ConfigError(f"Protocol.lm_points arm={arm!r} is invalid; allowed: {' | '.join(self.arms)}")
        for claim, arm in self.matched.items():
            if arm not in self.arms:
                raise ConfigError(f"Protocol.matched[{claim!r}]={arm!r} is invalid; allowed: {' | '.join(self.arms)}")
        for task, pairs in (("phop", self.phop_pairs), ("mano", self.mano_pairs)):
            if (pairs or task == "phop") and (len(pairs) < 2 or pairs[0][1] < 2 or (pairs[0][0], 1) not in pairs):
                raise ConfigError(
                    f"Protocol.{task}_pairs={pairs!r} is invalid; allowed: (N, R) pairs, the looped N⊗R (R >= 2) "
                    "first, its iso-parameter N⊗1 among them"
                )
        if bool(self.mano_preset) != bool(self.mano_pairs) or bool(self.mano_preset) != bool(self.mano_levels):
            raise ConfigError(
                f"Protocol.mano_preset={self.mano_preset!r} is invalid with mano_pairs={self.mano_pairs!r} and "
                f"mano_levels={self.mano_levels!r}; allowed: all three set (a Mano claim) or none"
            )

    def _check_claims_and_seeds(self) -> None:
        for claim in self.gpu_speed.claims if self.gpu_speed is not None else ():
            if claim not in self.claim_rules:
                raise ConfigError(
                    f"GpuSpeed.claims={claim!r} is invalid; allowed: the protocol's claims ({' | '.join(self.claim_rules)})"
                )
        if self.pins is not None:
            for claim in self.pins.family:
                if claim not in self.claim_rules:
                    raise ConfigError(
                        f"Pins.family={claim!r} is invalid; allowed: the protocol's claims ({' | '.join(self.claim_rules)})"
                    )
            largest = max(self.pins.seeds.values(), default=0)
            if len(self.seeds) < largest or len(set(self.seeds)) != len(self.seeds):
                raise ConfigError(
                    f"Protocol.seeds={self.seeds!r} is invalid; allowed: {largest} distinct seeds or more "
                    f"(Pins.seeds asks for {largest})"
                )

    def content(self) -> dict[str, Any]:
        """What the digest covers: everything but the label; the seeds and the pins from
        v5 on (v1-v4 kept their default seeds outside it); the opt-in Mano fields where
        a protocol has a Mano claim."""
        d = asdict(self)
        d.pop("name")
        d.pop("disclosed")
        if self.pins is None:
            d.pop("seeds")
            d.pop("pins")
        if self.gpu_speed is None:
            d.pop("gpu_speed")
        if not self.mano_preset:
            for name in ("mano_preset", "mano_regime", "mano_levels", "mano_pairs"):
                d.pop(name)
        return d

    @property
    def family(self) -> tuple[str, ...]:
        """The claims the correction judges: the pinned family, or (before v5) every
        claim of the protocol."""
        return self.pins.family if self.pins is not None else tuple(self.claim_rules)

    def seeds_of(self, sweep: str) -> tuple[int, ...]:
        """The declared seeds one sweep trains: the block's first n (Pins.seeds), or the
        whole block before v5."""
        if self.pins is None or sweep not in self.pins.seeds:
            return self.seeds
        return self.seeds[: self.pins.seeds[sweep]]

    def seeds_of_claim(self, claim: str) -> tuple[int, ...]:
        """The declared seeds of the sweep a claim reads (CLAIM_SWEEP)."""
        return self.seeds_of(CLAIM_SWEEP.get(claim, "lm"))

    def digest(self) -> str:
        """The content key (looplab/keys.py) of what decides a verdict."""
        return digest(self.content(), DIGEST_LENGTH)

    def with_overrides(self, overrides: dict[str, Any], stage_overrides: dict[str, dict[str, Any]]) -> "Protocol":
        """The protocol a run with --set / --stage-set actually follows: another digest,
        so its verdicts never pass for the declared protocol's."""
        if not overrides and not stage_overrides:
            return self
        return replace(
            self,
            name=f"{self.name}, modified by --set/--stage-set",
            overrides=dict(overrides),
            stage_overrides={k: dict(v) for k, v in stage_overrides.items()},
        )

    def steps_of(self, stage: str) -> int:
        """A stage's steps under this protocol, its overrides included."""
        given = {**self.overrides, **self.stage_overrides.get(stage, {})}
        if "train.steps" in given:
            return given["train.steps"]
        return self.lm_regime["train.steps"] if stage == DEFAULT_STAGE else self.stage_steps[stage]

    def weight_steps(self, arm: str) -> int:
        """The weight-training steps behind an arm's model: every stage that trains the
        backbone (Stage-2 trains the gate alone and does not count)."""
        return sum(self.steps_of(s) for s in self.arms[arm] if get_stage(s).trains_model)

    def arm_steps_text(self) -> list[str]:
        """One line per arm: its stages with their steps and its weight-training steps."""
        lines = []
        for arm, stages in self.arms.items():
            parts = [f"{s} {self.steps_of(s)}" + ("" if get_stage(s).trains_model else " (gate only)") for s in stages]
            lines.append(f"{arm:<14} {' → '.join(parts)}: {self.weight_steps(arm)} weight-training steps")
        return lines


# ---- the protocols, oldest first ------------------------------------------------------------------------

_OLD_RULES = {  # v1 and v2: the rules of analysis/claims.py then (no resolution declared, no correction)
    "C1": (1, 0.0),
    "C1-LM": (1, 0.0),
    "C1-depth": (1, 0.0),
    "C2": (1, 0.0),
    "C2-own": (1, 0.0),
    "C3": (1, 0.0),
    "C3-few": (-1, 5.0),
    "C4": (1, 1.0),
    "C4-batch1": (-1, 1.0),
    "C4-growth": (1, 0.0),
}
_OLD_ARMS = {"ouro": ARMS["ouro"], "chase": ARMS["chase"], "fixed": (DEFAULT_STAGE,)}
_OLD_POINTS = (("ouro", 1, 4), ("chase", 1, 4), ("fixed", 1, 4), ("fixed", 1, 1), ("fixed", 4, 1))
_QS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


def _lm_regime(seq_len: int) -> dict[str, Any]:
    return {
        "train.seq_len": seq_len,
        "train.batch_size": 8,
        "train.steps": 800,
        "task.val_blocks": 64,
        "train.eval_every": 400,
        "model.n_loops": 4,
        "hole.sampler": "depth",
        "hole.hp": 0.5,
        "train.eval_qs": _QS,
    }


def _old(name: str, seq_len: int) -> Protocol:
    return Protocol(
        name=name,
        lm_preset="debug",
        lm_regime=_lm_regime(seq_len),
        stage_steps={"stage1": 200, "chase": 200, "stage2": 200},
        arms=_OLD_ARMS,
        lm_points=_OLD_POINTS,
        phop_preset="phop-debug",
        phop_regime={"task.n": 16, "model.d_model": 64, "train.steps": 2000},
        phop_hops=(2,),
        phop_pairs=((1, 4), (1, 1), (4, 1)),
        speed_points=((1, "auto", "fp32"), (64, "auto", "fp32")),
        speed_policy="skip:0.2",
        claim_rules={c: {"direction": d, "null": n} for c, (d, n) in _OLD_RULES.items()},
        confidence=0.95,
        correction="none",
        seeds=(100, 101, 102),
    )


_V3_RULES = {  # v3's rules as analysis/claims.py held them then (C1-mano came with v4)
    c: {"direction": d, "null": n, "resolution": r, "log_ratio": log}
    for c, d, n, r, log in (
        ("C1", 1, 0.0, 0.2, False),
        ("C1-LM", 1, 0.0, 0.01, True),
        ("C1-depth", 1, 0.0, 0.01, True),
        ("C2", 1, 0.0, 0.01, False),
        ("C2-own", 1, 0.0, 0.01, False),
        ("C3", 1, 0.0, 0.01, False),
        ("C3-few", -1, 5.0, 0.01, False),
        ("C4", 1, 1.0, 0.01, False),
        ("C4-batch1", -1, 1.0, 0.01, False),
        ("C4-padded", 1, 1.0, 0.01, False),
        ("C4-growth", 1, 0.0, 0.01, False),
    )
}


def _v3(name: str, claim_rules: dict[str, dict[str, Any]], seeds: tuple[int, ...]) -> Protocol:
    return Protocol(
        name=name,
        lm_preset="debug",
        lm_regime=_lm_regime(128),
        stage_steps={"stage1": 200, "chase": 200, "stage2": 200, "stage1_more": 200, "pretrain_more": 400},
        arms={**_OLD_ARMS, "ouro-matched": OURO_MATCHED_ARM, "fixed-matched": FIXED_MATCHED_ARM},
        lm_points=(
            ("ouro", 1, 4),
            ("ouro-matched", 1, 4),
            ("chase", 1, 4),
            ("fixed", 1, 4),
            ("fixed", 1, 1),
            ("fixed", 4, 1),
            ("fixed-matched", 1, 4),
        ),
        phop_preset="phop-debug",
        phop_regime={"task.n": 16, "model.d_model": 64, "train.steps": 2000},
        # C1 reads 1⊗4 against 1⊗1 on p-hop; its 4⊗1 carried no claim and cost 40 % of the sweep
        phop_hops=(2,),
        phop_pairs=((1, 4), (1, 1)),
        # looplab's layout (varlen survivors, fp32) at batch 1 and 64, and the paper's (padded
        # survivors, bf16 autocast) at its headline batch 64 (C4-padded)
        speed_points=((1, "auto", "fp32"), (64, "auto", "fp32"), (64, "padded", "bf16")),
        speed_policy="skip:0.2",
        claim_rules=claim_rules,
        matched={"C2": "fixed-matched", "C3": "ouro-matched"},
        confidence=0.95,
        correction="holm",
        seeds=seeds,
    )


_V4_RULES = {**_V3_RULES, "C1-mano": {"direction": 1, "null": 0.0, "resolution": 0.2, "log_ratio": False}}


def _v4() -> Protocol:
    return replace(
        _v3("v4: p-hop at 1⊗2, a Mano claim, five fresh seeds", _V4_RULES, (300, 301, 302, 303, 304)),
        # p = 2 needs two lookups in sequence: 1⊗2 is the fewest loops that can do both, at
        # half 1⊗4's cost (three development seeds, never judges: 1⊗2 reached 78-83 % where
        # v3's 1⊗4 reached 71-87 % and its 1⊗1 64-66 %)
        phop_pairs=((1, 2), (1, 1)),
        # Mano where a d = 64 model learns it in minutes: the field Z_5 instead of the paper's
        # F_23 (tasks/mano.py), chosen on development seeds that judge nothing (docs/paper-mini.md)
        mano_preset="mano-debug",
        mano_regime={"task.modulus": 5, "train.seq_len": 64, "train.steps": 1000},
        mano_levels=(2,),
        mano_pairs=((1, 2), (1, 1)),
    )


@dataclass(frozen=True)
class Past:
    """A protocol the miniature had, the seeds it scored and what they gave."""

    protocol: Protocol
    commit: str  # where its verdicts were recorded
    verdicts: dict[str, str]  # claim -> "figure: verdict"
    note: str = ""


V1 = _old("v1: context 512 (the scan's centre)", 512)
V2 = _old("v2: context 128 (a quarter of the step cost)", 128)
V3 = _v3(
    "v3: compute-matched arms, Holm over the claims, no-spread rule, five fresh seeds",
    _V3_RULES,
    (200, 201, 202, 203, 204),
)
V4 = _v4()
HISTORY: tuple[Past, ...] = (
    Past(
        V1,
        "4a5ed98",
        {
            "C1": "+9.00 pt [+1.89, +16.11]: reproduced",
            "C1-LM": "+8.95 % [+7.47, +10.45]: reproduced",
            "C1-depth": "+12.90 % [+11.39, +14.43]: reproduced",
            "C2": "+33.67 % [+22.45, +44.89]: reproduced",
            "C2-own": "−1.34 % [−1.75, −0.93]: not reproduced",
            "C3": "+10.05 pt [+8.21, +11.88]: reproduced",
            "C3-few": "+6.87 % [+6.24, +7.50]: not reproduced",
            "C4": "2.24x [1.72, 2.77]: reproduced",
            "C4-batch1": "1.79x [1.71, 1.86]: not reproduced",
            "C4-growth": "+0.46x [−0.05, +0.96]: inconclusive",
        },
        "the LM sweep took 43 min on 2 cores, over the 30-minute budget; the regime then moved to context 128 "
        "with these seeds' verdicts in view",
    ),
    Past(
        V2,
        "ca86a73",
        {
            "C1": "+11.40 pt [+5.27, +17.53]: reproduced",
            "C1-LM": "+4.56 % [+2.04, +7.13]: reproduced",
            "C1-depth": "+10.82 % [+7.92, +13.79]: reproduced",
            "C2": "+24.15 % [+11.34, +36.97]: reproduced",
            "C2-own": "−1.05 % [−1.69, −0.41]: not reproduced",
            "C3": "+7.55 pt [+6.62, +8.48]: reproduced",
            "C3-few": "+2.65 % [−0.74, +6.05]: inconclusive",
            "C4": "1.99x [1.73, 2.24]: reproduced",
            "C4-batch1": "1.64x [1.46, 1.82]: not reproduced",
            "C4-growth": "+0.35x [+0.20, +0.49]: reproduced",
        },
        "the same seeds as v1, so not held out; arms not compute-matched (Ouro 200 weight steps behind CHASE, "
        "C2's comparator 400); no correction for ten verdicts. C1 moved from v1's +9.00 with its p-hop regime, "
        "code paths and stage keys unchanged: the two runs trained on CPUs whose kernels round differently, "
        "which 2,000 steps amplify into points (one machine reproduces its own runs bit for bit and gives "
        "+10.20 [+3.00, +17.40] on these seeds; forcing torch's generic kernels there gives +7.67 "
        "[−6.11, +21.44]); stage runs now carry the tag `hardware`",
    ),
    Past(
        V3,
        "436af94",
        {
            "C1": "+10.80 pt [+2.70, +18.90]: reproduced (direction)",
            "C1-LM": "+4.85 % [+3.32, +6.39]: reproduced (direction)",
            "C1-depth": "+10.81 % [+9.84, +11.78]: reproduced (direction)",
            "C2": "+28.64 % [+19.99, +37.28]: reproduced (direction)",
            "C2-own": "−1.04 % [−1.21, −0.87]: not reproduced",
            "C3": "+2.79 pt [+1.88, +3.70]: reproduced (direction)",
            "C3-few": "+3.43 % [+2.27, +4.59]: reproduced (direction)",
            "C4": "2.09x [1.91, 2.26]: reproduced (direction)",
            "C4-batch1": "1.68x [1.65, 1.71]: not reproduced",
            "C4-padded": "1.73x [1.62, 1.84]: reproduced (direction)",
            "C4-growth": "+0.41x [+0.23, +0.58]: reproduced (direction)",
        },
        "declared before its seeds were trained; it took 39 min 54 s on 2 cores against the 30-minute budget, "
        "so v4 halves the p-hop model's loops (1⊗2) and adds the Mano claim, with these seeds' verdicts in view",
    ),
    Past(
        V4,
        "94a6291",
        {
            "C1": "+14.44 pt [+8.02, +20.86]: reproduced (direction)",
            "C1-mano": "+12.84 pt [−0.47, +26.15]: inconclusive",
            "C1-LM": "+4.00 % [+2.83, +5.19]: reproduced (direction)",
            "C1-depth": "+10.50 % [+8.89, +12.13]: reproduced (direction)",
            "C2": "+34.36 % [+16.83, +51.88]: reproduced (direction)",
            "C2-own": "−1.31 % [−1.70, −0.91]: not reproduced",
            "C3": "+3.08 pt [+1.49, +4.67]: reproduced (direction)",
            "C3-few": "+3.75 % [+1.87, +5.62]: inconclusive",
            "C4": "2.08x [1.86, 2.30]: reproduced (direction)",
            "C4-batch1": "1.75x [1.66, 1.83]: not reproduced",
            "C4-padded": "1.71x [1.67, 1.74]: reproduced (direction)",
            "C4-growth": "+0.33x [+0.07, +0.60]: inconclusive",
        },
        "declared before its seeds were trained; 19 min 44 s on an Intel Xeon (AVX-512), 36-40 min on an AMD "
        "EPYC 7B13 (AVX2), where C4-growth turned reproduced; a reviewer's replication on five other seeds "
        "(not in this repository) kept every claim's direction and turned C1-mano and C4-growth reproduced while "
        "C3-few stayed inconclusive (+4.77 % [+3.69, +5.86]); v5 was declared with all of these in view: its "
        "seeds, code and machine pinned, its seeds counted by a power analysis on v3's and v4's",
    ),
)


# ---- v5: the protocol today ---------------------------------------------------------------------------------

# Every stage's device, precision and compile are set, not "auto": the same declaration on
# a GPU would otherwise train in bf16, compiled, under the same stage keys.
_EXPLICIT = {"train.device": "cpu", "train.precision": "fp32", "train.compile": "on"}
V5_CLAIMS = tuple(_V4_RULES)  # its claims: v4's, each judged by today's rule (analysis/claims.py)
V5_FAMILY = ("C1", "C1-mano", "C1-LM", "C1-depth", "C2", "C2-own", "C3", "C3-few", "C4", "C4-padded")
# Sized by sweeps/power_analysis.py on v3's and v4's judged seeds: 80 % power for every claim
# of the family at its strictest level (α/10); C3-few needs 13 LM seeds, C1-mano 18 Mano seeds.
V5_SEEDS = {"lm": 13, "phop": 8, "mano": 18}


def _v5() -> Protocol:
    from analysis.claims import CLAIMS  # the rules' home: v5 declares them as they stand

    v4 = _v4()
    return replace(
        v4,
        name="v5: seeds, code and machine pinned, seeds sized by a power analysis, continued stages on fresh data",
        lm_regime={**v4.lm_regime, **_EXPLICIT},
        phop_regime={**v4.phop_regime, **_EXPLICIT},
        mano_regime={**v4.mano_regime, **_EXPLICIT},
        claim_rules={c: CLAIMS[c].rule() for c in V5_CLAIMS},
        # a block no earlier protocol, development run or the scan used (the reviewer's
        # replication of v4 used five seeds not recorded here; the block starts 200 above v4's)
        seeds=tuple(range(500, 500 + max(V5_SEEDS.values()))),
        gpu_speed=GpuSpeed(),
        disclosed=(
            "fixed-matched continues pre-training in one 400-step stage (one learning-rate restart, one optimizer "
            "reset) where CHASE's weights take two stages of 200 (Stage-1, then CHASE: two of each); "
            "ouro-matched takes CHASE's two",
        ),
        pins=Pins(
            family=V5_FAMILY,
            seeds=dict(V5_SEEDS),
            torch="2.13.0+cpu",
            machine="AMD EPYC · cpu AVX512",
            stages="b0579352c2e5",
            analysis="6717129a66a0",
            behaviour={
                "paper_mini_lm pretrain 1⊗4": [5.564592361450195, 5.411251544952393, 5.17821741104126],
                "paper_mini_lm stage1 1⊗4 from sample 6400": [5.324945449829102, 5.289149284362793, 5.2552995681762695],
                "paper_mini_lm stage2 1⊗4 from sample 8000": [
                    0.9287638664245605,
                    0.9286466836929321,
                    0.9285294413566589,
                ],
                "paper_mini_lm stage1_more 1⊗4 from sample 8000": [
                    5.341224193572998,
                    5.304101943969727,
                    5.268959045410156,
                ],
                "paper_mini_lm stage2 1⊗4 from sample 9600": [
                    0.9208469986915588,
                    0.9207361936569214,
                    0.9206256866455078,
                ],
                "paper_mini_lm chase 1⊗4 from sample 8000": [5.342036724090576, 5.306527137756348, 5.272321701049805],
                "paper_mini_lm pretrain 1⊗1": [5.559193134307861, 5.253386974334717, 5.008745193481445],
                "paper_mini_lm pretrain 4⊗1": [5.602020740509033, 5.363058090209961, 5.110957145690918],
                "paper_mini_lm pretrain_more 1⊗4 from sample 6400": [
                    5.569024085998535,
                    5.528469085693359,
                    5.490754127502441,
                ],
                "paper_mini_phop pretrain 1⊗2": [2.475654363632202, 2.0145621299743652, 1.8452885150909424],
                "paper_mini_phop pretrain 1⊗1": [2.430025577545166, 1.9616968631744385, 1.8192846775054932],
                "paper_mini_mano pretrain 1⊗2": [2.771367311477661, 2.3923122882843018, 2.199799060821533],
                "paper_mini_mano pretrain 1⊗1": [2.7718610763549805, 2.310863494873047, 2.1683290004730225],
            },
        ),
    )


V5 = _v5()
PROTOCOL = V5


def seed_range(seeds) -> str:
    """500-512 for a run of consecutive seeds, else the seeds one by one."""
    seeds = tuple(seeds)
    consecutive = bool(seeds) and list(seeds) == list(range(seeds[0], seeds[0] + len(seeds)))
    return f"{seeds[0]}-{seeds[-1]}" if consecutive and len(seeds) > 2 else ", ".join(map(str, seeds))


def history_markdown(current: dict[str, str] | None = None, protocol: Protocol | None = None) -> str:
    """Every protocol, oldest first, as a column: its digest, seeds and verdicts per
    claim; last the one being run (default PROTOCOL), with `current` (claim ->
    "figure: verdict") where given."""
    protocol = protocol or PROTOCOL
    columns = [(p.protocol, p.commit, p.verdicts) for p in HISTORY] + [(protocol, "today", current or {})]
    claims = list(dict.fromkeys([c for _, _, v in columns for c in v] + list(PROTOCOL.claim_rules)))
    lines = [
        "| claim | "
        + " | ".join(
            f"{p.name.split(':')[0]} `{p.digest()}` ({commit}; seeds {seed_range(p.seeds)})" for p, commit, _ in columns
        )
        + " |",
        "|---|" + "---|" * len(columns),
    ]
    for c in claims:
        lines.append(f"| {c} | " + " | ".join(v.get(c, "—") for _, _, v in columns) + " |")
    notes = [f"- {p.protocol.name}: {p.note}." for p in HISTORY if p.note] + [f"- {protocol.name}."]
    return "\n".join(lines + [""] + notes)


# ---- the scan's own protocol: C3-growth -----------------------------------------------------------------


@dataclass(frozen=True)
class GrowthProtocol:
    """A claim the scale scan judges under its own preregistered protocol, too long for
    the miniature's budget (sweeps/c3_growth.py runs it): one claim, one axis of the
    scan at its centre, the values, the one-sided confidence, the seeds, and the
    planning figures its seeds were sized on, all hashed before the seeds train.
    evidence says what the hypothesis was found on (its seeds never judge it)."""

    name: str
    claim: str
    claim_rule: dict[str, Any]  # analysis.claims.Claim.rule() as declared
    preset: str
    regime: dict[str, Any]  # set explicitly, as v5's: nothing left to "auto"
    axis: str
    values: tuple[int, ...]
    confidence: float
    seeds: tuple[int, ...]
    effect: float  # the planning effect (per doubling) and per-seed spread of the slope
    spread: float
    evidence: str = ""

    def content(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("name")
        d.pop("evidence")
        return d

    def digest(self) -> str:
        return digest(self.content(), DIGEST_LENGTH)


def _c3_growth() -> GrowthProtocol:
    from analysis.claims import CLAIMS

    return GrowthProtocol(
        name="c3-growth v1: the gap between Ouro's and CHASE's skip penalties grows with pre-training",
        claim="C3-growth",
        claim_rule=CLAIMS["C3-growth"].rule(),
        preset="debug",
        regime=dict(_EXPLICIT),
        axis="pretrain_steps",
        values=(200, 400, 800, 1600),
        confidence=0.95,
        # fresh: no protocol, scan, development run or replication used them
        seeds=(700, 701, 702, 703),
        # The scan's gap cells along pre-training (seeds 0-2): +6.4 [+2.1, +10.8], +5.3 [+1.4, +9.3],
        # +10.5 [+6.6, +14.4], +10.7 [+7.9, +13.6]; their standard errors (half-width / t_{0.975, 2})
        # times √3 are each point's per-seed spread, and the least-squares weights over log2 of the
        # steps (−0.3, −0.1, +0.1, +0.3) give a per-seed slope's spread of 0.67 around +1.8 per
        # doubling: four seeds have 0.99 power one-sided at 0.05 (three 0.89).
        effect=1.8,
        spread=0.67,
        evidence="the scale scan's pre-training axis on seeds 0-2 (docs/scale_scan.md): the gap grew by +1.8 "
        "points per doubling [+0.8, +2.8], Ouro's increase by +4.3, CHASE's by +2.5, before continued stages "
        "read fresh data",
    )


C3_GROWTH = _c3_growth()
