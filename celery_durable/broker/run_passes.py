"""A run's messages as they start, beat and end: a coordinator pass's
activation lock, a branch task's or an agent turn's start, heartbeats, and
a called task's answer (which may take the lock of the pass it wakes).

Part of ``RunStore`` (a base class of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from celery_durable.broker import ops as request_of
from celery_durable.broker import schema
from celery_durable.broker.connection import storage_errors
from celery_durable.broker.journal import READ_ENTRIES_BUDGET, Flags
from celery_durable.broker.replies import run as parse
from celery_durable.broker.replies.run import (
    Activation,
    BranchStart,
    CallDone,
    NotRun,
    PassHere,
    Renewal,
    Requeued,
    TurnStart,
)
from celery_durable.broker.replies.shape import Refusal
from celery_durable.broker.schema import MAIN, SequenceHistory, live
from celery_durable.broker.schema.run import RunRecord
from celery_durable.broker.store_core import StoreCore
from celery_durable.errors import StaleAttemptError, StorageCorruptError


class RunPasses(StoreCore):
    """``RunStore``'s calls made as a run's messages start and end."""

    def activate(self, run_id: str, epoch: int, token: str, namespace: str, resend: str) -> Flags | int:
        """Take the activation lock for the pass whose task id is ``token`` and
        return the run's flags; when another pass holds it (and was told to
        run once more), the ms until the message ``resend`` is due."""
        return parse.activate(self._activate(run_id, epoch, token, namespace, resend, []), run_id)

    def activate_reading(
        self, run_id: str, epoch: int, token: str, namespace: str, resend: str, seq: str, start: int
    ) -> Activation:
        """``activate``, and once the lock is taken, sequence ``seq`` of the
        journal from index ``start`` on, read in the same script: a kept body
        learns whether it is still current without a round trip of its own."""
        reply = self._activate(run_id, epoch, token, namespace, resend, [seq, start])
        return parse.activate(reply, run_id, (seq, start))

    def activate_unread(
        self, run_id: str, epoch: int, workflow: str, namespace: str, token: str, resend: str
    ) -> tuple[Flags, RunRecord, SequenceHistory] | int | NotRun:
        """``activate_reading`` of the main body from its start, for a message
        whose run was not read: the script checks what that read would have
        (the attempt, the workflow and namespace the message names, the
        attempt's throttle slot) and answers with the run's record as that
        read would have found it, just before the lock was taken: a pass costs
        one round trip fewer. ``StorageCorruptError``: the main sequence
        cannot be parsed (the lock taken: the caller's token re-enters it), or
        the record cannot (the lock let go again: no pass can drive the run)."""
        with self.indexes.claimed(run_id, namespace):
            reply = self._activate(run_id, epoch, token, namespace, resend, [MAIN, 0], [workflow, namespace])
        found = parse.activate_unread(reply, run_id, MAIN)
        if isinstance(found, int):
            self.indexes.remember(run_id, namespace)  # busy: past the script's check
        if not isinstance(found, tuple):
            return found
        flags, raw, tail = found
        try:
            record = schema.parse_run(run_id, raw)
        except StorageCorruptError:
            self.release(run_id, token, epoch)
            raise
        self.indexes.remember(run_id, record.namespace)
        return flags, record, tail

    def _activate(
        self, run_id: str, epoch: int, token: str, namespace: str, resend: str, tail: list[Any],
        expect: Sequence[str] = (),
    ) -> Any:
        lock = self._lock(namespace, resend)
        request = request_of.Activate(epoch, token, self.clock(), lock, tail, expect)
        return self.call("activate", self.run_keys(run_id), request)

    def _lock(self, namespace: str, resend: str) -> request_of.Lock:
        return request_of.Lock(self.lease_ms, self.lease_ms, self.channel(namespace), resend)

    def release(self, run_id: str, token: str, epoch: int) -> bool:
        """Release the lock; True when another activation arrived and the caller must run again."""
        return parse.release(self.call("release", self.run_keys(run_id), [token, epoch, self.clock()]), run_id)

    def started(self, run_id: str, task_id: str) -> bool:
        """Whether message ``task_id`` of the run has started (and not ended)."""
        with storage_errors():
            value = self.client.hget(self.run_keys(run_id).live, task_id)
        return live.started(cast(str | None, value))

    def requeue(
        self,
        run_id: str,
        epoch: int,
        token: str,
        new: str,
        *,
        kind: str = "c",
        due_ms: int = 0,
        note: str = "",
        backoff: tuple[int, int, float] | None = None,
    ) -> Requeued:
        """Message ``token``, queued and not started, goes to its queue again as
        ``new`` (kind c, s or a; due at ``due_ms``, else now; with ``backoff``,
        (first delay ms, cap ms, jitter factor), after a delay that doubles with
        each such pass of the run); the first time, ``note`` is a system
        progress record (``requeue.lua``)."""
        now = self.clock()
        base, cap, jitter = backoff or (0, 0, 1.0)
        args = [epoch, token, new, now, kind, due_ms or now, note, base, cap, repr(jitter)]
        return parse.requeue(self.call("requeue", self.run_keys(run_id), args), run_id)

    def heartbeat(
        self, run_id: str, epoch: int, token: str, *, coordinator: bool = False, wake: str = ""
    ) -> Renewal:
        """Renew the running task ``token``: the flags, and whether a ceiling
        was newly reached and the coordinator must be woken by message ``wake``."""
        k = self.run_keys(run_id)
        reply = self.call(
            "heartbeat", k, [epoch, token, self.clock(), self.lease_ms, self.lease_ms, wake, int(coordinator)]
        )
        return parse.heartbeat(reply, run_id)

    def branch_start(
        self,
        run_id: str,
        epoch: int,
        workflow: str,
        token: str,
        call: str,
        indices: Sequence[int],
        seqs: Sequence[str],
    ) -> BranchStart | Refusal:
        """A branch task for branches ``indices`` of fan-out ``call`` starts:
        its message runs, its lease starts now, and what it reads first comes
        back with it (``branch_start.lua``); or why it must not run."""
        k = self.run_keys(run_id)
        fields = [schema.branch_field(call, j) for j in indices]
        args = [epoch, workflow, token, self.clock(), self.lease_ms, schema.handoff_field(call, token)]
        reply = self.call("branch_start", k, [*args, READ_ENTRIES_BUDGET, len(fields), *fields, *seqs])
        return parse.branch_start(reply, run_id, epoch, seqs)

    def task_end(self, run_id: str, epoch: int, token: str, wake: str = "") -> bool:
        """A branch task ended; True when a pause waits for it and the
        coordinator must be woken by message ``wake``."""
        return parse.task_end(self.call("task_end", self.run_keys(run_id), [epoch, token, self.clock(), wake]), run_id)

    def agent_start(
        self, run_id: str, epoch: int, agent_id: str, token: str, resend: str, delay_ms: int
    ) -> TurnStart:
        """The turn of message ``token`` runs now, waits (it comes back as
        message ``resend`` in ``delay_ms``), is done already, or runs already
        (``TurnVerdict``)."""
        k = self.run_keys(run_id)
        reply = self.call("agent_start", k, [epoch, self.clock(), agent_id, token, self.lease_ms, resend, delay_ms])
        return parse.agent_start(reply, run_id)

    def agent_finish(
        self,
        run_id: str,
        epoch: int,
        agent_id: str,
        outcome: str,
        row_json: str,
        usage: tuple[int, int, int],
        token: str,
        wake_prefix: str,
    ) -> CallDone:
        """Journal a turn's outcome with its usage (nano-credits, prompt and
        completion tokens); returns the owners to wake, the n-th (from 1) by
        message ``f"{wake_prefix}-{n}"``, and whether the run ever throttled an op."""
        k = self.run_keys(run_id)
        reply = self.call(
            "agent_finish", k, [epoch, self.clock(), agent_id, outcome, row_json, *usage, token, wake_prefix]
        )
        return parse.agent_finish(reply, run_id)

    def call_done(
        self, run_id: str, epoch: int, key: str, outcome: str, error: str, wake_prefix: str
    ) -> list[str] | None:
        """Journal a called task's outcome (``call_done.lua``): the owners to
        wake, the n-th by message ``f"{wake_prefix}-{n}"``; None when the call
        already had an outcome (a late or second delivery)."""
        done = self.call_done_here(run_id, epoch, key, outcome, error, wake_prefix, None)
        return None if done is None else done.owners

    def call_done_here(
        self, run_id: str, epoch: int, key: str, outcome: str, error: str, wake_prefix: str, here: PassHere | None
    ) -> CallDone | None:
        """``call_done``; with ``here``, when the answer wakes the main body
        alone, the same script takes the lock of its pass for the caller (one
        round trip where a wake run in place took two)."""
        taken = [] if here is None else [here.token, self._lock(here.namespace, here.resend)]
        if here is not None:
            taken += [here.seq, here.start, "1" if here.soft else ""]
        request = request_of.CallDone(epoch, self.clock(), key, outcome, error, wake_prefix, taken)
        # The answer may wake a run waiting on nothing else: the look comes
        # first (store_core.LOOK_FIRST), should the wake it counts be lost.
        reply = self.call("call_done", self.run_keys(run_id), request)
        done = parse.call_done(reply, run_id, None if here is None else (here.seq, here.start))
        if not isinstance(done, Refusal):
            return done
        if done is not Refusal.STALE:
            self.unschedule(run_id)  # an answer after the end: the run has nothing for the sweep to watch
        if done is Refusal.MISSING:
            # An answer is a message: naming a run this store has not (forged,
            # or a run gone since) is a refused answer, not storage corruption.
            raise StaleAttemptError(f"Run {run_id}: no such run; its call's answer is refused")
        done.raise_for(run_id)
