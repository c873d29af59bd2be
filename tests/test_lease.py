"""The one lease mechanism behind the sweep lock and the shared-stage lock
(trainables/lease.py), against a timeline written out by hand on a fake clock: a lease is
taken, renewed, expires and is taken over; of contenders at once exactly one wins; a
waiting taker gets a released lease; a holder renews through a failed renewal."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from trainables import lease
from trainables.storage import Storage

SECONDS = 60.0


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def tables(clock):
    """Both tables the locks use, on the same fake clock (the actor's body in-process;
    fsspec's in-memory file system as the object store)."""
    bucket = Storage(f"memory://lease-{uuid.uuid4().hex[:8]}/sweep")
    return {"memory": lease.MemoryTable(clock), "store": lease.StoreTable(bucket, "locks", clock)}


@pytest.mark.parametrize("kind", ["memory", "store"])
def test_a_lease_is_taken_renewed_expires_and_is_taken_over(kind):
    clock = Clock()
    table = tables(clock)[kind]
    a, b = lease.holder(), lease.holder()
    # (seconds after the start, who tries, who holds after): the rule worked by hand.
    timeline = [
        (0, a, a),  # free: taken
        (10, b, a),  # held and fresh: refused
        (50, a, a),  # the holder renews: fresh until 110
        (100, b, a),  # 100 s after taking, but 50 after renewing: still refused
        (110, b, b),  # 60 s without renewal: the holder is gone, taken over
        (111, a, b),
    ]  # the old holder's late renewal does not take it back
    for at, who, expected in timeline:
        clock.now = 1000.0 + at
        assert table.take("x", who, SECONDS)["owner"] == expected["owner"], (at, who is a)
    table.release("x", a["owner"])  # not a's any more: stays b's
    assert table.take("x", a, SECONDS)["owner"] == b["owner"]
    table.release("x", b["owner"])
    assert table.take("x", a, SECONDS)["owner"] == a["owner"]  # released: free at once
    assert table.take("y", b, SECONDS)["owner"] == b["owner"]  # another name: another lease


def test_of_contenders_at_once_exactly_one_wins(tmp_path):
    table = lease.MemoryTable()
    contenders = 8
    start, tried = threading.Barrier(contenders), threading.Barrier(contenders)
    won, refused = [], []

    def contend(hold):
        start.wait()
        try:
            with hold() as mine:
                won.append(mine)
                tried.wait()  # hold until every other contender has tried
        except lease.Busy as e:
            refused.append(e.holder)
            tried.wait()

    for hold in (
        lambda: lease.held(table, "x", SECONDS, wait=False),
        lambda: lease.flocked(tmp_path / "x.lock", wait=False, info=tmp_path / "x.json"),
    ):
        won.clear(), refused.clear()
        threads = [threading.Thread(target=contend, args=(hold,)) for _ in range(contenders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(refused) == contenders - 1
        if won[0] is not None:  # the lease: each refusal names its holder (the flock's holder
            assert {r["owner"] for r in refused} == {won[0]["owner"]}  # writes who it is just after)
    assert table.leases == {} and not (tmp_path / "x.json").exists()  # both released


def test_a_waiting_taker_gets_the_lease_once_it_is_released(monkeypatch):
    monkeypatch.setattr(lease, "POLL_SECONDS", 0.01)
    table = lease.MemoryTable()
    tries, entered = [], threading.Event()
    take = table.take

    def counted(name, mine, seconds):
        tries.append(mine["owner"])
        return take(name, mine, seconds)

    with lease.held(table, "x", SECONDS, wait=False) as first:
        table.take = counted
        waiter = threading.Thread(target=lambda: _enter(lease.held(table, "x", SECONDS, wait=True), entered))
        waiter.start()
        deadline = time.monotonic() + 60
        while len(tries) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(tries) >= 3 and not entered.is_set()  # it asked again and again, and waited
        assert table.leases["x"]["owner"] == first["owner"]
    waiter.join(60)
    assert entered.is_set() and table.leases == {}


def _enter(held, entered):
    with held:
        entered.set()


def test_a_holder_renews_through_a_failed_renewal(caplog):
    """One failed renewal (a store's hiccup) used to end the renewals: the lease of a live
    holder then lapsed and was taken over."""
    table = lease.MemoryTable()
    take, renewals = table.take, []

    def flaky(name, mine, seconds):
        renewals.append(mine["owner"])
        if len(renewals) == 2:  # the first renewal
            raise OSError("the store did not answer")
        return take(name, mine, seconds)

    table.take = flaky
    with lease.held(table, "x", 0.04, wait=False):  # renewed every 0.01 s
        deadline = time.monotonic() + 30
        while len(renewals) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(renewals) >= 5
    assert "not renewed" in caplog.text and "the store did not answer" in caplog.text
    assert table.leases == {}


@pytest.mark.ray
@pytest.mark.slow  # Ray's start, 10 s on 2 cores: .ci/run's slow tier
def test_the_stage_lock_on_an_object_store_is_a_lease_in_the_clusters_actor():
    import ray

    from trainables.shared_stage import LEASE_SECONDS, stage_lock

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        location = f"memory://lease-{uuid.uuid4().hex[:8]}/stage-x"
        other = lease.holder()
        with stage_lock(Storage(location), location):
            held = lease.ActorTable().take(location, other, LEASE_SECONDS)  # another trial's table handle
            assert held["owner"] != other["owner"] and held["pid"] == lease.holder()["pid"]
        assert lease.ActorTable().take(location, other, LEASE_SECONDS)["owner"] == other["owner"]
    finally:
        ray.shutdown()
