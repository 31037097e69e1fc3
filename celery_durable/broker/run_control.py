"""How a run settles and what is asked of it: finish (by its attempt),
resume and halt (by a client or the sweep), and cancel, pause and signal
(by a client).

Part of ``RunStore`` (a base class of it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery_durable.broker import ops as request_of
from celery_durable.broker.fleet_store import FleetLiveness
from celery_durable.broker.journal import LastWrites
from celery_durable.broker.replies import control as parse
from celery_durable.broker.replies.control import Requested, RequestVerdict, Signalled
from celery_durable.broker.run_records import RunRecords
from celery_durable.broker.schema.archive import ARCHIVABLE
from celery_durable.broker.schema.run import RunRecord

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Stop:
    """How ``halt`` leaves a run whose attempt died: resumable, with this
    status, reason, error and system record, when it was taken over at least
    ``recoveries`` times in a row."""

    status: str
    reason: str
    error: str
    message: str
    recoveries: int = 0


HALTED = Stop(
    "halted",
    "interrupted",
    "The attempt driving this run died and automatic recovery is off; resume it to continue",
    "Run halted: its attempt died",
)


class RunControl(RunRecords, FleetLiveness):
    """``RunStore``'s calls that settle a run, or ask something of it."""

    def finish(
        self,
        run_id: str,
        epoch: int,
        namespace: str,
        status: str,
        *,
        reason: str = "",
        error: str = "",
        can_resume: bool = False,
        result_json: str | None = None,
        message: str = "",
        watch: bool = False,
        last: LastWrites | None = None,
    ) -> bool:
        """Settle the run as its attempt ``epoch``; ``watch``: it is a child
        whose parent must be told, and the sweep looks at it again until then.
        With ``last``, the pass's writes not made yet go first, in the same
        script; False when it did not settle for what they met (``LastWrites``)."""
        request = request_of.Finish(
            epoch, self.clock(), self.channel(namespace), status, reason, error, can_resume,
            has_result=result_json is not None, result=result_json or "", message=message,
            retention_ms=self.retention_ms, last=last.argv() if last is not None else (),
        )
        reply = self.call("finish", self.run_keys(run_id), request)
        finished = parse.finish(reply, run_id)
        if finished is None:
            return False
        self._settled(run_id, namespace, finished.idempotency_key, watch=watch, archive=status in ARCHIVABLE)
        if finished.throttled:  # a run that never asked for a slot holds none: no round trip to find that out
            self._gave_up(run_id)
        return True

    def resume(
        self,
        record: RunRecord,
        *,
        limits_json: str,
        message: str,
        code_hash: str,
        message_id: str,
        recovery: bool = False,
        forced: bool = False,
        ceilings: str = "",
        trace_attempt: str = "",
    ) -> int | None:
        """Bump the epoch if the run is still as ``record`` saw it (and, for a
        recovery, its attempt is dead, or ``forced``: a message of it came back
        from a holder that died); the new epoch, or None. The new attempt's
        first coordinator message is ``message_id``; ``trace_attempt`` the
        traceparent of the span that began it ('' clears the old attempt's)."""
        # The script sets each "field=value" pair it is given: the ceilings, and the trace anchor.
        fields = f"{ceilings},trace_attempt={trace_attempt}" if ceilings else f"trace_attempt={trace_attempt}"
        request = request_of.Resume(
            record.epoch, record.status, self.clock(), self.channel(record.namespace), limits_json, message,
            self.lease_ms, code_hash, recovery=(2 if forced else 1) if recovery else 0, run_fields=fields,
            message_id=message_id, room=self.queue_room() if recovery else "",
        )
        reply = self.call("resume", self.run_keys(record.run_id), request)
        epoch = parse.resume(reply, record.run_id)
        if epoch is not None:
            self._persist_idempotency(record)
            self._gave_up(record.run_id)
        return epoch

    def halt(self, record: RunRecord, stop: Stop = HALTED, *, forced: bool = False) -> bool:
        """Stop a run whose attempt died instead of taking it over (``halt.lua``):
        ``HALTED`` with auto_recover off, or as ``stop`` says; False if it
        changed meanwhile. ``forced``: the death is known (a message of the
        attempt came back from a holder that died), not judged by liveness."""
        room = self.queue_room()
        request = request_of.Halt(
            record.epoch, record.status, self.clock(), self.channel(record.namespace), self.lease_ms, room,
            stop.status, stop.reason, stop.error, stop.message, stop.recoveries, forced, self.retention_ms,
        )
        reply = self.call("halt", self.run_keys(record.run_id), request)
        idempotency_key = parse.halt(reply, record.run_id)
        if idempotency_key is None:
            return False
        watch = record.parent_run_id is not None and stop.status == "error"
        self._settled(record.run_id, record.namespace, idempotency_key, watch=watch)
        self._gave_up(record.run_id)
        return True

    def cancel(self, run_id: str, namespace: str, message: str, *, watch: bool = False) -> Requested:
        """Request cancellation (``cancel.lua``); on ``REQUESTED`` the caller
        sends coordinator message ``message``: to the live attempt, or to the
        one a resumable run whose saga registered undos was given to
        compensate in. ``CANCELLED``: settled here (a pending run no attempt
        started, a resumable one with nothing to undo, or a non-resumable
        error, whose attempt would end as it did). ``watch``: as
        ``finish``'s, should it settle here."""
        args = [self.clock(), self.channel(namespace), message, self.retention_ms, self.lease_ms]
        requested = parse.cancel(self.call("cancel", self.run_keys(run_id), args), run_id)
        if requested.verdict is RequestVerdict.CANCELLED:
            self._settled(run_id, namespace, requested.idempotency_key, watch=watch, archive=True)
            self._gave_up(run_id)
        # A run given an attempt to compensate in is watched already: the look
        # came first (store_core.LOOK_FIRST), should its message be lost.
        return requested

    def _gave_up(self, run_id: str) -> None:
        """The run's old attempts are over: what they held goes back (``after_settle``)."""
        if self.after_settle is not None:
            self.after_settle(run_id)

    def pause(self, run_id: str, namespace: str, message: str) -> Requested:
        """Request a pause; on ``REQUESTED`` the caller sends coordinator message ``message``."""
        reply = self.call("pause", self.run_keys(run_id), [self.channel(namespace), self.clock(), message])
        return parse.pause(reply, run_id)

    def note(self, run_id: str, what: str, message: str) -> bool:
        """Leave ``message`` as a system record of the run, once per ``what`` (``note.lua``)."""
        reply = self.call("note", self.run_keys(run_id), [self.clock(), message, f"noted:{what}"])
        return parse.note(reply, run_id)

    def signal(self, run_id: str, namespace: str, name: str, payload_json: str, wake_prefix: str) -> Signalled:
        """Keep a signal for the run and wake what waits for it (``signal.lua``)."""
        k = self.run_keys(run_id)
        reply = self.call("signal", k, [self.clock(), name, payload_json, wake_prefix, self.channel(namespace)])
        return parse.signal(reply, run_id)
