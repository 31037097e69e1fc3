"""Crash recovery: the run that Copilot could not resume, resumed.

Workers are real processes, killed with SIGKILL by process group at the exact
moment of the seed: flight and hotel booked, the car booked but its step not
yet journaled.
"""

from __future__ import annotations

import time

import pytest

from celery_durable import Engine
from tests.support.apps.trip import SERVICES, trip, trip_in_line
from tests.support.poll import RUN_BOUND, poll
from tests.support.trip_crash import TRIP, client_for, hold_car_and_kill_everything, receipts, step_status


@pytest.mark.topologies("redis", "cluster", "rabbitmq")
def test_the_seed_crash_finishes_by_itself_once_a_worker_is_back(settings, fleet, raw_redis) -> None:
    client = client_for(settings)
    run_id = hold_car_and_kill_everything(settings, fleet, raw_redis, client)
    killed = time.monotonic()
    assert client.get_workflow_run(run_id).status == "running"
    fleet.start(TRIP, concurrency=4, name="w2")

    envelope = client.wait_for_workflow_run(run_id, timeout=60)
    recovered_in = time.monotonic() - killed

    assert envelope.status == "completed", envelope.error
    # On Redis the dead worker's messages come back only after the visibility
    # timeout, and the sweep takes the run over once the lease runs out.
    # RabbitMQ gives them back at once: a message whose holder died is a
    # recovery too (SPEC §8), never the dead attempt going on.
    assert envelope.attempt == 2
    assert envelope.result["confirmed"] is True
    # At least once, exactly one reservation: the car's provider was called by
    # both attempts, and its idempotency key made the second call a no-op.
    assert receipts(raw_redis, settings.key_prefix, "flight") == (1, 1)
    assert receipts(raw_redis, settings.key_prefix, "hotel") == (1, 1)
    assert receipts(raw_redis, settings.key_prefix, "car") == (2, 1)
    bookings = {b["service"]: b["confirmation"] for b in envelope.result["bookings"]}
    assert set(bookings) == set(SERVICES)
    # No phantom running rows; the take-over is told in the progress.
    assert envelope.snapshot["steps_running"] == 0
    assert "running" not in step_status(client, run_id).values()
    messages = [r.message for r in client.get_workflow_run_progress(run_id).records if r.kind == "system"]
    assert sum("recovered" in m for m in messages) == 1, messages
    # Within the lease plus the sweep interval plus a little.
    print(f"recovered in {recovered_in:.2f}s (lease {settings.lease_seconds}s)")
    assert recovered_in < settings.lease_seconds + 10, recovered_in


@pytest.mark.topologies("redis", "rabbitmq")
def test_a_worker_killed_while_the_body_is_busy_between_two_steps_books_the_hotel_once(
    settings, fleet, raw_redis
) -> None:
    """The step before is journaled while the body's own code runs on (it is not
    left held back for the body's next call), so the recovered run does not run it again."""
    client = Engine([trip, trip_in_line], settings).client()
    worker = fleet.start(TRIP, concurrency=2)
    run_id = client.start_workflow("trip-in-line")
    prefix = settings.key_prefix
    poll(
        lambda: raw_redis.sismember(f"{prefix}:gate:{run_id}:reached", "between")
        and step_status(client, run_id).get("book-hotel") == "completed",
        within=RUN_BOUND,
        what="the hotel journaled while the body waits at its gate",
    )
    worker.kill()
    raw_redis.sadd(f"{prefix}:gate:{run_id}:open", "between")
    fleet.start(TRIP, concurrency=2, name="w2")
    done = client.wait_for_workflow_run(run_id, timeout=RUN_BOUND + 3 * settings.lease_seconds)
    assert done.status == "completed" and done.attempt == 2
    assert receipts(raw_redis, prefix, "hotel") == (1, 1), "the hotel's provider was called once"
    assert receipts(raw_redis, prefix, "car") == (1, 1)


def test_without_auto_recovery_the_dead_run_is_halted_and_resumes_on_demand(settings, fleet, raw_redis) -> None:
    settings = settings.model_copy(update={"auto_recover": False})
    fleet.settings = settings
    client = client_for(settings)
    run_id = hold_car_and_kill_everything(settings, fleet, raw_redis, client)
    fleet.start(TRIP, concurrency=4, name="w2")

    halted = client.wait_for_workflow_run(run_id, timeout=30)
    assert (halted.status, halted.reason, halted.can_resume) == ("halted", "interrupted", True)
    assert step_status(client, run_id)["book-car"] == "interrupted"

    resumed = client.resume_workflow(run_id, timeout=60)
    assert resumed.status == "completed", resumed.error
    assert receipts(raw_redis, settings.key_prefix, "car") == (2, 1)
    assert receipts(raw_redis, settings.key_prefix, "flight") == (1, 1)


@pytest.mark.topologies("redis", "cluster")
def test_many_sweepers_take_a_dead_run_over_exactly_once(durable, raw_redis) -> None:
    """Every worker sweeps; the take-over is a compare-and-set, so one wins."""
    import threading

    from celery_durable.tasks.recovery import RecoverySweep

    d = durable([trip], worker=False)
    run_id = d.client.start_workflow("trip")
    keys = d.engine.store.run_keys(run_id)
    # Its coordinator pass was running, and its worker stopped renewing it long ago.
    raw_redis.hset(keys.run, mapping={"status": "running", "lease_until": "1"})
    raw_redis.delete(keys.live)
    raw_redis.hset(keys.live, "dead-pass", "x|1")
    d.engine.store.schedule_check(run_id, 0)

    sweeps = [RecoverySweep(d.engine) for _ in range(8)]
    barrier = threading.Barrier(len(sweeps))

    def sweep(one: RecoverySweep) -> None:
        barrier.wait()
        one.sweep_once()

    threads = [threading.Thread(target=sweep, args=(one,)) for one in sweeps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    envelope = d.client.get_workflow_run(run_id)
    assert (envelope.status, envelope.attempt) == ("running", 2)
    system = [r.message for r in d.client.get_workflow_run_progress(run_id).records if r.kind == "system"]
    assert len(system) == 1 and system[0].startswith("Run recovered after its attempt died ("), system
    assert system[0].endswith(") (attempt 2)")


def test_a_queue_backlog_longer_than_the_lease_causes_no_take_over(durable) -> None:
    """Nothing dies here: messages just wait in a busy queue, for many leases.
    A queued message is alive while its queue's workers are busy."""
    from tests.support.apps.basic import fan

    d = durable([fan], concurrency=1, lease_seconds=1)
    run_ids = [d.client.start_workflow("fan", args={"count": 4, "seconds": 0.25}) for _ in range(12)]
    envelopes = [d.client.wait_for_workflow_run(run_id, timeout=120) for run_id in run_ids]
    assert all(e.status == "completed" for e in envelopes), [e.error for e in envelopes]
    assert [e.attempt for e in envelopes] == [1] * len(envelopes)
