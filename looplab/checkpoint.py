"""Checkpoints: safetensors weights + a JSON config, never pickle.

A model directory holds `model.safetensors` and `config.json`:
    {"format": "looplab/1", "model": {...ModelConfig...}, "metadata": {...}}
where metadata carries what a reader needs beyond the architecture (the experiment
config it was trained under, its keys and the fields they hash, its stage and
lineage, the tokenizer). A training checkpoint adds `optimizer.safetensors` and
`trainer.json` (step and counters) beside them.

Training checkpoints are replaced atomically and only the newest is kept: the new
one is written complete into `<dir>.next` (trainer.json last), then swapped in
(`<dir>` → `<dir>.prev`, `<dir>.next` → `<dir>`, `<dir>.prev` removed); a crash in
between is settled on the next load (`settle_checkpoint`). Every reader checks a
checkpoint before use (`verify_checkpoint`): files present and complete, config
matching the weights' shapes, and trainer.json agreeing with the weights and config
beside it (`training_state`); a damaged one is a one-line error naming the file and
the way out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import torch

from looplab.config import ConfigError, ModelConfig, ParentRef, apply_overrides, stream_end
from looplab.fields import is_int
from looplab.keys import KEY_LENGTH, SHA256, file_digest, keyed_name, text_digest
from looplab.models.looped import LoopedLM
from looplab.stages import DEFAULT_STAGE, method_of

WEIGHTS_DIGEST = "weights_sha256"  # config.json and trainer.json: the digest of model.safetensors as saved
PARENT_WEIGHTS = "parent_weights_sha256"  # trainer.json and metadata of a continued stage: the weights it started from
WEIGHT_DTYPES = ("F32", "BF16", "F16", "F64")  # what a checkpoint's tensors may hold
FORMAT = "looplab/1"
WEIGHTS, CONFIG = "model.safetensors", "config.json"


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)  # atomic: a crash never leaves half a config


def save_tensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict | None = None) -> None:
    """safetensors' save_file, leaving the file with the mode open() gives any other file
    here: safetensors (0.8) creates it 0600 whatever the umask, so a checkpoint's weights
    were unreadable to the group that reads its config.json."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    # os.umask sets while it reads: set it back at once (Linux also shows it in
    # /proc/self/status, which leaves it alone).
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_model(model: LoopedLM, directory: str | os.PathLike) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_tensors(state, d / (WEIGHTS + ".tmp"), metadata={"format": FORMAT})
    digest = file_digest(d / (WEIGHTS + ".tmp"))
    os.replace(d / (WEIGHTS + ".tmp"), d / WEIGHTS)
    _write_json(
        d / CONFIG,
        {"format": FORMAT, "model": _model_dict(model.cfg), "metadata": model.metadata, WEIGHTS_DIGEST: digest},
    )
    return d


def _model_dict(cfg: ModelConfig) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["attn_layer_idx"] = list(d["attn_layer_idx"])
    return d


def is_checkpoint(path: str | os.PathLike) -> bool:
    p = Path(path)
    return (p / CONFIG).is_file() and (p / WEIGHTS).is_file()


# ---- checking before use ------------------------------------------------------------


def safetensors_header(path: Path, recover: str = "") -> dict[str, Any]:
    """The tensor table of a safetensors file ({name: {dtype, shape, data_offsets}}),
    after checking the file holds every byte the table promises. ConfigError when the
    file is truncated or not safetensors (`recover` says the way out)."""
    size = path.stat().st_size
    tail = f"; {recover}" if recover else ""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ConfigError(f"{path} is damaged: {size} bytes, not a safetensors file{tail}")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ConfigError(f"{path} is damaged: truncated inside its header ({size} bytes){tail}")
        try:
            table = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path} is damaged: its header is not JSON ({e}){tail}") from None
    if not isinstance(table, dict):
        raise ConfigError(f"{path} is damaged: its header is not a table of tensors{tail}")
    table.pop("__metadata__", None)
    for name, t in table.items():  # each entry: a dtype, a shape and two byte offsets in order
        ok = (
            isinstance(t, dict)
            and isinstance(t.get("dtype"), str)
            and isinstance(t.get("shape"), list)
            and all(isinstance(d, int) and d >= 0 for d in t["shape"])
            and isinstance(t.get("data_offsets"), list)
            and len(t["data_offsets"]) == 2
            and all(isinstance(o, int) for o in t["data_offsets"])
            and 0 <= t["data_offsets"][0] <= t["data_offsets"][1]
        )
        if not ok:
            raise ConfigError(f"{path} is damaged: its header's entry {name!r} is malformed{tail}")
    need = 8 + n + max((t["data_offsets"][1] for t in table.values()), default=0)
    if size < need:
        raise ConfigError(f"{path} is damaged: truncated ({size:,} of {need:,} bytes){tail}")
    return table


