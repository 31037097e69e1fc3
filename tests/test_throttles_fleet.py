"""Throttles on real worker processes (SPEC §5e): limits that hold across
the fleet, waiters that go at once when a slot frees or a limit is raised,
and no slot lost to a worker killed with SIGKILL."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from celery_durable import Engine, Settings
from tests.support.apps.throttled import events_key, slot_op, slot_run, slot_wait
from tests.support.fleet import Fleet

APP = "tests.support.apps.throttled:engine"


@pytest.fixture
def engine(settings: Settings) -> Engine:
    return Engine(workflows=[slot_run, slot_op, slot_wait], settings=settings)


@pytest.fixture
def events(settings: Settings) -> Iterator[Callable[[], list[tuple[str, str, int]]]]:
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)

    def read() -> list[tuple[str, str, int]]:
        rows = [line.split(" ") for line in client.lrange(events_key(settings.key_prefix), 0, -1)]
        return [(what, name, int(ms)) for what, name, ms in rows]

    yield read
    client.close()


def until(check: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll ``check`` until true; the seconds it took (a failure names ``what``)."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > seconds:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        time.sleep(0.02)
    return time.monotonic() - began


def overlap(events: list[tuple[str, str, int]], names: set[str] | None = None) -> int:
    """The most steps inside their slot at once, from their in/out events."""
    edges = sorted((ms, 1 if what == "in" else -1) for what, name, ms in events if names is None or name in names)
    peak = inside = 0
    for _, step in edges:
        inside += step
        peak = max(peak, inside)
    return peak


def queued(engine: Engine, run_id: str, name: str = "t") -> bool:
    """The run's pass found no slot and it waits for one, holding no worker."""
    return engine.client().get_workflow_run(run_id).snapshot["waiting_for"] == {
        "kind": "throttle",
        "name": name,
        "until": None,
    }


def warm(engine: Engine) -> None:
    """A run through the fleet, so that what a test times is not a worker starting."""
    client = engine.client()
    settle(engine, [client.start_workflow(slot_run, {"name": "warm-up", "seconds": 0})], 60)


def settle(engine: Engine, run_ids: list[str], seconds: float) -> None:
    client = engine.client()
    for run_id in run_ids:
        assert client.wait_for_workflow_run(run_id, timeout=seconds).status == "completed"


def test_a_concurrency_limit_holds_across_the_fleet(engine: Engine, fleet: Fleet, events: Any) -> None:
    client = engine.client()
    client.set_throttle("t", concurrency=2)
    client.set_throttle("api", concurrency=3)
    for n in range(2):
        fleet.start(APP, concurrency=6, name=f"w{n}")
    runs = [client.start_workflow(slot_run, {"name": f"r{i}"}, throttle="t") for i in range(6)]
    ops = [client.start_workflow(slot_op, {"name": f"o{i}"}) for i in range(8)]
    settle(engine, runs + ops, 60)
    seen = events()
    assert overlap(seen, {f"r{i}" for i in range(6)}) == 2  # it binds, and never more
    assert overlap(seen, {f"o{i}" for i in range(8)}) == 3
    assert [(t.holding, t.waiting) for t in client.list_throttles()] == [(0, 0), (0, 0)]


def test_per_key_concurrency_holds_per_key_and_lets_other_keys_by(engine: Engine, fleet: Fleet, events: Any) -> None:
    client = engine.client()
    client.set_throttle("api", concurrency=4, per_key_concurrency=1)
    fleet.start(APP, concurrency=8)
    a = [client.start_workflow(slot_op, {"name": f"a{i}", "key": "tenant-a"}) for i in range(3)]
    b = [client.start_workflow(slot_op, {"name": f"b{i}", "key": "tenant-b"}) for i in range(3)]
    settle(engine, a + b, 60)
    seen = events()
    assert overlap(seen, {f"a{i}" for i in range(3)}) == 1
    assert overlap(seen, {f"b{i}" for i in range(3)}) == 1
    assert overlap(seen) == 2  # the two keys ran side by side


def test_a_rate_spaces_admissions_by_its_period(engine: Engine, fleet: Fleet, events: Any) -> None:
    client = engine.client()
    n, period = 2, 2.0
    client.set_throttle("r", rate=(n, period))
    fleet.start(APP, concurrency=8)
    warm(engine)
    began = time.time() * 1000
    runs = [client.start_workflow(slot_run, {"name": f"r{i}", "seconds": 0}, throttle="r") for i in range(5)]
    settle(engine, runs, 30)
    starts = sorted(ms for what, name, ms in events() if what == "in" and name != "warm-up")
    # The fifth admission waits two whole periods after the first window opened.
    assert starts[4] - began >= 2 * period * 1000
    for i in range(len(starts) - n):
        assert starts[i + n] - starts[i] >= period * 1000 - 250  # (a step starts a little after its admission)


