"""Config fields named by code (looplab/config/paths.py): the key a lambda selects is
the override that sets that very attribute, and a key that names no field is refused."""

from __future__ import annotations

import pytest

from looplab.config import ConfigError, apply_overrides
from looplab.config.paths import checked_key, field_key
from looplab.presets import get_preset


@pytest.mark.parametrize(
    ("select", "value"),
    [
        (lambda c: c.exit.beta, 0.37),
        (lambda c: c.model.n_loops, 3),
        (lambda c: c.train.lr, 0.0025),
        (lambda c: c.hole.rho, 0.3),
    ],
)
def test_the_selected_key_overrides_the_selected_field(select, value):
    cfg = get_preset("debug")
    assert select(cfg) != value
    key = field_key(select)
    assert select(apply_overrides(cfg, {key: value})) == value


def test_a_task_field_of_any_kind_and_only_fields_are_keys():
    assert checked_key("task.L") == "task.L"  # Mano's, whatever the preset's task
    assert checked_key("task.alphabet") == "task.alphabet"  # p-hop's
    for bad, said in (
        ("exit.betta", "a field of exit, one of beta"),
        ("beta", "SECTION.FIELD"),
        ("parent.key", "SECTION one of"),
    ):
        with pytest.raises(ConfigError, match=said):
            checked_key(bad)


def test_a_lambda_must_read_one_field_of_one_section():
    with pytest.raises(ConfigError, match="one section's field"):
        field_key(lambda c: c.exit)
