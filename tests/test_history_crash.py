"""The history of a run whose worker was killed with SIGKILL: the take-over
and its cause, as the sweep found it, on real worker processes."""

from __future__ import annotations

from tests.support.trip_crash import TRIP, client_for, hold_car_and_kill_everything


def test_a_take_over_after_sigkill_is_in_the_history_with_its_cause(settings, fleet, raw_redis) -> None:
    client = client_for(settings)
    run_id = hold_car_and_kill_everything(settings, fleet, raw_redis, client)
    fleet.start(TRIP, concurrency=4, name="w2")
    envelope = client.wait_for_workflow_run(run_id, timeout=60)
    assert (envelope.status, envelope.attempt) == ("completed", 2), envelope.error

    events = client.get_workflow_run_history(run_id).events
    kinds = [event.kind for event in events]
    taken = [event for event in events if event.kind == "taken_over"]
    assert len(taken) == 1, kinds
    assert taken[0].attempt == 2 and taken[0].data["by"] == "recovery"
    cause = taken[0].data["cause"]
    assert "task" in cause or "worker" in cause or "in flight" in cause, cause  # what liveness found dead
    assert [e.attempt for e in events if e.kind == "attempt_started"] == [1, 2]
    done = {(e.key, e.attempt) for e in events if e.kind == "step_completed"}
    assert {("book-flight", 1), ("book-hotel", 1), ("book-car", 2)} <= done
    assert kinds.index("taken_over") < [i for i, e in enumerate(events) if e.key == "book-car"][-1]
    assert kinds[-1] == "run_settled"