def verify_checkpoint(
    directory: str | os.PathLike,
    *,
    training: bool = False,
    argument: str = "checkpoint",
    recover: str = "restore it, or train it again",
) -> None:
    """Check a checkpoint before anything uses it: its files are present and complete,
    config.json parses, and the weights have exactly the shapes config.json's model
    has (and, with training, the optimizer state and trainer.json are whole). Every
    problem is a one-line ConfigError naming the file (or `argument`, the flag that
    named the directory) and `recover`, the way out."""
    d = Path(directory)
    if not d.is_dir():
        raise ConfigError(
            f"{argument}={str(directory)!r} is invalid; allowed: a looplab checkpoint directory "
            f"(with {CONFIG} and {WEIGHTS})",
            name=argument,
            value=str(directory),
        )
    needed = [CONFIG, WEIGHTS] + ([OPTIMIZER, TRAINER] if training else [])
    for name in needed:
        if not (d / name).is_file():
            raise ConfigError(f"{d / name} is missing: not a complete looplab checkpoint; {recover}")
    try:
        model_cfg = read_model_config(d)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{d / CONFIG} is damaged ({str(e).splitlines()[0]}); {recover}") from None
    table = safetensors_header(d / WEIGHTS, recover)
    odd = next(((k, v.get("dtype")) for k, v in table.items() if v.get("dtype") not in WEIGHT_DTYPES), None)
    if odd is not None:
        raise ConfigError(
            f"{d / WEIGHTS} is damaged: {odd[0]} is {odd[1]}, not a float tensor "
            f"({' | '.join(WEIGHT_DTYPES)}); {recover}"
        )
    layers = {k.split(".")[2] for k in table if k.startswith("backbone.layers.")}
    if len(layers) != model_cfg.n_layers:  # before building anything of n_layers' size
        raise ConfigError(
            f"{d / WEIGHTS} disagrees with {d / CONFIG}: {len(layers)} backbone layers in the "
            f"weights, n_layers={model_cfg.n_layers} by the config; {recover}"
        )
    recorded = read_config(d).get(WEIGHTS_DIGEST)
    if recorded is not None and file_digest(d / WEIGHTS) != recorded:
        raise ConfigError(
            f"{d / WEIGHTS} is damaged: its bytes are not the ones saved ({CONFIG} records "
            f"{recorded[:19]}...); {recover}"
        )
    with torch.device("meta"):
        expected = {k: list(v.shape) for k, v in LoopedLM(model_cfg).state_dict().items()}
    found = {k: v["shape"] for k, v in table.items()}
    if found != expected:
        differ = sorted(k for k in expected.keys() & found.keys() if expected[k] != found[k])
        detail = (
            f"{differ[0]} is {found[differ[0]]} in {WEIGHTS}, {expected[differ[0]]} by {CONFIG}"
            if differ
            else f"tensors {sorted(expected.keys() ^ found.keys())[:3]} are in one file only"
        )
        raise ConfigError(f"{d / WEIGHTS} disagrees with {d / CONFIG}: {detail}; {recover}")
    if training:
        safetensors_header(d / OPTIMIZER, recover)
        training_state(d, recover)


def weights_digest(directory: str | os.PathLike) -> str:
    """The digest of a checkpoint's weights: the one its config.json records (which
    verify_checkpoint checks against the bytes), or, for a checkpoint from before
    config.json recorded it, computed."""
    d = Path(directory)
    return read_config(d).get(WEIGHTS_DIGEST) or file_digest(d / WEIGHTS)


