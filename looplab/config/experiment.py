"""One stage's whole config (ExperimentConfig: model, task, recipe, objectives, the
stage and its parent), its keys, and the dotted overrides a command line or a sweep
applies to it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Union

from looplab.config.model import ModelConfig
from looplab.config.training import ExitConfig, HoleConfig, TrainConfig, stream_end
from looplab.errors import ConfigError, allowed_names, check, invalid
from looplab.fields import KEY, check_choice, check_ints, key_values
from looplab.keys import digest
from looplab.stages import DEFAULT_STAGE, STAGE_NAMES, get_stage
from looplab.tasks.mano import ManoConfig
from looplab.tasks.phop import PhopConfig
from looplab.tasks.text import TextConfig

TaskConfig = Union[ManoConfig, PhopConfig, TextConfig]
TASK_KINDS: dict[str, type] = {"mano": ManoConfig, "phop": PhopConfig, "text": TextConfig}


@dataclass(frozen=True)
class ParentRef:
    """The stage a continued stage starts from. key and group name it by content (its
    stage_key and its config_hash); checkpoint is where its weights are, which never
    enters a key: the same sweep under another storage path has the same keys."""

    stage: str
    key: str  # the parent's stage_key (seed included)
    group: str  # the parent's config_hash (seed excluded): seeds of one configuration share it
    checkpoint: str = ""
    # The samples of the training stream the parent's lineage consumed (its data_start
    # + its steps × batch_size), where its child's stream starts (TrainConfig.data_start).
    # Never in a key by itself: the parent's key names the parent, the child's data_start
    # enters the child's.
    data_end: int = 0

    def __post_init__(self) -> None:
        for name in ("stage", "key", "group"):
            v = getattr(self, name)
            check(isinstance(v, str) and v != "", f"ParentRef.{name}", v, "a non-empty string")
        check(isinstance(self.checkpoint, str), "ParentRef.checkpoint", self.checkpoint, "a directory path")
        check_ints(self, "data_end", minimum=0)


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one run needs: the model, the task, the training recipe, the stage
    (looplab/stages.py) and, for a continued stage, the parent it starts from."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=PhopConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    stage: str = DEFAULT_STAGE  # the stage it trains (looplab/stages.py): pretrain, stage1, chase, ...; train's --stage
    parent: ParentRef | None = None  # None: a fresh initialisation (pre-training)
    exit: ExitConfig = field(default_factory=ExitConfig)
    hole: HoleConfig = field(default_factory=HoleConfig)
    preset: str = ""  # the preset it derives from, for people reading configs (never in a key)

    def __post_init__(self) -> None:
        check_choice(self, "stage", STAGE_NAMES)
        stage = get_stage(self.stage)
        if stage.continues:
            check(
                self.parent is not None,
                "ExperimentConfig.parent",
                self.parent,
                f"the checkpoint a {self.stage!r} stage continues (it starts from a trained model)",
            )
        else:
            check(
                self.parent is None,
                "ExperimentConfig.parent",
                self.parent,
                f"None for stage={self.stage!r} (it starts from a fresh initialisation)",
            )
        stage.check(self)
        if self.train.init_from:
            check(
                self.model.arch != "hybrid",
                "ModelConfig.arch",
                self.model.arch,
                "mamba2 | transformer with train.init_from (the checkpoint's architecture)",
            )
            chosen = self.train.init_layers
            check(
                chosen in ("", "even") or len(chosen.split(",")) == self.model.n_layers,
                "TrainConfig.init_layers",
                chosen,
                f"{self.model.n_layers} (model.n_layers) comma-separated layer indices",
            )
        need = self.task.vocab_size
        check(
            self.model.vocab_size >= need,
            "ModelConfig.vocab_size",
            self.model.vocab_size,
            f"an integer >= {need}, the {self.task.kind} task's vocabulary",
        )

    @property
    def init_from(self) -> str:
        """The parent's checkpoint directory ("" for a fresh initialisation)."""
        return self.parent.checkpoint if self.parent is not None else ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ExperimentConfig":
        task = dict(d.get("task", {}))
        kind = task.get("kind", "phop")
        check(kind in TASK_KINDS, "task.kind", kind, allowed_names(kind, TASK_KINDS))
        known = {"model", "task", "train", "stage", "parent", "exit", "hole", "preset"}
        for k in d:
            check(k in known, k, d[k], "one of " + ", ".join(sorted(known)))
        parent = d.get("parent")
        return cls(
            model=_build(ModelConfig, d.get("model", {}), "model"),
            task=_build(TASK_KINDS[kind], task, "task"),
            train=_build(TrainConfig, d.get("train", {}), "train"),
            stage=d.get("stage", DEFAULT_STAGE),
            parent=_build(ParentRef, parent, "parent") if parent else None,
            exit=_build(ExitConfig, d.get("exit", {}), "exit"),
            hole=_build(HoleConfig, d.get("hole", {}), "hole"),
            preset=d.get("preset", ""),
        )

    # ---- keys --------------------------------------------------------------------------
    def key_payload(self, *, seed: bool = True) -> dict[str, Any]:
        """Exactly what can change this stage's result: its stage, the keyed fields of
        model, task and train and of the sections its stage reads (local data files
        by their content: TextConfig.data_digest), and its parent's key (its group
        hash when the seed is left out)."""
        payload: dict[str, Any] = {
            "stage": self.stage,
            "model": key_values(self.model),
            "task": key_values(self.task),
            "train": key_values(self.train),
        }
        data = getattr(self.task, "data_digest", None)  # only a text task reads files a user names
        if data is not None:  # local files: keyed by their content, not by where they lie
            payload["task"]["dataset"] = data
        for section in get_stage(self.stage).reads:
            payload[section] = key_values(getattr(self, section))
        if not seed:
            payload["train"].pop("seed")
        if self.parent is not None:
            payload["parent"] = self.parent.key if seed else self.parent.group
        return payload

    def key_fields(self) -> list[str]:
        """The dotted names of the config fields the stage key hashes (checkpoints record them)."""
        payload = self.key_payload()
        return sorted(
            f"{section}.{name}" if isinstance(values, dict) else section
            for section, values in payload.items()
            for name in (values if isinstance(values, dict) else [None])
        )

    def stage_key(self) -> str:
        """Names this stage by content (seed included): looplab.keys.digest of
        key_payload(). Its folder and MLflow runs derive from it (keys.stage_folder)."""
        return digest(self.key_payload())

    def config_hash(self) -> str:
        """stage_key without the seed, chained through the parents' config hashes: the
        seeds of one configuration share it (analysis aggregates seeds by it)."""
        return digest(self.key_payload(seed=False))

    def as_parent(self, checkpoint: str = "") -> ParentRef:
        """This stage as the parent of the next one, its stream consumed to the end of its steps."""
        return ParentRef(
            stage=self.stage,
            key=self.stage_key(),
            group=self.config_hash(),
            checkpoint=checkpoint,
            data_end=stream_end(self.train.data_start, self.train.steps, self.train.batch_size),
        )


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    for k in values:
        check(k in known, f"{prefix}.{k}", values[k], "one of " + ", ".join(sorted(known)))
    kwargs = dict(values)
    if cls is ModelConfig and isinstance(kwargs.get("attn_layer_idx"), list):
        kwargs["attn_layer_idx"] = tuple(kwargs["attn_layer_idx"])  # JSON's list; anything else ModelConfig refuses
    return cls(**kwargs)


