"""A trial's pipeline: the stage configs a declaration and the sampled params give.

Stage k continues stage k-1's checkpoint, whose folder is named by stage k-1's
stage_key; stage k's key names its parent by that key (config.ParentRef), not by the
folder's path, so every name is a pure function of the declaration and the params,
wherever the storage lies. Each stage's config follows the one precedence rule of
looplab/stages.py: preset < stage recipe < sweep-wide overrides < per-stage overrides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from looplab.config import ConfigError, ExperimentConfig
from looplab.config.paths import ConfigKey, checked_key
from looplab.keys import stage_path
from looplab.presets import get_preset, stage_config
from looplab.stages import STAGE_NAMES, get_stage
from looplab.training.run_folder import CHECKPOINT_DIR
from trainables.storage import Storage

DATASET = "task.dataset"


def _absolute_data(overrides: dict[str, Any]) -> dict[str, Any]:
    from looplab.tasks.text_sources import absolute_dataset

    return {k: absolute_dataset(v) if k == DATASET else v for k, v in overrides.items()}


@dataclass(frozen=True)
class PipelineSpec:
    """What every trial of a sweep shares.

    preset, overrides: the base config and the sweep-wide overrides (dotted names), which
      reach every stage over its recipe.
    stages: the stages in order, e.g. ("pretrain", "stage1").
    stage_overrides: dotted overrides per stage name, over the sweep-wide ones.
    searched: sampled param name -> the config field it sets, e.g. {"beta":
      field_key(lambda c: c.exit.beta)} (looplab/config/paths.py), "exit.beta" stored.
    searched_stages: the stages the sampled params apply to (upstream stages stay
      shared across trials); "seed" always applies to every stage.
    scopes: searched param -> the stages it applies to instead of searched_stages,
      e.g. a scan's {"pretrain_steps": ("pretrain",), "stage_steps": ("stage1",
      "chase", "stage2")}: two params can set one field (train.steps) in different
      stages.
    arms: named alternatives to `stages`, chosen by the param "arm", e.g. Table 4's
      {"ouro": (pretrain, stage1, stage2), "chase": (pretrain, stage1, chase, stage2)}:
      the arms share every stage up to where they differ (same configs, same keys).
    """

    preset: str
    stages: tuple[str, ...]
    overrides: dict[str, Any] = field(default_factory=dict)
    stage_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    searched: dict[str, ConfigKey] = field(default_factory=dict)
    searched_stages: tuple[str, ...] = ()
    arms: dict[str, tuple[str, ...]] = field(default_factory=dict)
    scopes: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Local data named relative to where the sweep was typed: absolute before any
        # trial (in Ray's working folder) builds its config from these overrides.
        object.__setattr__(self, "overrides", _absolute_data(self.overrides))
        stage_overrides = {stage: _absolute_data(o) for stage, o in self.stage_overrides.items()}
        object.__setattr__(self, "stage_overrides", stage_overrides)
        for param, key in self.searched.items():  # a stored spec's keys arrive as text
            checked_key(key, f"PipelineSpec.searched[{param!r}]")
        for name, stages in {"stages": self.stages, **{f"arms.{a}": s for a, s in self.arms.items()}}.items():
            _check_stages(name, stages)
        every = set(self.stages).union(*self.arms.values())
        for s in self.searched_stages:
            if s not in every:
                raise ConfigError(
                    f"PipelineSpec.searched_stages={s!r} is invalid; allowed: {' | '.join(sorted(every))}"
                )
        for param, stages in self.scopes.items():
            if param not in self.searched:
                raise ConfigError(
                    f"PipelineSpec.scopes={param!r} is invalid; allowed: a searched param "
                    f"({' | '.join(self.searched) or 'none'})"
                )
            for s in stages:
                if s not in every:
                    raise ConfigError(
                        f"PipelineSpec.scopes[{param!r}]={s!r} is invalid; allowed: {' | '.join(sorted(every))}"
                    )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PipelineSpec":
        return cls(
            **{
                **d,
                "stages": tuple(d["stages"]),
                "searched_stages": tuple(d.get("searched_stages", ())),
                "arms": {a: tuple(s) for a, s in d.get("arms", {}).items()},
                "scopes": {p: tuple(s) for p, s in d.get("scopes", {}).items()},
            }
        )

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
        if s not in STAGE_NAMES:
            raise ConfigError(f"PipelineSpec.{name}={s!r} is invalid; allowed: {' | '.join(STAGE_NAMES)}")
    twice = sorted({s for s in stages if stages.count(s) > 1})
    if twice:  # it would train, but the analysis finds a trial's final stage by its name (analysis/points.py)
        raise ConfigError(
            f"PipelineSpec.{name}={stages!r} is invalid; allowed: each stage once (it names {', '.join(twice)} "
            "twice, and the analysis reads a trial's stages by their names)"
        )
    for i, s in enumerate(stages):
        if get_stage(s).continues != (i > 0):
            first = [n for n in STAGE_NAMES if not get_stage(n).continues]
            raise ConfigError(
                f"PipelineSpec.{name}[{i}]={s!r} is invalid; allowed: "
                + (
                    f"{' | '.join(first)} first (later stages continue a checkpoint the pipeline trains)"
                    if i == 0
                    else "a stage that continues its parent"
                )
            )


def stage_dir(storage_path: str | Path, cfg: ExperimentConfig) -> str:
    """Where a stage trains: one folder per stage key, shared by all trials (a local
    path, or a URI on an object store: trainables/storage.py)."""
    return Storage(storage_path).path(*stage_path(cfg.stage, cfg.stage_key()))


def checkpoint_of(storage_path: str | Path, cfg: ExperimentConfig) -> str:
    """Where a stage's checkpoint lies: its stage folder's checkpoint/."""
    return Storage(storage_path).path(*stage_path(cfg.stage, cfg.stage_key(), CHECKPOINT_DIR))


def stage_configs(spec: PipelineSpec, params: dict[str, Any], storage_path: str | Path) -> list[ExperimentConfig]:
    """The configs of one trial's stages, in order, each continuing the previous one."""
    allowed = set(spec.searched) | {"seed"} | ({"arm"} if spec.arms else set())
    unknown = set(params) - allowed
    if unknown:
        raise ConfigError(f"trial params {sorted(unknown)} are invalid; allowed: {' | '.join(sorted(allowed))}")
    stages = spec.stages_of(params)
    searched_stages = spec.searched_stages or stages[-1:]
    base = get_preset(spec.preset)
    configs: list[ExperimentConfig] = []
    for stage in stages:
        parent = configs[-1] if configs else None
        mine = dict(spec.stage_overrides.get(stage, {}))
        if "seed" in params:
            mine["train.seed"] = params["seed"]
        mine.update(
            {
                spec.searched[name]: value
                for name, value in params.items()
                if name not in ("seed", "arm") and stage in spec.scopes.get(name, searched_stages)
            }
        )
        configs.append(
            stage_config(
                base,
                stage,
                parent=parent.as_parent(checkpoint_of(storage_path, parent)) if parent else None,
                overrides=spec.overrides,
                stage_overrides=mine,
            )
        )
    return configs