def training_state(directory: str | os.PathLike, recover: str = "restore it, or train it again") -> dict | None:
    """A checkpoint's trainer.json (None when it has none), refused in one line when it
    contradicts what lies beside it: a step that is no count or beyond the run's
    train.steps, weights other than the ones it was saved with (their digest, which
    save_training_state records), or another stage key than config.json's. Which
    file is right cannot be told, so none is used: a resumed run, or a child keyed on
    a finished parent, would silently continue from weights of another step."""
    d = Path(directory)
    if not (d / TRAINER).is_file():
        return None
    try:
        state = json.loads((d / TRAINER).read_text())
        step = state["step"]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{d / TRAINER} is damaged ({str(e).splitlines()[0]}); {recover}") from None
    if not is_int(step) or step < 0:
        raise ConfigError(f"{d / TRAINER} is damaged (step={step!r} is not a count of steps); {recover}")
    meta = read_config(d).get("metadata", {})
    steps = meta.get("experiment", {}).get("train", {}).get("steps")
    if is_int(steps) and step > steps:
        raise ConfigError(f"{d / TRAINER} claims step {step} of a run of train.steps={steps} ({d / CONFIG}); {recover}")
    if state.get("stage_key") and meta.get("stage_key") and state["stage_key"] != meta["stage_key"]:
        raise ConfigError(
            f"{d / TRAINER} disagrees with {d / CONFIG}: stage key {state['stage_key']!r} in one, "
            f"{meta['stage_key']!r} in the other; {recover}"
        )
    saved, weights = state.get(WEIGHTS_DIGEST), weights_digest(d)
    if saved is not None and saved != weights:
        raise ConfigError(
            f"{d / TRAINER} disagrees with {d / WEIGHTS}: step {step} was saved with weights "
            f"{str(saved)[:19]}..., these are {weights[:19]}... (weights of another step or run); "
            f"{recover}"
        )
    return state


def read_config(directory: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's config.json, its shape checked: every reader indexes into it, so a
    hand-edited or damaged value is one line here, not a TypeError wherever it is read."""
    path = Path(directory) / CONFIG
    blob = json.loads(path.read_text())
    if not isinstance(blob, dict):
        raise ConfigError(f"{path} is damaged: a JSON {type(blob).__name__}, not an object")
    if blob.get("format") != FORMAT:
        raise ConfigError(f"checkpoint format={blob.get('format')!r} in {directory} is unknown; allowed: {FORMAT}")
    for key, kind in (("model", dict), ("metadata", dict), (WEIGHTS_DIGEST, str)):
        if key in blob and not isinstance(blob[key], kind) or key == "model" and key not in blob:
            raise ConfigError(
                f"{path} is damaged: {key}={blob.get(key)!r}, not a JSON {'object' if kind is dict else 'string'}"
            )
    digest = blob.get(WEIGHTS_DIGEST)
    if digest is not None and not digest.startswith(SHA256):
        raise ConfigError(f"{path} is damaged: {WEIGHTS_DIGEST}={digest!r}, not {SHA256}<hex>")
    return blob


def read_model_config(directory: str | os.PathLike) -> ModelConfig:
    """The architecture a checkpoint's weights belong to."""
    model_cfg = dict(read_config(directory)["model"])
    model_cfg["attn_layer_idx"] = tuple(model_cfg.get("attn_layer_idx", ()))
    return ModelConfig(**model_cfg)


def parent_ref(directory: str | os.PathLike) -> ParentRef:
    """A checkpoint as the parent of a continued stage, named by what it holds: the
    stage key and config hash its training recorded when its trainer.json says which
    step its weights are of (a step before the end enters the key); otherwise (weights
    without their trainer.json, copied or made by hand) by the digest of the weights,
    so that they are never taken for a finished stage and other weights at the same
    path are another parent. A path that holds no checkpoint is named by its digest.
    data_end: where the parent's training stream stopped (its data_start + the step its
    trainer.json says × its batch size, so a parent stopped early counts the steps it
    ran); 0 where its step or its recorded config is unknown."""
    path = Path(directory).expanduser().resolve()
    if not is_checkpoint(path):
        digest = keyed_name("path", text_digest(str(path)))
        return ParentRef(stage=DEFAULT_STAGE, key=digest, group=digest, checkpoint=str(path))
    meta = read_config(path).get("metadata", {})
    state = training_state(path, recover="pass the checkpoint folder its training wrote, or train the parent again")
    if state is not None and meta.get("stage_key") and meta.get("config_hash"):
        # A parent stopped before its last step (--stop-at) is another model than the
        # finished one: its step enters the key. A finished parent keeps its own key.
        train = meta.get("experiment", {}).get("train", {})
        steps = train.get("steps")
        stopped = f"@step{state['step']}" if steps is not None and state["step"] < steps else ""
        return ParentRef(
            stage=meta.get("stage", DEFAULT_STAGE),
            key=meta["stage_key"] + stopped,
            group=meta["config_hash"] + stopped,
            checkpoint=str(path),
            data_end=_data_end(train, state["step"]),
        )
    digest = keyed_name(WEIGHTS_KEY, weights_digest(path).removeprefix(SHA256)[:KEY_LENGTH])
    return ParentRef(stage=meta.get("stage", DEFAULT_STAGE), key=digest, group=digest, checkpoint=str(path))


def _data_end(train: dict[str, Any], step: int) -> int:
    """The samples of its training stream a checkpoint's run consumed by `step`, from its
    recorded train section (a checkpoint from before data_start existed started at 0);
    0 when the section does not say its batch size."""
    start, batch_size = train.get("data_start", 0), train.get("batch_size", 0)
    if is_int(start) and start >= 0 and is_int(batch_size) and batch_size >= 1:
        return stream_end(start, step, batch_size)
    return 0


WEIGHTS_KEY = "weights"  # parent_ref's name of weights whose step is unknown: weights-<digest>


def describe_parent(ref: ParentRef) -> str:
    """What a parent's key says it is, for a refusal."""
    if ref.key.startswith(WEIGHTS_KEY + "-"):
        return f"weights without a {TRAINER} (the step they were saved at is unknown)"
    if "@step" in ref.key:
        return f"a parent stopped at step {ref.key.rpartition('@step')[2]} (key {ref.key})"
    return f"the parent of key {ref.key}"


def load_weights(model: LoopedLM, directory: str | os.PathLike) -> None:
    """Load the weights, refusing non-finite ones (a run that diverged before this
    version wrote such checkpoints; looplab/training/train.py no longer does)."""
    from safetensors.torch import load_file

    state = load_file(str(Path(directory) / WEIGHTS))
    bad = next((k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())), None)
    if bad is not None:
        raise ConfigError(
            f"{Path(directory) / WEIGHTS} holds non-finite weights ({bad}): the run that wrote it "
            "diverged; allowed: a checkpoint of finite weights (train it again with a lower train.lr)"
        )
    model.load_state_dict(state)


