"""``RunStore``: the one object that talks to Redis for runs, journals and
progress, assembled from one base class per concept.

- ``store_core.py``: the client, how a script runs, the clock, the sweep's schedule;
- ``run_records.py``: creating, listing, retaining and reading run records;
- ``run_passes.py``: a pass's lock, a task's start, beats and end, a call's answer;
- ``run_control.py``: finish, resume, halt, cancel, pause, signal;
- ``fleet_store.py``: what the recovery sweep reads and writes;
- ``child_store.py``: child runs: a child's end told to its parent, a run's children;
- ``schedule_store.py``: schedules, the sweep's claims on their ticks, what each tick became;
- ``throttle_store.py``: throttles: their settings, slots and queues, a run's slot intents;
- and here, the journal of one attempt (``RedisJournal``).

Every script's reply is parsed in ``replies``.
"""

from __future__ import annotations

from celery_durable.broker.archived_journal import ArchivedJournal
from celery_durable.broker.child_store import ChildRuns
from celery_durable.broker.journal import Journal
from celery_durable.broker.journal_export import read_journal
from celery_durable.broker.redis_journal import RedisJournal
from celery_durable.broker.run_control import RunControl
from celery_durable.broker.run_passes import RunPasses
from celery_durable.broker.schedule_store import ScheduleStore
from celery_durable.broker.schema.archive import ARCHIVABLE
from celery_durable.broker.schema.run import RunRecord
from celery_durable.broker.throttle_store import ThrottleStore


class RunStore(RunControl, RunPasses, ChildRuns, ScheduleStore, ThrottleStore):
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
