"""A trial's pipeline: the stage configs a declaration and the sampled params give.

Stage k continues stage k-1's checkpoint, whose folder is named by stage k-1's
trial_key; stage k's hash names its parent by its config hash (parent_key), not by the
folder's path, so every name is a pure function of the declaration and the params,
wherever the storage lies.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from looplab.config import ConfigError, ExperimentConfig, apply_overrides
from looplab.presets import for_stage, get_preset

STAGE_ORDER = ("pretrain", "stage1", "chase", "stage2")


@dataclass(frozen=True)
class PipelineSpec:
    """What every trial of a sweep shares.

    preset, overrides: the base config (overrides as dotted names, for every stage).
    stages: the stages in order, e.g. ("pretrain", "stage1").
    stage_overrides: extra dotted overrides per stage name.
    searched: sampled param name -> dotted config key, e.g. {"beta": "exit.beta"}.
    searched_stages: the stages the sampled params apply to (upstream stages stay
      shared across trials); "seed" always applies to every stage.
    arms: named alternatives to `stages`, chosen by the param "arm", e.g. Table 4's
      {"ouro": (pretrain, stage1, stage2), "chase": (pretrain, stage1, chase, stage2)}:
      the arms share every stage up to where they differ (same configs, same keys).
    """

    preset: str
    stages: tuple[str, ...]
    overrides: dict[str, Any] = field(default_factory=dict)
    stage_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    searched: dict[str, str] = field(default_factory=dict)
    searched_stages: tuple[str, ...] = ()
    arms: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, stages in {"stages": self.stages, **{f"arms.{a}": s for a, s in self.arms.items()}}.items():
            _check_stages(name, stages)
        every = set(self.stages).union(*self.arms.values())
        for s in self.searched_stages:
            if s not in every:
                raise ConfigError(f"PipelineSpec.searched_stages={s!r} is invalid; allowed: "
                                  f"{' | '.join(sorted(every))}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PipelineSpec":
        return cls(**{**d, "stages": tuple(d["stages"]), "searched_stages": tuple(d.get("searched_stages", ())),
                      "arms": {a: tuple(s) for a, s in d.get("arms", {}).items()}})

    def stages_of(self, params: dict[str, Any]) -> tuple[str, ...]:
        if "arm" not in params:
            return self.stages
        if params["arm"] not in self.arms:
            raise ConfigError(f"arm={params['arm']!r} is invalid; allowed: {' | '.join(self.arms) or '(no arms)'}")
        return self.arms[params["arm"]]


def _check_stages(name: str, stages: tuple[str, ...]) -> None:
    if not stages:
        raise ConfigError(f"PipelineSpec.{name}=() is invalid; allowed: a non-empty tuple of stages")
    for s in stages:
        if s not in STAGE_ORDER:
            raise ConfigError(f"PipelineSpec.{name}={s!r} is invalid; allowed: {' | '.join(STAGE_ORDER)}")
    if stages[0] != "pretrain":
        raise ConfigError(f"PipelineSpec.{name}[0]={stages[0]!r} is invalid; allowed: pretrain "
                          "(later stages continue a checkpoint the pipeline trains)")


def stage_dir(storage_path: str | Path, cfg: ExperimentConfig) -> Path:
    """Where a stage trains: one folder per (stage, trial_key), shared by all trials."""
    return Path(storage_path).resolve() / "stages" / f"{cfg.stage}-{cfg.trial_key()}"


def checkpoint_of(storage_path: str | Path, cfg: ExperimentConfig) -> Path:
    return stage_dir(storage_path, cfg) / "checkpoint"


def stage_configs(spec: PipelineSpec, params: dict[str, Any], storage_path: str | Path) -> list[ExperimentConfig]:
    """The configs of one trial's stages, in order, each continuing the previous one."""
    allowed = set(spec.searched) | {"seed"} | ({"arm"} if spec.arms else set())
    unknown = set(params) - allowed
    if unknown:
        raise ConfigError(f"trial params {sorted(unknown)} are invalid; allowed: {' | '.join(sorted(allowed))}")
    stages = spec.stages_of(params)
    searched_stages = spec.searched_stages or stages[-1:]
    base = apply_overrides(get_preset(spec.preset), spec.overrides) if spec.overrides else get_preset(spec.preset)
    configs: list[ExperimentConfig] = []
    for stage in stages:
        parent = configs[-1] if configs else None
        cfg = for_stage(base, stage, str(checkpoint_of(storage_path, parent)) if parent else "",
                        # The parent's hash, seed-free like every config hash: the seeds of
                        # one configuration share a hash downstream too (seed aggregation).
                        parent_key=f"{parent.stage}-{parent.config_hash()}" if parent else "")
        overrides = dict(spec.stage_overrides.get(stage, {}))
        if "seed" in params:
            overrides["train.seed"] = params["seed"]
        if stage in searched_stages:
            overrides.update({spec.searched[name]: value for name, value in params.items()
                              if name not in ("seed", "arm")})
        if overrides:
            cfg = apply_overrides(cfg, overrides)
        configs.append(cfg)
    return configs