@contextlib.contextmanager
def seeded(seed: int):
    """Deterministic initialisation without disturbing the caller's RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def model_from_config(cfg: ModelConfig, seed: int = 0) -> LoopedLM:
    with seeded(seed):
        return LoopedLM(cfg)


def load_model(name_or_path: str | os.PathLike, **overrides: Any) -> LoopedLM:
    """A LoopedLM from a checkpoint directory (overrides are not allowed there: the
    weights fix the architecture), or fresh from a preset name with model-field
    overrides plus `seed` for the initialisation."""
    if is_checkpoint(name_or_path):
        if overrides:
            raise ConfigError(
                f"overrides {sorted(overrides)} cannot change a checkpoint's architecture; "
                "load it as is, or start from a preset name"
            )
        verify_checkpoint(name_or_path)
        model = LoopedLM(read_model_config(name_or_path))
        load_weights(model, name_or_path)
        model.metadata = read_config(name_or_path).get("metadata", {})
        return model

    if Path(str(name_or_path)).exists():
        raise ConfigError(f"path {str(name_or_path)!r} is not a looplab checkpoint (needs {CONFIG} and {WEIGHTS})")
    from looplab.presets import get_preset

    exp = get_preset(str(name_or_path))
    seed = overrides.pop("seed", exp.train.seed)
    exp = apply_overrides(exp, {f"model.{k}": v for k, v in overrides.items()})
    model = model_from_config(exp.model, seed)
    model.metadata = experiment_metadata(exp)
    return model


def experiment_task(model):
    """The task of the experiment a model's checkpoint records (experiment_metadata), for
    its held-out text or prompts; None for a model without one (a bare preset's)."""
    from looplab.config import ExperimentConfig
    from looplab.tasks import make_task

    experiment = model.metadata.get("experiment")
    cfg = ExperimentConfig.from_dict(experiment) if experiment else None
    return make_task(cfg.task, cfg.train.seq_len) if cfg is not None else None


def experiment_metadata(cfg) -> dict[str, Any]:
    """What a checkpoint of an ExperimentConfig records beside its weights: the config,
    its keys and the fields they hash, its stage and lineage, and, for text, the
    tokenizer that reads its ids (lm-eval and generation need it)."""
    lineage = _parent_lineage(cfg) + [cfg.stage]
    meta = {
        "experiment": cfg.to_dict(),
        "task": cfg.task.kind,
        "stage": cfg.stage,
        "stage_key": cfg.stage_key(),
        "config_hash": cfg.config_hash(),
        "key_fields": cfg.key_fields(),
        "lineage": lineage,
        "method": method_of(lineage),
        "parent_checkpoint": cfg.init_from,
    }
    if cfg.task.kind == "text":
        meta["tokenizer"] = cfg.task.tokenizer
    return meta


def _parent_lineage(cfg) -> list[str]:
    if cfg.parent is None:
        return []
    if cfg.parent.checkpoint and is_checkpoint(cfg.parent.checkpoint):
        lineage = read_config(cfg.parent.checkpoint).get("metadata", {}).get("lineage")
        if lineage:
            return list(lineage)
    return [cfg.parent.stage]


# ---- training state --------------------------------------------------------------
OPTIMIZER, TRAINER = "optimizer.safetensors", "trainer.json"


def save_training_state(
    directory: Path, model: LoopedLM, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any]
) -> None:
    """Model + AdamW moments (keyed by parameter name) + trainer counters, replacing
    the checkpoint in `directory` atomically (module docstring)."""
    directory = Path(directory)
    staging = _sibling(directory, "next")
    if staging.exists():
        shutil.rmtree(staging)
    save_model(model, staging)
    # trainer.json names the weights it was saved with: weights of another step or run
    # put beside it are refused (training_state), not resumed from or taken as finished.
    trainer_state = {**trainer_state, WEIGHTS_DIGEST: read_config(staging)[WEIGHTS_DIGEST]}
    names = {id(p): n for n, p in model.named_parameters()}
    tensors = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                tensors[f"{names[id(p)]}::{key}"] = torch.as_tensor(value).detach().contiguous().cpu()
    save_tensors(tensors, staging / OPTIMIZER)
    _write_json(staging / TRAINER, trainer_state)  # written last: its presence marks a complete checkpoint
    previous = _sibling(directory, "prev")
    if previous.exists():
        shutil.rmtree(previous)
    if directory.exists():
        os.replace(directory, previous)
    os.replace(staging, directory)
    shutil.rmtree(previous, ignore_errors=True)  # only the newest is kept


