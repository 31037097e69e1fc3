"""The client: start, wait for, list, inspect, cancel and resume runs (SPEC §3)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from celery_durable import telemetry, throttles
from celery_durable.broker import RunRecord, schema
from celery_durable.broker.events import RunWatch
from celery_durable.broker.schema.profiles import ServedWorkflow
from celery_durable.client import fleet_registry, history, versioning
from celery_durable.client import progress as paging
from celery_durable.client.control_methods import ControlMethods
from celery_durable.client.fleet_registry import WorkerInfo
from celery_durable.client.history import HistoryPage
from celery_durable.client.listing import list_runs
from celery_durable.client.run_views import (
    agent_row,
    child_rows,
    phase_rows,
    step_rows_in_order,
)
from celery_durable.client.throttle_methods import ThrottleMethods
from celery_durable.client.versioning import ReplayCheck
from celery_durable.errors import (
    RunNotFoundError,
    StorageError,
)
from celery_durable.names import NAMESPACE_MAX, NAMESPACE_PATTERN, name_rule
from celery_durable.schedules.methods import ScheduleMethods
from celery_durable.tasks import throttling
from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.sending import CelerySender
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.definition import Workflow, registered_workflow
from celery_durable.workflows.envelope import (
    ProgressEntry,
    ProgressPage,
    RunDetail,
    RunEnvelope,
    RunPage,
)
from celery_durable.workflows.jsonvalue import short_repr
from celery_durable.workflows.limits import ceiling_fields, merge_limits, validate_limits
from celery_durable.workflows.versions import last_code_hash

if TYPE_CHECKING:
    from celery_durable.engine import Engine

T = TypeVar("T")
MAX_IDEMPOTENCY_KEY = 256
DEFAULT_POLL_MS = 1000
MAX_POLL_MS = 3_600_000
MAX_TIMEOUT = 1e9
"""About 31 years: longer is "forever", which None says; and a deadline must stay a finite float."""


class Client(ControlMethods, ScheduleMethods, ThrottleMethods):
    """One namespace's view of the runs and schedules; every call validates before it writes."""

    def __init__(self, engine: Engine, namespace: str) -> None:
        if not isinstance(namespace, str) or not NAMESPACE_PATTERN.match(namespace):
            raise ValueError(f"namespace must be {name_rule(NAMESPACE_MAX)}: {short_repr(namespace)}")
        self.engine = engine
        self.namespace = namespace

    # -- starting ------------------------------------------------------------

    def start_workflow(
        self,
        name_or_handle: str | Workflow,
        args: Any = None,
        limits: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        *,
        throttle: str | None = None,
        throttle_key: str | None = None,
        priority: int = 0,
    ) -> str:
        """Start a run and return its id at once; an idempotency key returns the
        first run's id. With ``throttle``, the run waits ``pending`` until it
        gets a slot of that throttle and holds it while it runs (SPEC §5e);
        ``priority`` orders its waiters, higher first."""
        definition = self._workflow(name_or_handle)
        slot = throttles.check_start(throttle, throttle_key, priority)
        args = {} if args is None else args
        args_json = jsonvalue.encode_payload(
            args,
            self.engine.settings.max_payload_bytes,
            noun="Workflow args",
            too_large="{noun} are {size} bytes, above max_payload_bytes ({limit})",
        )
        definition.validate_args(args)
        if limits is not None:
            validate_limits(limits, allow_none=True)
        effective = merge_limits(dict(definition.limits), limits)
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not idempotency_key or len(idempotency_key) > MAX_IDEMPOTENCY_KEY
        ):
            raise ValueError(f"idempotency_key must be a non-empty string of at most {MAX_IDEMPOTENCY_KEY} characters")
        if idempotency_key is not None and not jsonvalue.is_utf8(idempotency_key):
            raise ValueError(f"idempotency_key holds a lone surrogate: {short_repr(idempotency_key)}")
        store = self.engine.store
        run_id = self._new_run_id()
        created = store.now_ms()
        lease_ms = int(self.engine.settings.lease_seconds * 1000)
        start = telemetry.starting(definition.name, run_id)
        fields = schema.new_run_fields(
            run_id=run_id,
            workflow=definition.name,
            namespace=self.namespace,
            args_json=args_json,
            limits_json=jsonvalue.dumps(effective),
            code_hash=definition.code_hash,
            created_ms=created,
            lease_ms=lease_ms,
            idempotency_key=idempotency_key,
            progress_max=self.engine.settings.progress_max_records,
            ceilings=ceiling_fields(effective),
            trace_parent=start.traceparent,
        )
        if slot is not None:
            fields.update(throttling.start_slot(self.engine, self.namespace, run_id, slot))
        else:
            fields.update(throttles.priority_field(priority))  # its throttled ops wait by it (SPEC 5e)
        message = new_task_id()
        owner = store.start_run(self.namespace, run_id, fields, message, idempotency_key)
        first = store.load_run(owner) if owner != run_id else None
        if owner != run_id and first is None and idempotency_key is not None:
            # The key names a run whose retention ran out: free it, start anew.
            store.release_idempotency(self.namespace, idempotency_key, owner)
            owner = store.index_run(self.namespace, run_id, idempotency_key)
            first = store.load_run(owner) if owner != run_id else None
        if owner != run_id:
            store.discard_run(run_id, 1)
            if slot is not None:
                throttling.drop_start(self.engine, self.namespace, run_id, slot)
            if first is not None and first.status == "pending" and first.epoch == 1:
                # The first start may have died before sending its coordinator
                # message; a duplicate is harmless (activation lock and fence).
                self._dispatch(owner, 1, first.workflow)
            return owner
        start.created()  # the key's run found instead is not one this start made
        self._dispatch(run_id, 1, definition.name, message)
        self._say_if_unserved(run_id, definition.name)
        return run_id

    def _say_if_unserved(self, run_id: str, workflow: str) -> None:
        """A run of a workflow no live worker serves, while live workers report
        what they serve, gets one system record saying so. Not under the
        in-process test fleet, which beats nowhere; a registry that cannot be
        read says nothing (the start stands)."""
        if not isinstance(self.engine.sender, CelerySender):
            return
        store = self.engine.store
        try:
            if self.engine.served.unserved(store, workflow):
                store.note(run_id, "unserved", fleet_registry.UNSERVED_NOTE.format(workflow=workflow))
        except StorageError:
            return

    def list_workers(self) -> list[WorkerInfo]:
        """The fleet as workers report it with their beats (SPEC §3): each
        worker's queues and the workflows it serves with their code hashes,
        alive ones first; ``fleet_registry.mixed_deploys`` names a mixed deploy."""
        return fleet_registry.read_workers(self.engine.store)

    def workflow_meta(self, name: str, code_hash: str | None = None) -> Workflow | ServedWorkflow | None:
        """The workflow's meta: this engine's, else what workers that serve it report."""
        definition = self.engine.workflows.get(name)
        if definition is not None:
            return definition
        try:
            return fleet_registry.served_meta(self.list_workers(), name, code_hash)
        except StorageError:
            return None

    def run_workflow(
        self,
        name_or_handle: str | Workflow,
        args: Any = None,
        limits: dict[str, Any] | None = None,
        resume_from_run_id: str | None = None,
        timeout: float | None = None,
    ) -> RunEnvelope:
        """Start a run (or resume one) and block until it settles."""
        if resume_from_run_id is not None:
            return self.resume_workflow(resume_from_run_id, limits=limits, timeout=timeout)
        paging.check_wait(timeout)  # before the start: refused after it, the run's id would be lost
        run_id = self.start_workflow(name_or_handle, args=args, limits=limits)
        return self.wait_for_workflow_run(run_id, timeout=timeout)

    # -- reading -------------------------------------------------------------

    def _new_run_id(self) -> str:
        """A fresh run id; the crash-test explorer numbers them instead, so every
        execution of one scenario names its runs alike and their results compare."""
        return uuid.uuid4().hex

    def get_workflow_run(self, run_id: str) -> RunEnvelope:
        return RunEnvelope.from_record(self._record(run_id))

    def wait_for_workflow_run(
        self,
        run_id: str,
        timeout: float | None = None,
        poll_interval_ms: int | None = None,
        cancel_event: threading.Event | None = None,
    ) -> RunEnvelope:
        """Block until the run settles; ``cancel_event`` ends the wait, not the run.

        Status changes are announced on the namespace's pub/sub channel, so a
        wait wakes at once; ``poll_interval_ms`` bounds how long it trusts
        silence before it reads the run again.
        """
        return paging.wait_for_run(
            self, run_id, timeout=timeout, poll_interval_ms=poll_interval_ms, cancel_event=cancel_event
        )

    def list_workflow_runs(
        self,
        status: str | None = None,
        workflow: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        *,
        waiting: bool | str | None = None,
        run_id_prefix: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        schedule_id: str | None = None,
    ) -> RunPage:
        """This namespace's runs, newest first, in pages; the filters combine.

        ``waiting``: True keeps the runs whose ``snapshot.waiting_for`` is
        set, a name the runs waiting for that name (a signal's, or a child's
        run id). ``run_id_prefix``: runs whose id starts with it (lowercase
        hex), given in id order. ``created_after`` (inclusive) and
        ``created_before`` (exclusive): timezone-aware datetimes. Filtered
        pages read the namespace's indexes (``celery-durable runs reindex``
        builds them for a store written before they existed). ``schedule_id``:
        the runs that schedule started, newest tick first (SPEC §5d)."""
        more: dict[str, Any] = {} if schedule_id is None else {"schedule_id": schedule_id}
        return list_runs(
            self.engine.store,
            self.namespace,
            status,
            workflow,
            limit,
            cursor,
            waiting=waiting,
            run_id_prefix=run_id_prefix,
            created_after=created_after,
            created_before=created_before,
            **more,
        )

    def reindex_runs(self) -> int:
        """Rebuild this namespace's indexes from its run records (a store
        written before they existed); returns how many runs it holds."""
        return self.engine.store.reindex(self.namespace)

    def get_workflow_run_detail(self, run_id: str) -> RunDetail:
        record = self._record(run_id)
        definition = self.workflow_meta(record.workflow, record.code_hash)
        phases = phase_rows(definition, record) if definition is not None else []
        steps = step_rows_in_order(record.run_id, self.engine.store.step_rows(record.run_id))
        progress = self.get_workflow_run_progress(run_id, limit=20).records
        agents = [agent_row(row) for row in self.engine.store.agent_rows(record.run_id).values()]
        # Started rows first, by start time; rows not started yet (None) after them.
        agents.sort(key=lambda row: (row["started_at"] is None, row["started_at"] or 0, row["agent_id"]))
        return RunDetail(
            run=RunEnvelope.from_record(record),
            phases=phases,
            steps=steps,
            progress=progress,
            agents=agents,
            children=child_rows(self.engine.store, record) if record.children else [],
            started_code_hash=record.code_hash,
            last_attempt_code_hash=last_code_hash(record),
        )

    def get_workflow_run_history(self, run_id: str, after: int | None = None, limit: int = 200) -> HistoryPage:
        """The run's events, oldest first, derived from its journal and progress
        (SPEC §4): a ``HistoryPage``; pass its ``next`` as ``after`` for the
        next page (None: the last one). A bad ``after``/``limit`` is a ValueError."""
        cursor, count = history.check_page(after, limit)
        record = self._record(run_id)
        return history.history_page(self.engine.store, record.run_id, cursor, count)

    def get_workflow_run_progress(
        self,
        run_id: str,
        phase_id: str | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int | None = None,
    ) -> ProgressPage:
        """A page of progress records in ascending seq (SPEC §7).

        Without a cursor, the newest ``limit`` records (default 200, at most
        500); ``after_seq=N`` the first ``limit`` with seq > N (-1 and 0: from
        the start); ``before_seq=N`` the last ``limit`` with seq < N. A
        ``phase_id`` (as in the detail's phases) scopes records, cursors and
        ``oldest_seq``/``newest_seq`` to that phase. A bad option is a
        ``ValueError`` naming it.
        """
        query = paging.check_query(after_seq, before_seq, limit, phase_id)
        record = self._record(run_id)
        definition = self.workflow_meta(record.workflow, record.code_hash)
        declared = [phase.phase_id for phase in definition.phases] if definition is not None else None
        scope = paging.check_phase_id(phase_id, declared, record.workflow)
        data = self.engine.store.progress_page(record.run_id, scope, query.mode, query.cursor, query.limit)
        return paging.to_page(data, query)

    # -- following ---------------------------------------------------------------

    def watch_runs(self, run_ids: Iterable[str] | None = None) -> RunWatch:
        """Subscribe to this namespace's ``run_updated`` events: no polling of every run.

        Each change to a run is announced the moment it is written, as a
        ``RunUpdate(run_id, change)``; ``change`` is ``created``, ``status``,
        ``progress`` or ``cancel``. It says *that* the run changed: read it
        for what (a change made just before the watch may come too: the
        process's watches share one subscription). ``run_ids`` keeps only
        those runs' updates. Delivery is
        Redis pub/sub: at most once, nothing kept while no one listens, so
        read again after a quiet while rather than trust silence forever::

            with client.watch_runs() as watch:
                for update in watch:                 # or watch.get(timeout=1.0)
                    print(client.get_workflow_run(update.run_id).status)
        """
        if isinstance(run_ids, str):
            raise ValueError("run_ids must be a collection of run ids, not one string")
        wanted = None if run_ids is None else list(run_ids)
        if wanted is not None and not all(isinstance(run_id, str) for run_id in wanted):
            raise ValueError("run_ids must hold strings")
        return self._subscribe(wanted)

    def _subscribe(self, run_ids: list[str] | None) -> RunWatch:
        """A watch of the namespace's channel, whose subscription the process's
        watches share (``events.SharedWatches``); ``AsyncClient``'s share one
        per event loop (``broker/aio_watch.py``)."""
        store = self.engine.store
        return store.watches.watch(store.channel(self.namespace), run_ids)

    def follow_workflow_run_progress(
        self,
        run_id: str,
        *,
        phase_id: str | None = None,
        after_seq: int = 0,
        timeout: float | None = None,
        poll_interval_ms: int | None = None,
        cancel_event: threading.Event | None = None,
        on_run: Callable[[RunEnvelope], None] | None = None,
    ) -> Iterator[ProgressEntry]:
        """The run's progress records after ``after_seq``, as they are written, until it settles.

        An iterator over ``ProgressEntry`` in ascending seq: what is already
        there first, then each record as it arrives (woken by ``watch_runs``,
        and reading again after ``poll_interval_ms`` of silence). It ends
        once the run is terminal and every record is out; past ``timeout``
        it raises ``TimeoutError``, and setting ``cancel_event`` raises
        ``WorkflowWaitCancelled`` — the run goes on either way. ``on_run``,
        when given, is called with the run's envelope after the records each
        change brought: how a follower learns that the run now waits, which
        no record says. Options are checked, and the run looked up, here,
        before iteration starts.
        """
        options = paging.check_wait(timeout, poll_interval_ms, cancel_event)
        self.get_workflow_run_progress(run_id, phase_id=phase_id, after_seq=after_seq, limit=1)
        return paging.follow(self, run_id, options, phase_id=phase_id, after_seq=after_seq, on_run=on_run)

    # -- deploying new code (SPEC §8a) ----------------------------------------------

    def check_replay(
        self,
        run_ids: Iterable[str] | None = None,
        *,
        workflow: str | None = None,
        statuses: Iterable[str] | None = None,
        limit: int = 1000,
    ) -> list[ReplayCheck]:
        """Replay runs against the code registered now, executing and writing
        nothing: by default every run that can still continue (``statuses``
        narrows them, ``workflow`` too), or the ``run_ids`` given whatever their status."""
        return versioning.check_replay(self, run_ids, workflow=workflow, statuses=statuses, limit=limit)

    def export_history(self, run_id: str) -> dict[str, Any]:
        """The run and its journal as a history document, for ``testing.replay_history``."""
        return versioning.export_history(self, run_id)

    # -- helpers ---------------------------------------------------------------------

    def _workflow(self, name_or_handle: str | Workflow) -> Workflow:
        return registered_workflow(self.engine.workflows, name_or_handle)

    def _record(self, run_id: str) -> RunRecord:
        if not isinstance(run_id, str) or not run_id:
            raise RunNotFoundError(f"Run not found: {short_repr(run_id)}")
        record = self.engine.store.load_run(run_id) if plausible_run_id(run_id) else None
        if record is None or record.namespace != self.namespace:
            raise RunNotFoundError(f"Run not found: {run_id}")
        return record


def plausible_run_id(run_id: str) -> bool:
    """Shaped like a run id: anything else is no run, without a read (the web view's forms too)."""
    from celery_durable.broker.keys import RUN_ID_PATTERN

    return bool(RUN_ID_PATTERN.match(run_id))
