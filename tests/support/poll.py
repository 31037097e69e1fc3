"""The one way a test waits: ``poll(predicate, within=..., what=...)``.

A test never sleeps to let something happen: it asks until the answer comes,
and gives up at a deadline it names. The deadline is the caller's to choose,
always explicitly, from what it waits on: a lease lapsing
(``lease_bound(settings)``), a worker process starting (``START_BOUND``), a
short run ending on workers already up (``RUN_BOUND``), or a setting of its own
(``4 * settings.lease_seconds``). Every bound holds on a loaded 2-core machine:
a bound reached fails the test, naming what never came.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from celery_durable import Settings

T = TypeVar("T")

RUN_BOUND = 40.0
"""A short run (a few steps, a fan-out, a signal) ends, or reaches the point a
test waits for, on workers already up. No setting bounds it, only the machine:
40 s is many times what it takes on a loaded 2-core machine."""

START_BOUND = 60.0
"""A worker process starts (imports Celery and the app, connects, reports
ready); a server starts and answers."""


def lease_bound(settings: Settings, leases: float = 1.0) -> float:
    """``leases`` leases of ``settings``: the time for a dead attempt's lease to
    lapse that many times (the recovery sweep acts at the latest one lease
    after it lapsed, so a take-over waits ``lease_bound(settings, 2)`` or more)."""
    return leases * settings.lease_seconds


def poll(
    predicate: Callable[[], T],
    *,
    within: float,
    what: str,
    every: float = 0.02,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """``predicate()`` until it returns something truthy, which is returned.

    Fails with an ``AssertionError`` naming ``what`` once ``within`` seconds
    passed; the predicate is asked once more at the deadline, so a slow
    predicate still gets its last answer. Exceptions of the types in
    ``ignoring`` count as "not yet" (a server still starting), and the last one
    is named in the failure.
    """
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            value = predicate()
        except ignoring as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what}; last answer: {last!r:.300}")
        time.sleep(every)
