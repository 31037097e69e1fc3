"""The per-process map of kept fan-out thunks (``tasks/parked.py``): a
cache keyed by attempt, bounded, and let go when unused for a lease."""

from __future__ import annotations

from typing import Any, cast

from celery_durable.tasks.parked import KeptFanouts
from celery_durable.workflows.branch_work import KeptFanout


def fanout(call: str) -> KeptFanout:
    return KeptFanout(cast(Any, None), call, "p:2", [lambda: 1, lambda: 2], "m", 0, "")


def test_a_kept_fan_out_serves_its_own_attempt_only() -> None:
    kept = KeptFanouts(capacity=4, idle_seconds=30)
    thunks = fanout("m:0")
    kept.keep("run", 1, thunks)
    assert kept.get("run", 1, "m:0") is thunks
    assert kept.get("run", 2, "m:0") is None, "a new attempt replays"
    assert kept.get("other", 1, "m:0") is None
    assert kept.get("run", 1, "m:1") is None
    assert kept.used == 1


def test_the_least_recently_used_go_first_past_the_bound() -> None:
    kept = KeptFanouts(capacity=2, idle_seconds=30)
    for n in range(3):
        kept.keep(f"run{n}", 1, fanout("m:0"))
    assert len(kept) == 2
    assert kept.get("run0", 1, "m:0") is None
    assert kept.get("run1", 1, "m:0") is not None
    kept.keep("run3", 1, fanout("m:0"))  # run1 was used last: run2 goes
    assert kept.get("run2", 1, "m:0") is None and kept.get("run1", 1, "m:0") is not None


def test_unused_for_the_idle_time_is_let_go_and_zero_keeps_nothing() -> None:
    now = [100.0]
    idle = KeptFanouts(capacity=4, idle_seconds=30, clock=lambda: now[0])
    idle.keep("run", 1, fanout("m:0"))
    now[0] += 29
    assert idle.get("run", 1, "m:0") is not None, "used within the idle time"
    now[0] += 31
    assert idle.get("run", 1, "m:0") is None, "unused for longer"
    off = KeptFanouts(capacity=0, idle_seconds=30)
    off.keep("run", 1, fanout("m:0"))
    assert len(off) == 0 and off.get("run", 1, "m:0") is None
