"""What a wake's coordinator message says of its run (``Engine._wake_message``)."""

from __future__ import annotations

import uuid

from celery_durable import Engine, Settings
from celery_durable.broker.schema import MAIN
from celery_durable.tasks.wakes import Wake
from celery_durable.testing.server import environment_redis_url


def test_a_wake_names_the_runs_namespace_when_its_sender_or_this_process_knows_it() -> None:
    """Named, the pass reads the run in the script that takes its lock
    (``RunStore.activate_unread``); unnamed, it reads it first, as before."""
    engine = Engine([], Settings(redis_url=environment_redis_url(), key_prefix=f"w{uuid.uuid4().hex[:12]}"))
    run_id = uuid.uuid4().hex
    assert "namespace" not in engine._wake_message(Wake(run_id, 1, "order", MAIN, "t-1")).kwargs
    engine.store.indexes.remember(run_id, "billing")  # a script of this process met the run
    assert engine._wake_message(Wake(run_id, 1, "order", MAIN, "t-2")).kwargs["namespace"] == "billing"
    told = engine._wake_message(Wake(run_id, 1, "order", MAIN, "t-3", namespace="default"))
    assert told.kwargs["namespace"] == "default"  # the sender's word first
    branch = engine._wake_message(Wake(run_id, 1, "order", "m:0/1", "t-4"))
    assert "namespace" not in branch.kwargs  # a branch task reads its run anyway
