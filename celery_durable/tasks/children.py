"""The engine's side of child runs (SPEC §5b): starting and cancelling them,
and telling a parent that its child ended.

- ``EngineChildren`` is replay's ``ChildPort``: the registry, a child's run
  created if it does not exist (its first coordinator message counted in
  flight by the same script, as any start's), cancelled, or created
  cancelled when it never started.
- ``tell_parent`` runs right after a child settles, wherever it settled (a
  pass, a cancel, the sweep's halt): its end is journaled in the parent and
  the sequence waiting for it is woken. The child's settling left it in the
  sweep's schedule (``watch``), and is taken out only once the parent was
  told: a worker dying in between leaves the telling to the sweep
  (``settled_child``), which does it again; the parent's script journals
  an end once.
- ``cancel_waited_children`` runs before a parent settles ``cancelled``:
  every child it waits for (or waited for, and that has not ended) is
  cancelled first; one it had not created yet is created cancelled, so a
  start racing the cancel finds it ended and starts nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery_durable import telemetry
from celery_durable.broker import RunRecord, schema
from celery_durable.broker.child_types import DoneVerdict
from celery_durable.broker.replies.control import RequestVerdict
from celery_durable.broker.schema import MAIN
from celery_durable.errors import DurableError, StorageError
from celery_durable.tasks import throttling
from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.wakes import Wake, woken
from celery_durable.telemetry.context import run_parent
from celery_durable.workflows.children import ChildRequest, ChildState
from celery_durable.workflows.definition import Workflow, registered_workflow

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

ENDED = frozenset({"completed", "error", "cancelled"})


class EngineChildren:
    """Child runs of one parent run, as its executions start and cancel them."""

    def __init__(self, engine: Engine, parent: RunRecord) -> None:
        self._engine = engine
        self._parent = parent

    def resolve(self, workflow: Any) -> Workflow:
        return registered_workflow(self._engine.workflows, workflow)

    def start(self, request: ChildRequest) -> ChildState:
        engine, parent = self._engine, self._parent
        store = engine.store
        # Created in the parent's pass: the child's spans continue the parent's trace.
        within = run_parent(parent.run_id, parent.trace_parent, parent.trace_attempt).traceparent()
        start = telemetry.starting(request.workflow.name, request.run_id, within)
        for _ in range(2):
            message = new_task_id()
            created_ms = store.now_ms()
            if store.create_run(request.run_id, self._fields(request, created_ms, start.traceparent), message):
                start.created()  # a replay that reaches the child again finds it made: no second start
                store.index_run(parent.namespace, request.run_id, None)
                self._send(request, message)
                return ChildState(True, "pending")
            record = store.load_run(request.run_id)
            if record is None:
                continue  # its retention ran out as it was looked at: created again
            if record.status == "pending" and record.epoch == 1:
                # A start that died before it listed and scheduled the child:
                # the sweep sends it again should its first message be lost.
                if not store.listed(parent.namespace, request.run_id):
                    store.index_run(parent.namespace, request.run_id, None)
                store.schedule_check(request.run_id, created_ms + store.lease_ms, sooner_only=True)
            return ChildState(False, record.status, record.reason, record.error, record.result)
        raise StorageError(f"Child run {request.run_id} kept disappearing while it was started")

    def cancel(self, request: ChildRequest) -> ChildState | None:
        parent = self._parent
        created_ms = self._engine.store.now_ms()
        # Made cancelled, if at all: nothing starts, so no start of its own in the parent's trace.
        within = run_parent(parent.run_id, parent.trace_parent, parent.trace_attempt).traceparent()
        fields = self._fields(request, created_ms, within)
        return cancel_child(self._engine, parent, request.key, request.run_id, request.workflow.name, fields)

    def _fields(self, request: ChildRequest, created_ms: int, trace_parent: str) -> dict[str, str]:
        engine, parent = self._engine, self._parent
        fields = schema.new_run_fields(
            run_id=request.run_id,
            workflow=request.workflow.name,
            namespace=parent.namespace,
            args_json=request.args_json,
            limits_json=request.limits_json,
            code_hash=request.workflow.code_hash,
            created_ms=created_ms,
            lease_ms=engine.store.lease_ms,
            idempotency_key=None,
            progress_max=engine.settings.progress_max_records,
            ceilings=request.ceilings,
            trace_parent=trace_parent,
        )
        return {**fields, **schema.parent_fields(parent.run_id, request.key)}

    def _send(self, request: ChildRequest, message: str) -> None:
        try:
            self._engine.deliver([Wake(request.run_id, 1, request.workflow.name, MAIN, message)])
        except Exception as exc:  # kombu/amqp connection errors have no common base
            # Forgotten as it failed (Engine._publish), and the sweep looks at
            # the child now: with nothing in flight, it takes it over and sends it.
            logger.warning("child run %s: its first message was refused (%s); the sweep sends it", request.run_id, exc)


def cancel_child(
    engine: Engine, parent: RunRecord, key: str, run_id: str, workflow: str, fields: dict[str, str] | None = None
) -> ChildState | None:
    """Cancel a child of ``parent``: its state when it had ended already, else None.
    One that does not exist yet is created cancelled (from ``fields``, or a
    bare record when its request is not known)."""
    store = engine.store
    if fields is None:
        fields = _bare_fields(engine, parent, key, run_id, workflow)
    if store.create_cancelled(run_id, fields, parent.namespace):
        return None
    message = new_task_id()
    answer = store.cancel(run_id, parent.namespace, message)
    if answer.verdict is RequestVerdict.REQUESTED:
        engine.deliver([Wake(run_id, answer.epoch, workflow, MAIN, message)])
        return None
    if answer.verdict is RequestVerdict.SETTLED:
        record = store.load_run(run_id)
        if record is not None:
            return ChildState(False, record.status, record.reason, record.error, record.result)
    return None


def _bare_fields(engine: Engine, parent: RunRecord, key: str, run_id: str, workflow: str) -> dict[str, str]:
    """The record of a child cancelled before its parent created it, known only by its entry."""
    definition = engine.workflows.get(workflow)
    fields = schema.new_run_fields(
        run_id=run_id,
        workflow=workflow,
        namespace=parent.namespace,
        args_json="{}",
        limits_json="{}",
        code_hash=definition.code_hash if definition is not None else "",
        created_ms=engine.store.now_ms(),
        lease_ms=engine.store.lease_ms,
        idempotency_key=None,
        progress_max=engine.settings.progress_max_records,
        ceilings={},
    )
    return {**fields, **schema.parent_fields(parent.run_id, key)}


def cancel_waited_children(engine: Engine, parent: RunRecord) -> None:
    """Before ``parent`` settles cancelled: cancel the children it waits for."""
    store = engine.store
    waited = [entry for entry in store.children(parent.run_id) if entry.waited_for]
    if not waited:
        return
    for entry, status in zip(waited, store.statuses([e.run_id for e in waited]), strict=True):
        if status in ENDED:
            continue
        cancel_child(engine, parent, entry.key, entry.run_id, entry.workflow)
        logger.info("run %s: child %s (key %s) cancelled with it", parent.run_id, entry.run_id, entry.key)


def tell_parent(
    engine: Engine, child: RunRecord, status: str, reason: str | None, error: str | None, result: Any
) -> None:
    """A child settled ``status``: journal its end in its parent and wake the
    sequence that waits for it. Said and left to the sweep should it fail."""
    parent_id, key = child.parent_run_id, child.parent_key
    if parent_id is None or key is None or status not in schema.SETTLED_FOR_PARENT:
        return
    store = engine.store
    outcome = schema.child_outcome(key, child.run_id, child.workflow, status, reason, error, result)
    prefix = new_task_id()
    try:
        done = store.tell_parent(parent_id, child.namespace, key, child.run_id, outcome, prefix)
        if done.verdict is DoneVerdict.OK and done.throttled:
            throttling.answered(engine, parent_id, done.epoch, f"k/{key}")
        if done.verdict is DoneVerdict.OK and done.owner is not None:
            engine.deliver(woken(parent_id, done.epoch, done.workflow, [done.owner], prefix))
        store.unschedule(child.run_id)
    except (DurableError, OSError) as exc:
        logger.warning("child run %s ended %s; its parent %s is told later: %s", child.run_id, status, parent_id, exc)
    except Exception as exc:  # kombu/amqp connection errors have no common base
        logger.warning("child run %s: the wake of its parent %s was refused: %s", child.run_id, parent_id, exc)


def settled_child(engine: Engine, run_id: str) -> None:
    """The sweep found a settled run still scheduled: a child whose parent
    may not have been told (its settling's worker died first)."""
    record = engine.store.load_run(run_id)
    if record is not None and record.parent_run_id is not None:
        tell_parent(engine, record, record.status, record.reason, record.error, record.result)
