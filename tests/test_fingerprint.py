"""What a protocol pins beyond its declaration (sweeps/fingerprint.py): each input that
decides a verdict, changed in turn, either moves the digest or names the run before
anything trains (a preset's content, a stage recipe, the data stream, a loss constant, a
norm's epsilon in the model code, a measure's definition, the torch version, the
machine), while the same code on the same machine departs from nothing; and this
checkout is the one v5 was declared on."""

from __future__ import annotations

import dataclasses

import pytest

from looplab.config import apply_overrides
from sweeps import fingerprint
from sweeps.paper_mini import sweeps_of
from sweeps.protocol import V5


@pytest.fixture(scope="module")
def sweeps():
    return list(sweeps_of(V5).values())


def configs(sweeps):
    """The sweeps' stage configs as the code builds them now (after any monkeypatch)."""
    return fingerprint.sweep_stage_configs(sweeps, V5.seeds[0])


@pytest.fixture(scope="module")
def small(sweeps):
    """p-hop's 1⊗1 pre-training, eager: the cheapest stage shape whose first steps the
    behaviour check compares."""
    shapes = dict(fingerprint.stage_shapes(configs(sweeps)))
    return apply_overrides(shapes["paper_mini_phop pretrain 1⊗1"], {"train.compile": "off"})


def test_the_checkout_is_the_one_v5_was_declared_on(sweeps):
    """The stages' resolved configs and what the claims code computes are v5's pins: a
    change to either after v5's seeds were used makes every later run exploratory (and
    fails here first). torch and the machine are checked where the run happens."""
    assert fingerprint.stages_digest(configs(sweeps)) == V5.pins.stages
    assert fingerprint.analysis_digest() == V5.pins.analysis
    assert set(V5.pins.behaviour) == {label for label, _ in fingerprint.stage_shapes(configs(sweeps))}


def test_the_same_code_departs_from_nothing(sweeps, monkeypatch):
    """Against v5's declared pins (committed values, not ones computed here), on its torch
    and machine class: nothing departs, so its runs can be the headline."""
    monkeypatch.setattr(fingerprint, "torch_version", lambda: V5.pins.torch)
    monkeypatch.setattr(fingerprint, "machine_class", lambda: V5.pins.machine)
    assert fingerprint.departures(V5.pins, sweeps, V5.seeds[0], behaviour_too=False) == []


def test_a_preset_or_a_recipe_or_the_data_stream_moves_the_stages_digest(sweeps, monkeypatch):
    import looplab.presets as presets
    import looplab.stages as stages

    before = fingerprint.stages_digest(configs(sweeps))
    base = presets.get_preset("debug")
    monkeypatch.setitem(
        presets.PRESETS,
        "debug",
        lambda: dataclasses.replace(base, model=dataclasses.replace(base.model, norm_eps=1e-6)),
    )
    assert fingerprint.stages_digest(configs(sweeps)) != before  # the preset's content, not its name
    monkeypatch.undo()
    assert fingerprint.stages_digest(configs(sweeps)) == before
    recipe = dataclasses.replace(stages.STAGES["chase"].recipe, lr=2e-4)
    monkeypatch.setitem(stages.STAGES, "chase", dataclasses.replace(stages.STAGES["chase"], recipe=recipe))
    assert fingerprint.stages_digest(configs(sweeps)) != before  # a stage recipe
    monkeypatch.undo()
    # where a continued stage's data starts is part of its resolved config
    resolved = fingerprint.resolved_stages(configs(sweeps))
    chase = next(c for c in resolved["paper_mini_lm"].values() if c[-1]["stage"] == "stage2" and len(c) == 4)
    assert [c["train"]["data_start"] for c in chase] == [0, 6400, 8000, 9600]


def test_a_departure_from_the_stages_is_named(sweeps):
    pins = fingerprint.current_pins(V5.pins, sweeps, V5.seeds[0], behaviour_too=False)
    moved = dataclasses.replace(pins, stages="000000000000")
    (line,) = fingerprint.departures(moved, sweeps, V5.seeds[0], behaviour_too=False)
    assert "the stages' resolved configs hash to" in line and "declared 000000000000" in line


def test_a_measure_definition_moves_the_analysis_digest(monkeypatch):
    import analysis.claims as claims

    before = fingerprint.analysis_digest()
    monkeypatch.setattr(claims, "TARGET_FRACTION", 0.6)  # "about half the loops" read elsewhere
    assert fingerprint.analysis_digest() != before
    monkeypatch.undo()
    c1 = dataclasses.replace(claims.CLAIMS["C1-LM"], test=claims.WELCH)
    monkeypatch.setitem(claims.CLAIMS, "C1-LM", c1)  # paired made Welch
    assert fingerprint.analysis_digest() != before


def test_the_torch_version_and_the_machine_are_named(sweeps, monkeypatch):
    pins = fingerprint.current_pins(V5.pins, sweeps, V5.seeds[0], behaviour_too=False)
    monkeypatch.setattr(fingerprint, "torch_version", lambda: "2.99.0")
    monkeypatch.setattr(fingerprint, "machine_class", lambda: "Another CPU · cpu AVX2")
    lines = fingerprint.departures(pins, sweeps, V5.seeds[0], behaviour_too=False)
    assert any("torch 2.99.0 is installed" in line for line in lines)
    assert any("this machine is 'Another CPU · cpu AVX2'" in line for line in lines)


def test_a_norms_epsilon_in_the_model_code_moves_the_first_steps(small, monkeypatch):
    """The behaviour check: the same code twice gives the same losses bit for bit; a
    norm's epsilon divided by ten inside the model's code (no config field moves) shifts
    them past the tolerance, and the run is named."""
    import torch.nn.functional as F

    import looplab.models.layers as layers

    label = "phop 1⊗1"
    declared = {label: fingerprint.behaviour(small)}
    assert fingerprint.behaviour(small) == declared[label]
    assert fingerprint.behaviour_departures(declared, {label: fingerprint.behaviour(small)}) == []

    def smaller_eps(self, x):
        return F.rms_norm(layers.upcast(x), (x.shape[-1],), layers.upcast(self.weight), self.eps / 10).to(x.dtype)

    monkeypatch.setattr(layers.RMSNorm, "forward", smaller_eps)
    (line,) = fingerprint.behaviour_departures(declared, {label: fingerprint.behaviour(small)})
    assert line.startswith("phop 1⊗1: its first steps' losses are") and "the code computes something else" in line


def test_a_loss_constant_moves_the_first_steps(small, monkeypatch):
    import looplab.stages as stages

    declared = {"x": fingerprint.behaviour(small)}
    loss, shows = stages._LOSSES["pretrain"]

    def scaled(*args):  # the same loss times a constant 1.001: a changed constant in a loss
        value, diag = loss(*args)
        return value * 1.001, diag

    monkeypatch.setitem(stages._LOSSES, "pretrain", (scaled, shows))
    assert fingerprint.behaviour_departures(declared, {"x": fingerprint.behaviour(small)})
    # a shape the protocol did not declare, or one it no longer has, is named too
    assert "is new" in fingerprint.behaviour_departures({}, declared)[0]
    assert "is gone" in fingerprint.behaviour_departures(declared, {})[0]
