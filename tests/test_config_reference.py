"""The options reference (looplab/config/reference.py, docs/options.md): the page is the
generator's output, every key it lists is one the real override path accepts, every
field of the config dataclasses is listed, and every one has a description."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

from looplab.config import TASK_KINDS, ConfigError, ExperimentConfig, apply_overrides, parse_value
from looplab.config import reference as ref
from looplab.presets import get_preset, stage_config

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "options.md"
# A base config of each task kind for the override path (the presets `looplab train` starts from).
PRESET_OF_KIND = {"mano": "mano-debug", "phop": "phop-debug", "text": "debug"}


def test_the_page_is_the_generators_output():
    assert PAGE.read_text() == ref.render_markdown(), (
        f"docs/options.md is stale: a config field or its comment changed; regenerate it: `{ref.REGENERATE}`"
    )


def test_the_module_writes_the_page_and_lists_a_prefix():
    page = subprocess.run(
        [sys.executable, "-m", "looplab.config.reference"], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert page.stdout == ref.render_markdown()
    listing = subprocess.run(
        [sys.executable, "-m", "looplab.config.reference", "train.lr"], capture_output=True, text=True, check=True
    )
    assert listing.stdout.startswith("train.lr=0.001  (float, keyed)\n    ")


def test_reading_the_reference_imports_no_torch():
    code = "import sys, looplab.config.reference as r; r.render_markdown(); r.describe(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- every listed key is an override ----------------------------------------------------


def _base(kind: str) -> ExperimentConfig:
    """The dataclass defaults with the task of `kind` (its own defaults), the model's
    vocabulary sized to it: the config every default in the reference belongs to."""
    task = TASK_KINDS[kind]()
    model = dataclasses.replace(ExperimentConfig().model, vocab_size=max(64, task.vocab_size))
    return ExperimentConfig(model=model, task=task)


def test_every_key_with_its_default_is_accepted_by_the_override_path():
    """Each option, its default written as the command line writes it, through the
    function `looplab train` uses (presets.stage_config, then apply_overrides) onto the
    defaults: it lands on its field, and the config is the defaults' (the listed
    default is the field's)."""
    for option in ref.options():
        base = _base(option.task_kind or "phop")
        cfg = stage_config(base, "pretrain", overrides={option.key: parse_value(option.default_text)})
        assert cfg.to_dict() == stage_config(base, "pretrain").to_dict(), option.key
        section, _, name = option.key.rpartition(".")
        got = getattr(getattr(cfg, section) if section else cfg, name)
        if option.key != "model.d_intermediate":  # None resolves to the architecture's width
            assert ref.override_text(got) == option.default_text, option.key


def test_every_key_is_accepted_on_a_real_preset():
    """Each option set to the value a preset of its task kind already holds: a key the
    override path routes to the field (one it did not know would fail)."""
    for option in ref.options():
        base = get_preset(PRESET_OF_KIND[option.task_kind or "phop"])
        section, _, name = option.key.rpartition(".")
        current = getattr(getattr(base, section) if section else base, name)
        cfg = stage_config(base, "pretrain", overrides={option.key: current})
        assert cfg.to_dict() == stage_config(base, "pretrain").to_dict(), option.key


def test_a_key_not_listed_is_refused():
    """The reference's keys are the override path's: a name beside them is refused,
    and preset (ExperimentConfig's one field that is no option) is too."""
    base = get_preset("phop-debug")
    for key in ("train.no_such_field", "model.lr", "preset", "nosection.x"):
        with pytest.raises(ConfigError):
            apply_overrides(base, {key: 1})


def _walk(cls: type, prefix: str, owner: str = "") -> set[tuple[str, str]]:
    """(task config's name or "", dotted name) of cls's fields, read with
    dataclasses.fields and the type hints alone: a field whose type is a dataclass, or a
    union of dataclasses only (the task, one per kind), is a section to walk into;
    anything else (ParentRef | None included) is one option."""
    out = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, type(int | None)) else (hint,)
        if all(isinstance(arm, type) and dataclasses.is_dataclass(arm) for arm in arms):
            for arm in arms:
                out |= _walk(arm, f"{prefix}{f.name}.", arm.__name__ if len(arms) > 1 else owner)
        else:
            out.add((owner, f"{prefix}{f.name}"))
    return out


