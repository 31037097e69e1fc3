"""Child runs and sagas under SIGKILL (SPEC §5b, §5c): real worker processes,
every one killed while a parent waits on its children and one child is in
the middle of its compensations.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from celery_durable import Engine, Settings
from celery_durable.broker import schema
from celery_durable.errors import RunNotFoundError
from tests.support.apps.children import effects_key, family, gate_key, kid, reached_key
from tests.support.fleet import Fleet
from tests.support.poll import START_BOUND, poll

APP = "tests.support.apps.children:engine"


def _status(client: Any, run_id: str) -> str | None:
    """A child's status, None until its parent's branch has created it (on a
    loaded machine kid 0 may reach its undo before kid 1 exists)."""
    try:
        return str(client.get_workflow_run(run_id).status)
    except RunNotFoundError:
        return None


@pytest.mark.slow
def test_a_fleet_killed_while_a_child_compensates_starts_nothing_twice_and_the_parent_completes(
    settings: Settings, fleet: Fleet, raw_redis: redis.Redis
) -> None:
    settings = settings.model_copy(update={"lease_seconds": 2})
    fleet.settings = settings
    client = Engine([kid, family], settings).client()
    prefix = settings.key_prefix
    for n in range(2):
        fleet.start(APP, concurrency=4, name=f"first-{n}")
    run_id = client.start_workflow("family", args={"kids": 3})
    kids = [schema.child_run_id(run_id, f"kid-{i}") for i in range(3)]

    # Kids 1 and 2 are done; kid 0 failed, compensated undo-b, and is held inside undo-a.
    poll(
        lambda: raw_redis.sismember(reached_key(prefix), kids[0]),
        within=START_BOUND,
        what="kid 0 to be inside undo-a",
    )
    for other in kids[1:]:
        poll(lambda other=other: _status(client, other) == "completed", within=START_BOUND, what="kids 1 and 2")
    assert client.get_workflow_run(run_id).status == "running"
    fleet.kill_all()
    raw_redis.set(gate_key(prefix, kids[0]), "1")

    for n in range(2):
        fleet.start(APP, concurrency=4, name=f"second-{n}")
    envelope = client.wait_for_workflow_run(run_id, timeout=90)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [None, 1, 2]  # kid 0's ChildWorkflowFailed is its slot's None

    effects = {field: int(n) for field, n in raw_redis.hgetall(effects_key(prefix)).items()}
    for i, child in enumerate(kids):
        assert effects[f"{child}:start"] == 1, f"kid {i} started once"
        assert effects[f"{child}:book-a"] == effects[f"{child}:book-b"] == 1
    assert effects[f"{kids[0]}:undo-b"] == 1 and effects[f"{kids[0]}:undo-a"] == 1, effects
    assert not any(f"{child}:undo" in field for child in kids[1:] for field in effects)

    first = client.get_workflow_run(kids[0])
    assert (first.status, first.attempt) == ("error", 2)  # taken over after the kill, compensated, failed
    assert "Compensating after StepFailed: running undo-b, undo-a" in [
        r.message for r in client.get_workflow_run_progress(kids[0]).records
    ]
    detail = client.get_workflow_run_detail(run_id)
    assert [(c.key, c.status) for c in detail.children] == [
        ("kid-0", "error"), ("kid-1", "completed"), ("kid-2", "completed")
    ]
    listed = {run.run_id for run in client.list_workflow_runs(limit=20).runs}
    assert {run_id, *kids} <= listed and len(listed) == 4, "no second child was ever created"
