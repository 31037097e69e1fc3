"""``RunStore``: the one object that talks to Redis for runs, journals and
progress, assembled from one base class per concept.

- ``store_core.py``: the client, how a script runs, the clock, the sweep's schedule;
- ``run_records.py``: creating, listing, retaining and reading run records;
- ``run_passes.py``: a pass's lock, a task's start, beats and end, a call's answer;
- ``run_control.py``: finish, resume, halt, cancel, pause, signal;
- ``fleet_store.py``: what the recovery sweep reads and writes;
- ``schedule_store.py``: schedules, the sweep's claims on their ticks, what each tick became;
- ``throttle_store.py``: throttles: their settings, slots and queues, a run's slot intents;
- and here, the journal of one attempt (``RedisJournal``), and child runs.

Every script's reply is parsed in ``replies``.

Child runs in storage (SPEC §5b). Parent and child are different runs, so
different hash tags: no script touches both. The parent journals the call
and enters the child in its children hash (``child.lua``) before the
child's run is created (``create_run.lua``, which refuses to create a run
twice), so a parent that dies in between finds its child again, and one
cancelled in between cancels a child that does not exist yet by creating it
cancelled. The child's end reaches the parent after the child settled
(``child_done.lua``, in the parent's slot); the settling keeps the child in
the sweep's schedule until that is done, so a worker dying in between loses
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from celery_durable.broker import ops as request_of
from celery_durable.broker import schema
from celery_durable.broker.archived_journal import ArchivedJournal
from celery_durable.broker.child_types import ChildDone
from celery_durable.broker.connection import storage_errors
from celery_durable.broker.journal import Journal
from celery_durable.broker.journal_export import read_journal
from celery_durable.broker.redis_journal import RedisJournal
from celery_durable.broker.replies import children as parse
from celery_durable.broker.run_control import RunControl
from celery_durable.broker.run_passes import RunPasses
from celery_durable.broker.schedule_store import ScheduleStore
from celery_durable.broker.schema import ChildEntry, Outcome
from celery_durable.broker.schema.archive import ARCHIVABLE
from celery_durable.broker.schema.run import RunRecord
from celery_durable.broker.throttle_store import ThrottleStore


class RunStore(RunControl, RunPasses, ScheduleStore, ThrottleStore):
    """Runs, journals, progress and fencing on one Redis, or on a Redis Cluster."""

    def journal(self, run_id: str, epoch: int, namespace: str) -> Journal:
        """The journal of ``run_id`` as attempt ``epoch`` sees and writes it."""
        return RedisJournal(
            self._run,
            self._hmget,
            self.run_keys(run_id),
            run_id=run_id,
            epoch=epoch,
            channel=self.channel(namespace),
            look_at=lambda at_ms: self.schedule_check(run_id, at_ms, sooner_only=True),
            clock=self.clock,
        )

    def replay_journal(self, record: RunRecord) -> Journal:
        """The journal a replay that only reads sees for ``record`` (the replay
        check): a run archived completed or cancelled has it in its archive
        (``ArchivedJournal``), any other run in its journal hash."""
        if record.status not in ARCHIVABLE:
            return self.journal(record.run_id, record.epoch, record.namespace)
        # Settled for good, its journal no longer changes, but its archive may
        # fold it away at any moment: both read in one round trip (read_journal).
        fields = read_journal(self, record.run_id)
        return ArchivedJournal(fields, run_id=record.run_id, epoch=record.epoch, clock=self.clock)

    # -- child runs: a child's end told to its parent, a run's children --------

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
