"""A sweep that fires a burst of timers and dies mid-way (SIGKILL of its
worker process) loses no timer and fires none twice.

The sweep claims due runs a batch at a time, fires each batch's timers in
one pipeline of scripts (each counts its wake in flight), writes the next
looks, then publishes the wakes. Killed anywhere in that, a run is left
claimed but not looked at (looked at again when its claim runs out), or with
a wake counted and never sent (its queue is found empty, the run is taken
over, and the new attempt's replay finds the timer due), or woken. Each run
must complete, and the step after its timer must run exactly once: a side
effect outside the journal (a Redis list the step appends its run id to)
counts it.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import redis

from celery_durable import Engine, Settings
from celery_durable.tasks.recovery import BATCH, CLAIM_MS
from tests.support.apps.waits import alarm, rang_key
from tests.support.fleet import Fleet
from tests.support.poll import poll

APP = "tests.support.apps.waits:engine"
RUNS = 600
START_SECONDS = 40.0
"""T is this far after the first start: every run must be waiting, and at T in the sweep's index, before it."""


@pytest.mark.slow
def test_a_sweep_killed_in_the_middle_of_a_burst_loses_no_timer_and_fires_none_twice(
    settings: Settings, fleet: Fleet, raw_redis: redis.Redis
) -> None:
    lease = settings.lease_seconds
    client = Engine([alarm], settings).client()
    due_key = f"{settings.key_prefix}:{{sweep}}:due"
    runner = fleet.start(APP, concurrency=8, name="runner")
    at_ms = int((time.time() + START_SECONDS) * 1000)
    run_ids = [client.start_workflow("alarm", args={"at_ms": at_ms}) for _ in range(RUNS)]
    # Every run waits, and a sweep has looked at it once (a lease after its
    # start) and put it at T: the timers fall due together.
    poll(
        lambda: raw_redis.zcount(due_key, at_ms, at_ms) == RUNS,
        within=at_ms / 1000 - time.time() - 2,
        what="every run waiting, due at T",
        every=0.2,
    )
    runner.stop()
    # The sweeper consumes no queue of the engine: the burst's passes wait in the queue for a runner.
    sweeper = fleet.start(APP, concurrency=1, queues=[f"{settings.key_prefix}.nobody"], name="sweeper")
    assert time.time() * 1000 < at_ms - 1000, "the machine is too slow for this test's START_SECONDS"

    # The sweeper claims the runs due at T in member order, a batch at a
    # time. Once the last run of its first batch has its wake counted (its
    # script ran last in the batch's pipeline), the sweeper is between its
    # scripts and the publish of the batch's wakes, with more batches to go.
    last_of_batch = f"{settings.key_prefix}:{{{sorted(run_ids)[BATCH - 1]}}}:live"
    poll(
        lambda: raw_redis.hlen(last_of_batch) > 0,
        within=START_SECONDS + 2 * lease,
        what="the first batch fired",
        every=0.001,
    )
    sweeper.kill()
    unclaimed = raw_redis.zcount(due_key, at_ms, at_ms)
    sent = raw_redis.llen(settings.coordinator_queue)
    assert unclaimed > 0 and sent < RUNS, f"the kill came after the whole burst ({sent} wakes sent): not mid-way"

    fleet.start(APP, concurrency=8, name="runner-again")
    # A claim the dead sweeper held runs out, a wake it counted but never sent
    # is found gone from its empty queue, and a take-over's pass runs.
    timeout = CLAIM_MS / 1000 + 8 * lease + RUNS / 10

    def settled() -> bool:
        pipe = raw_redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hget(f"{settings.key_prefix}:{{{run_id}}}:run", "status")
        return all(status == "completed" for status in pipe.execute())

    poll(settled, within=timeout, what=f"all {RUNS} runs completed", every=0.5)
    rang = Counter(raw_redis.lrange(rang_key(settings.key_prefix), 0, -1))
    assert set(rang) == set(run_ids), f"{len(set(run_ids) - set(rang))} timers never fired"
    assert max(rang.values()) == 1, f"fired twice: {[run for run, n in rang.items() if n > 1][:5]}"
    taken_over = [r for r in run_ids if int(raw_redis.hget(f"{settings.key_prefix}:{{{r}}}:run", "attempt") or 1) > 1]
    print(f"killed with {unclaimed} of {RUNS} unclaimed, {sent} wakes in the queue; {len(taken_over)} taken over")