def _sibling(directory: Path, suffix: str) -> Path:
    return directory.with_name(f"{directory.name}.{suffix}")


def settle_checkpoint(directory: str | os.PathLike) -> None:
    """Finish what a crash during save_training_state left: the complete one of
    <dir>, <dir>.next (a finished write not yet swapped in) and <dir>.prev (swapped
    out, the new one not yet in) becomes <dir>; the others are removed."""
    directory = Path(directory)
    complete = lambda d: (d / TRAINER).is_file()  # noqa: E731 - trainer.json is written last
    staging, previous = _sibling(directory, "next"), _sibling(directory, "prev")
    if not complete(directory):
        for candidate in (staging, previous):  # the newest complete one wins
            if complete(candidate):
                if directory.exists():
                    shutil.rmtree(directory)
                os.replace(candidate, directory)
                break
    for leftover in (staging, previous):
        if leftover.exists():
            shutil.rmtree(leftover)


ADAM_STATE = ("exp_avg", "exp_avg_sq", "step")  # what AdamW keeps per parameter


def load_training_state(
    directory: Path, model: LoopedLM, optimizer: torch.optim.Optimizer, recover: str = "restore it, or train it again"
) -> dict[str, Any]:
    """Weights, AdamW moments and trainer.json of a checkpoint into model and optimizer.
    Every moment is checked first: a parameter this optimizer trains, its shape, finite
    values; anything else is a damaged file, said in one line (a wrong shape would
    fail inside the optimizer's step, a NaN moment would look like a divergence)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    state = training_state(directory, recover)
    if state is None:  # weights without their counters: no checkpoint to resume from
        raise ConfigError(f"{directory / TRAINER} is missing: {directory} is no training checkpoint; {recover}")
    load_weights(model, directory)
    saved = load_file(str(directory / OPTIMIZER))
    names = {id(p): n for n, p in model.named_parameters()}
    trained = {names[id(p)]: p for group in optimizer.param_groups for p in group["params"]}
    where = directory / OPTIMIZER
    for key, value in saved.items():
        name, _, field = key.rpartition("::")
        p = trained.get(name)
        if p is None or field not in ADAM_STATE:
            raise ConfigError(f"{where} is damaged: {key} is no moment of a parameter this stage trains; {recover}")
        shape = [] if field == "step" else list(p.shape)
        if list(value.shape) != shape or not value.is_floating_point():
            raise ConfigError(
                f"{where} is damaged: {key} is a {value.dtype} tensor of shape {list(value.shape)}, "
                f"not a float tensor of its parameter's shape {shape}; {recover}"
            )
        if not bool(torch.isfinite(value).all()):
            raise ConfigError(
                f"{where} is damaged: {key} holds non-finite values, which no step can continue from; {recover}"
            )
    # AdamW's loop keeps its step counts on the CPU, its fused kernel beside the
    # parameters: a checkpoint resumes under either (train.compile is no key).
    steps_on_device = bool(optimizer.defaults.get("fused"))
    for key, value in saved.items():
        name, _, field = key.rpartition("::")
        p = trained[name]
        optimizer.state[p][field] = value.to(p.device) if field != "step" or steps_on_device else value
    return state
