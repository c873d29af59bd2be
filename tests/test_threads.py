"""Threads are chosen from the CPUs a process was given (looplab/threads.py), never
torch's default of every core: asked for, else the free cores within the allocation."""

import pytest
import torch

from looplab import threads
from looplab.cli import main


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def four_cpus(monkeypatch):
    monkeypatch.setattr(threads, "usable_cpus", lambda: 4)
    monkeypatch.setattr(threads, "ray_cpus", lambda: None)


def test_free_cores_leave_room_for_the_load(four_cpus):
    assert threads.choose(load=0.0).count == 4
    assert threads.choose(load=1.2).count == 3  # another process busy on one core
    assert threads.choose(load=2.6).count == 1
    assert threads.choose(load=9.0).count == 1  # a loaded machine still gets one thread
    assert "4 CPUs, 2.6 busy" in threads.choose(load=2.6).why


def test_an_allocation_caps_the_free_cores_and_asked_for_wins(monkeypatch, four_cpus):
    monkeypatch.setattr(threads, "ray_cpus", lambda: 2)
    assert threads.choose(load=0.0) == threads.Threads(2, "allocated 2; free cores: 4 CPUs, 0.0 busy")
    assert threads.choose(load=3.5).count == 1  # Ray's 2 CPUs, but a neighbour outside Ray holds 3.5 cores
    assert threads.choose(within=3, load=0.0).count == 3  # the caller's share wins over Ray's
    assert threads.choose(3, load=3.5) == threads.Threads(3, "asked for")


def test_a_shared_stage_under_a_busy_neighbour_takes_fewer_threads(monkeypatch, restore_threads):
    """The shared-stage phase runs the stage worker with the machine's share (2 CPUs on 2
    cores); a busy-loop neighbour outside Ray holds one of them. The worker takes the free
    one, where before it took both (the 12-30x slower stage of issue 53)."""
    from trainables.stage_worker import StageJob, worker_threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    job = StageJob(experiment=None, storage="", stage_folder="", tracking_uri="", run_ids=(), threads=2)
    monkeypatch.setattr(threads, "machine_load", lambda: 0.05)  # idle
    assert worker_threads(job).count == 2 and torch.get_num_threads() == 2
    monkeypatch.setattr(threads, "machine_load", lambda: 1.0)  # one core spinning
    chosen = worker_threads(job)
    assert chosen.count == 1 and torch.get_num_threads() == 1
    assert chosen.line() == "torch threads: 1 (allocated 2; free cores: 2 CPUs, 1.0 busy)"


def test_outside_ray_there_is_no_allocation():
    assert threads.ray_cpus() is None  # this process is no Ray worker


def test_every_computing_command_sets_threads(tmp_path, capsys, restore_threads):
    torch.set_num_threads(2)
    assert (
        main(
            [
                "train",
                "--preset",
                "phop-debug",
                "--out",
                str(tmp_path / "run"),
                "--threads",
                "1",
                "train.steps=1",
                "train.eval_every=0",
                "task.eval_count=8",
            ]
        )
        == 0
    )
    assert torch.get_num_threads() == 1
    assert "torch threads: 1 (asked for)" in capsys.readouterr().err


def test_busy_cores_are_measured_now():
    busy = threads.machine_load(window=0.05)
    assert 0.0 <= busy <= threads.usable_cpus() + 0.5  # a share of the CPUs, not a lagging average
    # A thread spinning while it measures: at least half a core is busy (one core is, unless
    # other work takes it, which is busy too); the load average would lag it by a minute.
    import threading

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        assert threads.machine_load(window=0.3) >= 0.5
    finally:
        stop.set()
        spinner.join()
