"""Stopping on the user's request: train() checkpoints and returns when asked, and a
second call resumes there; the sweep driver's first signal asks, the second exits; a
run the user stopped ends KILLED with the reason. (A whole sweep stopped by Ctrl-C and
resumed: tests/test_platform.py, slow tier.)"""

from __future__ import annotations

import json
import os
import signal

import pytest

from looplab.checkpoint import TRAINER
from looplab.config import ExperimentConfig
from looplab.errors import Interrupted
from looplab.presets import get_preset
from looplab.training.run_folder import CHECKPOINT_DIR, METRICS_FILE
from looplab.training.train import train

TINY = {"steps": 8, "batch_size": 4, "eval_every": 0, "log_every": 1}


def _cfg() -> ExperimentConfig:
    cfg = get_preset("phop-debug")
    return ExperimentConfig.from_dict({**cfg.to_dict(), "train": {**cfg.to_dict()["train"], **TINY}})


def test_train_stops_when_asked_and_a_second_call_resumes_there(tmp_path):
    cfg = _cfg()
    asked = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) >= 3  # asked after steps 1, 2, 3: stop after step 3

    first = train(cfg, tmp_path, should_stop=should_stop, quiet=True)
    assert first.stopped and first.step == 3 and len(first.losses) == 3
    assert json.loads((tmp_path / CHECKPOINT_DIR / TRAINER).read_text())["step"] == 3
    second = train(cfg, tmp_path, quiet=True)
    assert not second.stopped and second.step == 8 and len(second.losses) == 5  # steps 4..8 only
    records = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 9))  # each step once
    # the same 8 steps uninterrupted give the same losses (the stop changed nothing it resumed)
    whole = train(cfg, tmp_path / "whole", quiet=True)
    assert first.losses + second.losses == pytest.approx(whole.losses, rel=1e-6)


def test_the_last_step_is_never_a_stop(tmp_path):
    result = train(_cfg(), tmp_path, should_stop=lambda: True, stop_at=1, quiet=True)
    assert not result.stopped and result.step == 1  # stop_at ended it, not the request


def test_first_signal_asks_the_second_exits(capsys):
    from sweeps.stop import StopOnSignal, SweepStopped

    before = signal.getsignal(signal.SIGINT)
    asked = []
    with pytest.raises(KeyboardInterrupt):
        with StopOnSignal(asked.append) as stop:
            assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1"  # Tune's own handler would end trials unsaved
            stop.check()  # no signal yet: nothing happens
            os.kill(os.getpid(), signal.SIGTERM)
            assert asked == ["SIGTERM"] and stop.reason == "SIGTERM"
            with pytest.raises(SweepStopped) as stopped:
                stop.check()
            assert stopped.value.exit_status == 128 + signal.SIGTERM and isinstance(stopped.value, Interrupted)
            os.kill(os.getpid(), signal.SIGINT)  # the second: at once
    assert asked == ["SIGTERM"]  # asked once
    assert signal.getsignal(signal.SIGINT) is before and "TUNE_DISABLE_SIGINT_HANDLER" not in os.environ
    assert "SIGTERM: stopping the sweep" in capsys.readouterr().err


def test_a_stopped_run_ends_killed_with_its_reason(tmp_path):
    pytest.importorskip("mlflow")
    from looplab import tracking

    mc = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = tracking.ensure_experiment(mc, "stop", str(tmp_path / "artifacts"))
    run, _ = tracking.open_run(mc, exp, name="r", tags={}, key={"k": "1"})
    with pytest.raises(Interrupted):
        with tracking.terminated_on_exit(mc, run):
            raise Interrupted("pretrain stopped at step 3/8 (SIGINT)")
    got = mc.get_run(run)
    assert got.info.status == "KILLED"
    assert got.data.tags[tracking.KILLED_BY] == "pretrain stopped at step 3/8 (SIGINT)"