def test_waiters_go_by_priority_then_first_come(engine: Engine, fleet: Fleet, events: Any) -> None:
    client = engine.client()
    client.set_throttle("t", concurrency=1)
    fleet.start(APP, concurrency=8)
    holder = client.start_workflow(slot_wait, {"name": "holder"}, throttle="t")
    until(lambda: client.get_workflow_run(holder).status == "running", 20, "the holder running")
    low = [client.start_workflow(slot_run, {"name": f"low{i}", "seconds": 0}, throttle="t") for i in range(2)]
    high = client.start_workflow(slot_run, {"name": "high", "seconds": 0}, throttle="t", priority=5)
    until(lambda: client.get_throttle("t").waiting == 3, 20, "three waiters")
    assert [w.run_id for w in client.get_throttle("t").waiters] == [high, *low]
    client.signal_workflow_run(holder, "go")
    settle(engine, [holder, high, *low], 30)
    order = [name for what, name, _ in events() if what == "in"]
    assert order == ["holder", "high", "low0", "low1"]


def test_a_cancelled_waiter_leaves_the_queue_at_once(engine: Engine, fleet: Fleet) -> None:
    client = engine.client()
    client.set_throttle("t", concurrency=1)
    fleet.start(APP, concurrency=4)
    holder = client.start_workflow(slot_wait, {"name": "holder"}, throttle="t")
    waiter = client.start_workflow(slot_run, {"name": "waiter"}, throttle="t")
    until(lambda: queued(engine, waiter), 20, "the waiter queued")
    assert client.get_workflow_run(waiter).status == "pending"
    assert client.cancel_workflow_run(waiter, timeout=10).status == "cancelled"
    assert (client.get_throttle("t").holding, client.get_throttle("t").waiting) == (1, 0)
    client.signal_workflow_run(holder, "go")
    settle(engine, [holder], 20)
    # The slot goes back right after the settle that the client may see first.
    until(lambda: client.get_throttle("t").holding == 0, 10, "the holder's slot back")


def test_a_raised_limit_lets_waiters_go_at_once(engine: Engine, fleet: Fleet, settings: Settings) -> None:
    client = engine.client()
    client.set_throttle("t", concurrency=1)
    fleet.start(APP, concurrency=4)
    holder = client.start_workflow(slot_wait, {"name": "holder"}, throttle="t")
    waiter = client.start_workflow(slot_wait, {"name": "waiter"}, throttle="t")
    until(lambda: queued(engine, waiter), 20, "the waiter queued")
    client.set_throttle("t", concurrency=2)
    # Well within a lease: through the one wake path, not the sweep's repair.
    took = until(lambda: client.get_workflow_run(waiter).status == "running", settings.lease_seconds, "the waiter ran")
    assert took < settings.lease_seconds / 2
    for run_id in (holder, waiter):
        client.signal_workflow_run(run_id, "go")
    settle(engine, [holder, waiter], 20)


def test_a_throttle_deleted_under_waiters_lets_them_go(engine: Engine, fleet: Fleet) -> None:
    client = engine.client()
    client.set_throttle("t", concurrency=1)
    fleet.start(APP, concurrency=4)
    holder = client.start_workflow(slot_wait, {"name": "holder"}, throttle="t")
    waiters = [client.start_workflow(slot_run, {"name": f"w{i}", "seconds": 0}, throttle="t") for i in range(2)]
    until(lambda: client.get_throttle("t").waiting == 2, 20, "two waiters")
    client.delete_throttle("t")
    settle(engine, waiters, 20)  # while the holder still waits for its signal
    assert client.get_workflow_run(holder).status == "running"
    client.signal_workflow_run(holder, "go")
    settle(engine, [holder], 20)


def test_every_worker_killed_while_a_slot_is_held_gives_it_back_and_the_queue_drains(
    engine: Engine, fleet: Fleet, settings: Settings
) -> None:
    client = engine.client()
    client.set_throttle("t", concurrency=1)
    client.set_throttle("api", concurrency=1)
    fleet.start(APP, concurrency=4)
    holder = client.start_workflow(slot_wait, {"name": "holder"}, throttle="t")
    op = client.start_workflow(slot_op, {"name": "op", "seconds": 8})  # killed inside its throttled step
    until(lambda: client.get_throttle("api").holding == 1, 20, "the op holding its slot")
    waiting = [client.start_workflow(slot_run, {"name": f"q{i}", "seconds": 0}, throttle="t") for i in range(2)]
    queued_op = client.start_workflow(slot_op, {"name": "op2", "seconds": 0})
    until(lambda: all(queued(engine, r) for r in waiting) and queued(engine, queued_op, "api"), 20, "queues")
    fleet.kill_all()
    fleet.start(APP, concurrency=4, name="w2")
    # The holder waits for its signal, alive: it keeps its slot until it ends.
    client.signal_workflow_run(holder, "go")
    # A take-over gives back what the dead attempt held: within a few leases.
    deadline = 6 * settings.lease_seconds + 10
    settle(engine, [holder, *waiting, queued_op, op], deadline)
    assert client.get_workflow_run(op).attempt == 2
    assert [(t.name, t.holding, t.waiting) for t in client.list_throttles()] == [("api", 0, 0), ("t", 0, 0)]
