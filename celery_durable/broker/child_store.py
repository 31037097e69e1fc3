"""Child runs in storage (SPEC §5b): the journal's child calls, and the
store's side of a child's life — telling its parent it ended, listing a
run's children, and a child cancelled before it ever started.

Parent and child are different runs, so different hash tags: no script
touches both. The parent journals the call and enters the child in its
children hash (``child.lua``) before the child's run is created
(``create_run.lua``, which refuses to create a run twice), so a parent that
dies in between finds its child again, and one cancelled in between cancels
a child that does not exist yet by creating it cancelled. The child's end
reaches the parent after the child settled (``child_done.lua``, in the
parent's slot); the settling keeps the child in the sweep's schedule until
that is done, so a worker dying in between loses nothing.

``ChildJournal`` is a base of ``RedisJournal``, ``ChildRuns`` of ``RunStore``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from celery_durable.broker import ops as request_of
from celery_durable.broker import schema
from celery_durable.broker.child_types import ChildCall, ChildDone, ChildVerdict, DoneVerdict
from celery_durable.broker.connection import Clock, storage_errors
from celery_durable.broker.journal import Conflict, Flags
from celery_durable.broker.keys import RunKeys
from celery_durable.broker.ops import OPS
from celery_durable.broker.replies import children as parse
from celery_durable.broker.run_records import RunRecords
from celery_durable.broker.schema import ChildEntry, Identity, Outcome
from celery_durable.errors import StaleAttemptError, StorageCorruptError


class ChildJournal:
    """The child calls of one attempt's journal, and its sagas' (a base of ``RedisJournal``)."""

    _run: Callable[[str, Sequence[str], Sequence[Any]], Any]
    _keys: RunKeys
    _run_id: str
    _epoch: int
    _channel: str
    _clock: Clock
    _look_at: Callable[[int], None]

    def _call(self, name: str, args: Sequence[Any] | request_of.Request) -> Any:
        """Script ``name`` on this run's keys its row names (``ops.OPS``), with
        its row's typed request where it has one (as ``StoreCore.call``)."""
        return self._run(name, OPS[name].keys_of(self._keys), OPS[name].argv(name, args))

    def _at(self, seq: str, index: int, identity: str) -> request_of.OpAt:
        return request_of.OpAt(self._epoch, self._clock(), seq, index, identity)

    def child(
        self, seq: str, index: int, key: str, owner: str, due_ms: int | None, cut: str | None,
        child_run_id: str, workflow: str, *, wait: bool,
    ) -> ChildCall | Conflict:
        at = self._at(seq, index, Identity.child(key) if wait else Identity.start_child(key))
        due = "" if due_ms is None else due_ms
        mode = "wait" if wait else "start"
        request = request_of.Child(at, key, owner, due, cut or "", child_run_id, workflow, mode, self._channel)
        reply = self._call("child", request)
        result = parse.child(reply, self._run_id)
        if isinstance(result, ChildCall) and result.verdict is ChildVerdict.PENDING and due_ms is not None:
            self._look_at(due_ms)  # the sweep fires the time-out then
        return result

    def child_done(self, key: str, child_run_id: str, outcome: Outcome) -> ChildDone:
        request = request_of.ChildDone.of(self._clock(), key, child_run_id, outcome, "", self._epoch, self._channel)
        reply = self._call("child_done", request)
        done = parse.child_done(reply, self._run_id)
        if done.verdict is DoneVerdict.MISSING:
            raise StorageCorruptError(f"Run record {self._run_id} is missing")
        if done.verdict in (DoneVerdict.STALE, DoneVerdict.SETTLED):
            raise StaleAttemptError(f"Run {self._run_id}: this attempt no longer owns the run ({done.verdict})")
        return done

    def mark_compensable(self) -> Flags:
        return parse.compensable(self._call("compensable", [self._epoch]), self._run_id)

    def step_over(self, seq: str, index: int) -> Flags:
        reply = self._call("step_over", [self._epoch, seq, index])
        return parse.step_over(reply, self._run_id)

    def wake_branches(self, call: str) -> list[int]:
        reply = self._call("wake_branches", [self._epoch, call])
        _, branches = parse.wake_branches(reply, self._run_id)
        return branches


class ChildRuns(RunRecords):
    """``RunStore``'s calls about child runs."""

    def tell_parent(
        self, parent_run_id: str, namespace: str, key: str, child_run_id: str, outcome: Outcome, prefix: str
    ) -> ChildDone:
        """Journal a settled child's end in its parent (``child_done.lua``): the
        owner it woke, if any, gets message ``<prefix>-1`` (already counted)."""
        request = request_of.ChildDone.of(self.clock(), key, child_run_id, outcome, prefix, "", self.channel(namespace))
        reply = self.call("child_done", self.run_keys(parent_run_id), request)
        return parse.child_done(reply, parent_run_id)

    def children(self, run_id: str) -> list[ChildEntry]:
        """The run's children hash, in key order."""
        with storage_errors():
            raw = cast(dict[str, str], self.client.hgetall(self.run_keys(run_id).children))
        return schema.parse_children(run_id, raw)

    def listed(self, namespace: str, run_id: str) -> bool:
        """Whether the run is in its namespace's index (``index_run``)."""
        with storage_errors():
            return self.client.zscore(self.keys.namespace(namespace).runs, run_id) is not None

    def statuses(self, run_ids: Sequence[str]) -> list[str | None]:
        """The status of each run (None: gone), in one round trip."""
        if not run_ids:
            return []
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            for run_id in run_ids:
                pipe.hget(self.run_keys(run_id).run, "status")
            return [None if status is None else str(status) for status in pipe.execute()]

    def create_cancelled(self, run_id: str, fields: dict[str, str], namespace: str) -> bool:
        """Create a child that never started as ``cancelled`` (its parent was
        cancelled, or its time-out passed, before it was created); False when
        it exists already. Its start, should it come after, then finds it."""
        now = self.clock()
        settled = {
            **fields,
            "status": "cancelled",
            "reason": "cancelled",
            "error": "Cancelled before it started",
            "finished_at": str(now),
            "updated_at": str(now),
        }
        if not self.create_run(run_id, settled, ""):
            return False
        self.index_run(namespace, run_id, None)
        self._settled(run_id, namespace, "")
        return True
