"""What the commands check and build from their arguments before their work: a
checkpoint that is whole, a preset's experiment with the command line's overrides,
the model and task of --checkpoint or --preset, every place a command writes to."""

from __future__ import annotations

from looplab.config import ConfigError, parse_value


def compile_decoding(model, setting: str):
    """The model with --compile's decoding (looplab/models/compiled.py) attached."""
    from looplab.models.compiled import compile_decoding

    return compile_decoding(model, setting != "off", cuda_graphs=setting == "cuda-graphs")


def check_checkpoint(path: str, argument: str = "--checkpoint") -> None:
    """A whole checkpoint at `path`, or an error naming the flag that gave it."""
    from looplab.checkpoint import verify_checkpoint

    verify_checkpoint(path, argument=argument, recover=f"pass another {argument}, or train it again")


def parse_overrides(pairs: list[str]) -> dict:
    """The command line's KEY=VALUE overrides as a dict of parsed values."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {pair!r} is invalid; allowed: KEY=VALUE, e.g. model.n_loops=2")
        out[key] = parse_value(value)
    return out


def experiment_config(args):
    """The preset as the asked-for stage: its recipe (looplab/stages.py), then the
    command line's overrides; a continued stage names its parent by the key the
    --init checkpoint recorded."""
    from looplab.checkpoint import parent_ref, verify_checkpoint
    from looplab.config import config_key
    from looplab.presets import get_preset, stage_config
    from looplab.stages import get_stage

    try:
        cfg = get_preset(args.preset)
    except ConfigError as e:
        raise e.renamed("--preset", args.preset) from None
    stage = getattr(args, "stage", None) or "pretrain"
    init = getattr(args, "init", None)
    if get_stage(stage).continues and not init:
        raise ConfigError(f"--stage {stage} needs --init CHECKPOINT (the parent stage it continues)")
    if init and not get_stage(stage).continues:
        raise ConfigError("--init applies to continued stages; allowed: --stage stage1 | chase | stage2")
    if init:
        verify_checkpoint(init, argument="--init", recover="pass the checkpoint of a trained parent stage")
    overrides = parse_overrides(getattr(args, "overrides", []))
    try:
        return stage_config(cfg, stage, parent=parent_ref(init) if init else None, overrides=overrides)
    except ConfigError as e:  # said as the override that set the value
        key = config_key(e.name) if e.name else None
        given = next((k for k in overrides if key in (k, f"{key.partition('.')[0]}.{k}")), None) if key else None
        raise (e.renamed("override", f"{given}={overrides[given]}") if given else e) from None


def model_and_task(args):
    """The model of --checkpoint or --preset (with overrides) and its task (None for
    a bare preset's model without an experiment)."""
    check_model_source(args)
    model = load_source_model(args)
    from looplab.checkpoint import experiment_task

    return model, experiment_task(model)


def check_model_source(args) -> None:
    """Exactly one of --checkpoint (a whole checkpoint) or --preset (a known preset):
    checked before anything loads."""
    from looplab.presets import get_preset

    if bool(args.checkpoint) == bool(args.preset):
        raise ConfigError(f"{args.command} needs exactly one of --checkpoint PATH or --preset NAME")
    if args.checkpoint:
        check_checkpoint(args.checkpoint)
    else:
        try:
            get_preset(args.preset)
        except ConfigError as e:
            raise e.renamed("--preset", args.preset) from None


def load_source_model(args):
    """The model of --checkpoint, or of --preset with the command line's overrides."""
    from looplab.checkpoint import load_model

    overrides = {} if args.checkpoint else parse_overrides(args.overrides)  # a checkpoint fixes the model
    return load_model(args.checkpoint or args.preset, **overrides)


def check_destinations(args) -> None:
    """Every place a command writes to, and its device, checked before its work."""
    from looplab import destinations

    for flag in ("json", "output", "markdown"):  # None: not given ("" is refused: it is no file)
        value = getattr(args, flag, None)
        if isinstance(value, str):
            destinations.output_file(f"--{flag}", value)
    if getattr(args, "out", None) is not None:
        destinations.output_dir("--out", args.out)
    if getattr(args, "tracking_uri", None) is not None:
        destinations.tracking_uri("--tracking-uri", args.tracking_uri)
    if getattr(args, "device", None):
        destinations.device("--device", args.device)