def test_every_field_of_the_dataclasses_is_listed():
    """An independent walk of ExperimentConfig's dataclasses finds exactly the listed
    options, each task kind's fields under its kind, less preset (a note for readers,
    which no override sets), and none twice."""
    walked = _walk(ExperimentConfig, "") - {("", "preset")}
    listed = [(TASK_KINDS[o.task_kind].__name__ if o.task_kind else "", o.key) for o in ref.options()]
    assert set(listed) == walked
    assert len(listed) == len(walked)


def test_the_key_roles_follow_the_key_payload():
    """keyed options are in the stage key's payload, added ones only away from their
    default, the others never (on a stage that reads exit and hole, its stream
    continuing its parent's: train.data_start away from its default)."""
    parent = stage_config(_base("phop"), "pretrain").as_parent("ckpt")
    cfg = stage_config(_base("phop"), "chase", parent=parent)
    fields = set(cfg.key_fields())
    for option in ref.options():
        if option.section == "task" and option.task_kind != "phop":
            continue
        section, _, name = option.key.rpartition(".")
        value = getattr(getattr(cfg, section) if section else cfg, name)
        expected = option.key_role == "keyed" or (option.key_role == "added" and value != option.default)
        assert (option.key in fields) == expected, option.key
    assert {o.key_role for o in ref.options()} == set(ref.KEY_ROLES)


# ---- every field has a description ------------------------------------------------------


def test_every_option_has_a_description():
    assert ref.undocumented() == [], "write a comment beside or above each of these fields"


@dataclass(frozen=True)
class _Demo:
    beside: int = 1  # said beside it
    # said above it,
    # over two lines
    above: int = 2
    # a header for what follows

    bare: int = 3
    both: int = 4  # the trailing comment wins


def test_descriptions_are_read_from_the_comments_and_a_bare_field_is_named():
    described = ref.field_descriptions(_Demo)
    assert described == {
        "beside": "said beside it",
        "above": "said above it, over two lines",
        "bare": "",
        "both": "the trailing comment wins",
    }
    with pytest.raises(
        ref.UndocumentedField, match=r"_Demo\.bare \(demo\.bare\).*python -m looplab\.config\.reference"
    ):
        ref.check_documented(ref.options_of(_Demo, "demo"))


def test_describe_lists_a_prefix_and_refuses_an_unknown_one():
    text = ref.describe("hole.")
    assert text.count("\n    ") == len([o for o in ref.options() if o.key.startswith("hole.")])
    assert "hole.rounding=stochastic  (stochastic | nearest | floor | ceil, keyed)" in text
    assert "task.n=256  (int, keyed, task.kind=phop)" in ref.describe("task.n")
    assert "train.device=auto  (auto | cpu | cuda, not keyed)" in ref.describe("train.device")
    with pytest.raises(ConfigError, match="prefix='nope' is invalid"):
        ref.describe("nope")


def test_the_command_lists_the_fields_of_the_prefix():
    """`looplab options exit. train.lr` prints ExitConfig's fields (an independent walk of
    the dataclass) and train.lr, each once, with the dataclass default."""
    from looplab.config import ExitConfig, TrainConfig

    done = subprocess.run(
        [sys.executable, "-m", "looplab.cli", "options", "exit.", "train.lr"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    heads = [line.split("  (")[0] for line in done.stdout.splitlines() if not line.startswith(" ")]
    expected = [f"exit.{f.name}={getattr(ExitConfig(), f.name)!r}" for f in dataclasses.fields(ExitConfig)]
    assert heads == [*expected, f"train.lr={TrainConfig().lr!r}"]
