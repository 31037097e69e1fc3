"""``replay_history``: replay a stored history against a workflow in a plain test.

Production histories kept beside a test suite (``Client.export_history``,
``celery-durable runs export``) make a regression test of every change to a
workflow: a change that would break a run in flight fails the test before it
is deployed, as Temporal's Replayer does::

    def test_order_still_replays_its_histories():
        history = json.loads(Path("histories/order-waiting.json").read_text())
        check = replay_history(order, history)
        assert check.verdict == "ok", check.message

The replay is the engine's replay check (``Client.check_replay``): nothing
runs, nothing is written but the history itself, which is put, under a key
prefix of its own, in the private redis-server this package starts
(``testing.server``), so that the engine's own scripts read it. No worker
and no service need to be running.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from celery_durable.broker import RunStore
from celery_durable.broker.journal_export import forget_journal, write_journal
from celery_durable.client.versioning import ReplayCheck, check_record, read_history
from celery_durable.testing.server import environment_redis_url, private_settings
from celery_durable.workflows.definition import Workflow

KEEP_MS = 600_000
"""A history left behind by a test that died mid-replay is gone after this long."""

_stores: dict[str, RunStore] = {}
"""One store (a client and its scripts) per test Redis, shared by every replay of the process."""


def replay_history(workflow: Workflow, history: Any) -> ReplayCheck:
    """Replay ``history`` (a document of ``Client.export_history``, as parsed
    JSON) against ``workflow``: its ``ReplayCheck``, as ``Client.check_replay``
    gives it for a live run. A document that is not a history, or one of
    another workflow, is a ``ValueError``."""
    if not isinstance(workflow, Workflow):
        raise ValueError(f"replay_history takes a Workflow handle, got {type(workflow).__name__}")
    record, journal = read_history(history)
    if record.workflow != workflow.name:
        raise ValueError(f"The history is of workflow {record.workflow!r}, not {workflow.name!r}")
    store = _store()
    scratch = uuid.uuid4().hex  # the journal's keys: never the document's run id, which names no key here
    write_journal(store, scratch, journal, KEEP_MS)
    try:
        check = check_record(store, replace(record, run_id=scratch), workflow, store.settings)
    finally:
        forget_journal(store, scratch)
    return ReplayCheck(record.run_id, check.workflow, check.status, check.verdict, check.message)


def _store() -> RunStore:
    url = environment_redis_url()
    store = _stores.get(url)
    if store is None:
        store = _stores[url] = RunStore(private_settings(prefix="cdhist"))
    return store
