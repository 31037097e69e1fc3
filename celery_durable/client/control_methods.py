"""The client's methods that change a run (SPEC §3, §5): cancel, pause,
signal and resume, a base class of ``Client``.

Each writes its request durably through one store script first (one that
counts a wake runs once the run has a look scheduled, ``broker/ops.py``),
then sends what it woke through ``Engine.deliver``, the one wake path: a
caller that dies between the two leaves a run the sweep still goes on with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis.exceptions
from kombu.exceptions import KombuError

from celery_durable.broker import RunRecord
from celery_durable.broker.replies.control import Requested, RequestVerdict, SignalVerdict
from celery_durable.broker.schema import MAIN
from celery_durable.client import progress as paging
from celery_durable.client import resuming
from celery_durable.errors import (
    RunNotFoundError,
    StorageUnavailableError,
    WorkflowDefinitionError,
    WorkflowResumeError,
)
from celery_durable.tasks import children
from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.wakes import Wake, woken
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.envelope import RunEnvelope
from celery_durable.workflows.limits import validate_limits
from celery_durable.workflows.waits import check_signal_name

if TYPE_CHECKING:
    from celery_durable.engine import Engine


class ControlMethods:
    """``cancel_workflow_run``, ``pause_workflow_run``, ``signal_workflow_run``
    and ``resume_workflow`` of one namespace's client."""

    engine: Engine
    namespace: str

    if TYPE_CHECKING:  # the Client's own, as far as these methods use them

        def _record(self, run_id: str) -> RunRecord: ...

        def wait_for_workflow_run(self, run_id: str, timeout: float | None = None) -> RunEnvelope: ...

    def cancel_workflow_run(self, run_id: str, timeout: float | None = 30) -> RunEnvelope:
        """Request cancellation and wait until the run has settled."""
        paging.check_wait(timeout)
        self._ask_cancel(run_id)
        return self.wait_for_workflow_run(run_id, timeout=timeout)

    def pause_workflow_run(self, run_id: str, timeout: float | None = 30) -> RunEnvelope:
        """Stop dispatching new work and wait until the run has settled as paused.

        Work in flight (a fan-out's branches, agent turns) finishes and is
        journaled; the main body stops at its next new call. ``resume_workflow``
        continues the run.
        """
        paging.check_wait(timeout)
        self._ask_pause(run_id)
        return self.wait_for_workflow_run(run_id, timeout=timeout)

    def _ask_cancel(self, run_id: str) -> None:
        store = self.engine.store
        # A child settled here stays watched until its parent is told (tasks/children.py).
        self._request(
            run_id,
            lambda record, message: store.cancel(
                record.run_id, record.namespace, message, watch=record.parent_run_id is not None
            ),
        )

    def _ask_pause(self, run_id: str) -> None:
        store = self.engine.store
        self._request(run_id, lambda record, message: store.pause(record.run_id, record.namespace, message))

    def _request(self, run_id: str, request: Callable[[RunRecord, str], Requested]) -> None:
        """Ask for a cancellation or a pause (``RunStore.cancel``/``pause``) and
        wake the coordinator to act on it: a run waiting on branches, a timer
        or a signal has no pass running."""
        record = self._record(run_id)
        message = new_task_id()
        answer = request(record, message)
        if answer.verdict is RequestVerdict.REQUESTED:
            self._dispatch(record.run_id, answer.epoch, record.workflow, message)
        elif answer.verdict is RequestVerdict.CANCELLED:
            # Settled here (it was paused, halted or in error): its children and
            # parent hear of it as from a pass that settled it (tasks/children.py).
            children.cancel_waited_children(self.engine, record)
            error = f"Cancelled while {record.status}"
            children.tell_parent(self.engine, record, "cancelled", "cancelled", error, None)

    def signal_workflow_run(self, run_id: str, name: str, payload: Any = None) -> None:
        """Deliver signal ``name`` with a JSON ``payload`` to the run (SPEC §5).

        Signals are kept per run and per name in arrival order: one sent
        before the run reaches its ``ctx.wait_for_signal`` is kept for it, and
        one sent while no attempt is alive (paused, halted, between a crash
        and its recovery) is never lost. A completed, cancelled or
        non-resumable run refuses it with a ``ValueError`` naming its status.
        """
        check_signal_name(name)
        payload_json = jsonvalue.encode_payload(payload, self.engine.settings.max_payload_bytes, noun="Signal payload")
        record = self._record(run_id)
        prefix = new_task_id()
        answer = self.engine.store.signal(record.run_id, record.namespace, name, payload_json, prefix)
        if answer.verdict is SignalVerdict.MISSING:
            raise RunNotFoundError(f"Run not found: {run_id}")
        if answer.verdict is SignalVerdict.REFUSED:
            detail = " and cannot be resumed" if answer.status == "error" else ""
            raise ValueError(f"Run {run_id} is {answer.status}{detail}: it takes no more signals")
        self._deliver(woken(record.run_id, answer.epoch, record.workflow, answer.owners, prefix, record.namespace))

    def resume_workflow(
        self,
        run_id: str,
        limits: dict[str, Any] | None = None,
        timeout: float | None = None,
        force: bool = False,
        allow_code_change: bool = False,
    ) -> RunEnvelope:
        """Take execution authority of a run with a new attempt and block until it settles."""
        paging.check_wait(timeout)
        self._resume(run_id, limits, force=force, allow_code_change=allow_code_change)
        return self.wait_for_workflow_run(run_id, timeout=timeout)

    def _resume(self, run_id: str, limits: dict[str, Any] | None, *, force: bool, allow_code_change: bool) -> None:
        """Give the run a new attempt and send its first coordinator message."""
        if limits is not None:
            try:
                validate_limits(limits, allow_none=True)
            except WorkflowDefinitionError as exc:
                raise WorkflowResumeError(str(exc), code="workflow_limits_invalid") from None
        with resuming.resume_errors():
            record = self._record(run_id)
            message = new_task_id()
            epoch = resuming.take_authority(
                self.engine,
                record,
                limits,
                message,
                force=force,
                allow_code_change=allow_code_change,
                reload=self._record,
                alive=self._attempt_alive,
            )
            self._dispatch(record.run_id, epoch, record.workflow, message)

    def _attempt_alive(self, record: RunRecord) -> bool:
        """Whether the run's attempt is alive, as the recovery sweep judges it:
        work in flight, or waits for the outside world (SPEC §5)."""
        examined = self.engine.store.examine(record.run_id, self.engine.store.queue_room())
        return examined is not None and examined.alive

    def _deliver(
        self, wakes: list[Wake], what: str = "a message", kept: str = "the signal is kept and the run is woken again"
    ) -> None:
        """Send ``wakes`` (``Engine.deliver``, the one wake path) for a run whose
        state is already written. A broker that refuses them is
        ``StorageUnavailableError``; nothing is lost: the run is in the
        recovery sweep's schedule, which sends it again once its lease has run
        out (a start can also be retried with its idempotency key)."""
        try:
            self.engine.deliver(wakes)
        except (KombuError, OSError, redis.exceptions.RedisError) as exc:
            raise StorageUnavailableError(
                f"The broker refused {what} of run {wakes[0].run_id} ({type(exc).__name__}: {exc}); "
                f"{kept} within lease_seconds once the broker is back"
            ) from None

    def _dispatch(self, run_id: str, epoch: int, workflow: str, task_id: str | None = None) -> None:
        """Send a coordinator message for a run whose state is already written."""
        wake = Wake(run_id, epoch, workflow, MAIN, task_id or new_task_id(), namespace=self.namespace)
        self._deliver([wake], "the coordinator message", "the run is kept and is sent again")