SECTION_OF = {
    "ModelConfig": "model",
    "TrainConfig": "train",
    "ExitConfig": "exit",
    "HoleConfig": "hole",
    "ManoConfig": "task",
    "PhopConfig": "task",
    "TextConfig": "task",
}


def is_keyed(name: str) -> bool:
    """Whether a dotted override ("train.lr", "model.n_loops") names a keyed field.
    Unkeyed ones (cadence, device, micro-batching) never change what a run computes;
    every task field is keyed, and so are the stage and the parent."""
    section, _, attr = config_key(name).partition(".")
    cls = {"model": ModelConfig, "train": TrainConfig, "exit": ExitConfig, "hole": HoleConfig}.get(section)
    if cls is None:
        return section != "preset"
    return any(f.name == attr and f.metadata.get(KEY) for f in dataclasses.fields(cls))


def config_key(name: str) -> str:
    """A ConfigError's field as the dotted override key that sets it:
    'HoleConfig.hp' -> 'hole.hp'; 'train.lr' stays."""
    cls, _, field_name = name.partition(".")
    return f"{SECTION_OF[cls]}.{field_name}" if cls in SECTION_OF else name


def parse_value(text: str) -> Any:
    """Parse a command-line override value: JSON if it parses, else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(cfg: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """Return cfg with dotted overrides applied, e.g. {"model.n_loops": 1,
    "train.steps": 50}. A bare name is looked up in model, then train, then task;
    the bare names stage and parent (a ParentRef or None) set those. Changing
    task.kind resets the task to that kind's defaults first. The result is validated
    once, after every override is in."""
    d = cfg.to_dict()
    # Presets size the vocabulary to their task; keep it following the task when an
    # override changes the task's vocabulary (e.g. task.L) unless it is set itself.
    vocab_follows_task = cfg.model.vocab_size == cfg.task.vocab_size and not any(
        k in ("model.vocab_size", "vocab_size") for k in overrides
    )
    sections = ("model", "train", "task", "exit", "hole")
    original_arch = d["model"]["arch"]
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        if not section and name in ("stage", "parent"):
            d[name] = dataclasses.asdict(value) if isinstance(value, ParentRef) else value
            continue
        section = section or _section_of(d, key, name, sections)
        check(section in sections, "override section", section, " | ".join(sections))
        if section == "task" and name == "kind" and value != d["task"].get("kind"):
            check(value in TASK_KINDS, "task.kind", value, allowed_names(value, TASK_KINDS))
            d["task"] = {"kind": value}
            continue
        check(name in d[section], f"{section}.{name}", value, "one of " + ", ".join(sorted(d[section])))
        d[section][name] = value
        if section == "model" and name == "arch" and value != original_arch:
            _arch_defaults_follow(d["model"], value, overrides)
    if vocab_follows_task:
        task = _build(TASK_KINDS[d["task"].get("kind", "phop")], d["task"], "task")
        d["model"]["vocab_size"] = task.vocab_size
    if d["train"].get("init_from"):
        _follow_checkpoint(d, overrides)
    cfg = ExperimentConfig.from_dict(d)
    if cfg.train.init_from:  # the layers it names exist, before anything starts
        from looplab.retrofit import checkpoint_layers, select_layers

        select_layers(cfg.train.init_layers, cfg.model.n_layers, checkpoint_layers(cfg.train.init_from))
    return cfg


def _section_of(d: dict[str, Any], key: str, name: str, sections: tuple[str, ...]) -> str:
    """The section a bare override name belongs to: model, then train, then task, ..."""
    for candidate in sections:
        if name in d[candidate]:
            return candidate
    raise ConfigError(f"override {key!r} names no field of {', '.join(sections)}, stage or parent")


def _arch_defaults_follow(model: dict[str, Any], arch: str, overrides: dict[str, Any]) -> None:
    """Arch-dependent defaults follow a new arch unless the overrides set them."""
    given = {k.rpartition(".")[2] for k in overrides}
    if "d_intermediate" not in given:
        model["d_intermediate"] = None
    if "attn_layer_idx" not in given and arch != "hybrid":
        model["attn_layer_idx"] = ()


def _follow_checkpoint(d: dict[str, Any], overrides: dict[str, Any]) -> None:
    """train.init_from names a Hugging Face checkpoint: the model takes its shape (width,
    vocabulary, mixer sizes, norm epsilon, RoPE) from it, while N, R and the rest stay
    the preset's and the overrides'. An override that contradicts the checkpoint is
    refused rather than silently replaced."""
    from looplab.retrofit import checkpoint_model_fields

    init_from = d["train"]["init_from"]
    check(isinstance(init_from, str), "TrainConfig.init_from", init_from, '"" | hf:PATH')
    given = {k.rpartition(".")[2]: v for k, v in overrides.items() if k.rpartition(".")[0] in ("", "model")}
    for name, value in checkpoint_model_fields(init_from).items():
        if (
            name in given
            and name in d["model"]
            and given[name] != value
            and not (name == "attn_layer_idx" and tuple(given[name]) == tuple(value))
        ):
            raise invalid(
                f"ModelConfig.{name}",
                given[name],
                f"{value!r}, the checkpoint's in train.init_from="
                f"{init_from!r} (leave it unset: the checkpoint sets it)",
            )
        d["model"][name] = value
    task = _build(TASK_KINDS[d["task"].get("kind", "phop")], d["task"], "task")
    check(
        d["model"]["vocab_size"] >= task.vocab_size,
        "TrainConfig.init_from",
        init_from,
        f"a checkpoint whose vocabulary ({d['model']['vocab_size']}) holds the {task.kind} task's "
        f"({task.vocab_size} ids)",
    )
