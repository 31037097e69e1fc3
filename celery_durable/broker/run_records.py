"""Run records as a whole: creating and listing them, their retention,
and the reads of a run's hashes, rows and progress that views are made of.

Part of ``RunStore`` (a base class of it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from celery_durable.broker import schema
from celery_durable.broker.connection import storage_errors
from celery_durable.broker.index_reads import IndexReads
from celery_durable.broker.ops import OPS
from celery_durable.broker.progress import MAX_SEQ, PageMode, ProgressSlice
from celery_durable.broker.replies import control as parse_control
from celery_durable.broker.replies import run as parse
from celery_durable.broker.replies.control import ArchiveVerdict
from celery_durable.broker.run_index import First
from celery_durable.broker.schema.archive import Archive, Archived, build_archive, parse_archive, progress_reply, shape
from celery_durable.broker.schema.run import RunRecord
from celery_durable.broker.store_core import StoreCore
from celery_durable.errors import StorageCorruptError, StorageError

logger = logging.getLogger(__name__)

HASHES = ("run", "journal", "steps", "running", "agents", "live", "waits", "signals")

NEVER_DECODE = {"NEVER_DECODE": True}
"""redis-py's option for a reply kept as bytes on a decoding client: an archive is zlib."""


ARCHIVED_ENTRIES_MAX = 500
"""A run is archived only with at most this many history events and progress
records (the largest page): a page of an archived run decodes the whole
archive, and SPEC §3 has a page cost time in proportion to its limit, not to
the run's size. A longer run keeps its streams, paged by id as while it ran."""


def read_for_archive(pipe: Any, keys: Any) -> None:
    """Queue on ``pipe`` the reads an archive is built from (``keys``: the
    run's ``RunKeys``): history, steps, progress, journal, phase index; of
    each stream one entry more than an archive may hold, to tell."""
    pipe.xrange(keys.history, count=ARCHIVED_ENTRIES_MAX + 1)
    pipe.hgetall(keys.steps)
    pipe.xrange(keys.progress, count=ARCHIVED_ENTRIES_MAX + 1)
    pipe.hgetall(keys.journal)
    pipe.zrange(keys.progress_phases, 0, -1)


def get_archive(pipe: Any, keys: Any) -> Any:
    """The GET of the run's archive (``keys``: its ``RunKeys``), its reply
    kept as bytes: queued on a pipeline, or sent at once by the client."""
    return cast(Any, pipe).execute_command("GET", keys.archive, **NEVER_DECODE)


def read_archive(store: StoreCore, run_id: str) -> Archive | None:
    """The run's archive (``schema/archive.py``), or None: unarchived, or gone."""
    with storage_errors():
        blob = get_archive(store.client, store.run_keys(run_id))
    return archive_of(run_id, blob)


EMPTY = Archive([], {}, [], {})
"""What an archive gone with its run (its retention ran out between two reads) holds."""


def archive_of(run_id: str, blob: Any) -> Archive | None:
    """The archive a GET of ``get_archive`` read, parsed; None for a run that
    has none (unarchived, or gone)."""
    if blob is None:
        return None
    try:
        return parse_archive(bytes(blob))
    except ValueError as exc:
        raise StorageCorruptError(f"Run {run_id}: its archive is unreadable ({exc})") from None


@dataclass(frozen=True, slots=True)
class RunHashes:
    """Every hash of one run as stored, read together: what a test asserts
    on, and what a debugger reads (field formats: ``broker/schema/``)."""

    run: dict[str, str]
    journal: dict[str, str]
    steps: dict[str, str]
    running: dict[str, str]
    agents: dict[str, str]
    live: dict[str, str]
    waits: dict[str, str]
    signals: dict[str, str]


class RunRecords(IndexReads):
    """``RunStore``'s calls about run records as a whole."""

    def create_run(self, run_id: str, fields: dict[str, str], message: str) -> bool:
        """Create the run record; ``message`` is the task id of its first coordinator message."""
        return parse.create_run(self.call("create_run", self.run_keys(run_id), self._created(fields, message)), run_id)

    def start_run(self, namespace: str, run_id: str, fields: dict[str, str], message: str, key: str | None) -> str:
        """``create_run`` of a run whose id is new (a client's start), then
        ``index_run``: the id of the run that owns the start (this one, or the
        one idempotency key ``key`` names already). The look, the record and
        the listing go in one transaction on one Redis (run_index.py), as
        create_run and index_run would one after the other: a round trip of
        every start (a record that exists already, which a new id never
        names, would be listed again)."""
        look = self.look_call([run_id], self.clock() + self.lease_ms)
        create = ("create_run", OPS["create_run"].keys_of(self.run_keys(run_id)), self._created(fields, message))
        [reply] = self._index_each([(namespace, run_id, key)], first=[look, create])
        if isinstance(reply, Exception):
            raise reply
        return parse.index_run(reply)

    def _created(self, fields: dict[str, str], message: str) -> list[Any]:
        """create_run.lua's ARGV."""
        flat = [item for pair in fields.items() for item in pair]
        return [message, self.clock(), self.settings.run_retention_seconds * 1000, *flat]

    def create_runs(self, starts: Sequence[tuple[str, dict[str, str], str]]) -> list[bool | StorageCorruptError]:
        """``create_run`` of many runs (run id, fields, first message) at
        once: their looks in one ``look.lua``, then the scripts in one
        pipeline (``_look_then_run_each``). Each one's answer in order, or
        the error of a damaged one in its place."""
        calls = [(self.run_keys(run_id), self._created(fields, message)) for run_id, fields, message in starts]
        replies = self.call_each("create_run", calls)
        out: list[bool | StorageCorruptError] = []
        for (run_id, _, _), reply in zip(starts, replies, strict=True):
            out.append(reply if isinstance(reply, StorageCorruptError) else parse.create_run(reply, run_id))
        return out

    def index_runs(self, runs: Sequence[tuple[str, str]]) -> None:
        """``index_run`` of many new runs (namespace, run id), none with an
        idempotency key, pipelined."""
        for reply in self._index_each([(namespace, run_id, None) for namespace, run_id in runs]):
            if isinstance(reply, Exception):
                raise reply
            parse.index_run(reply)

    def index_run(self, namespace: str, run_id: str, idempotency_key: str | None) -> str:
        """List the run in its namespace (and its indexes, from its record)."""
        [reply] = self._index_each([(namespace, run_id, idempotency_key)])
        if isinstance(reply, Exception):
            raise reply
        return parse.index_run(reply)

    def _index_each(self, runs: Sequence[tuple[str, str, str | None]], first: First = ()) -> list[Any]:
        """index_run.lua for each (namespace, run id, idempotency key), then
        the runs' first index entries from their records (``_indexed_each``),
        after the ``first`` scripts."""
        calls: list[tuple[Sequence[str], Sequence[Any]]] = []
        for namespace, run_id, idempotency_key in runs:
            self.indexes.remember(run_id, namespace)
            ns = self.keys.namespace(namespace)
            more = [] if idempotency_key is None else [ns.idempotency(idempotency_key)]
            calls.append(([*OPS["index_run"].keys_of(ns), *more], [run_id, ns.events]))
        return self._indexed_each("index_run", calls, [run_id for _, run_id, _ in runs], first)

    def discard_run(self, run_id: str, epoch: int) -> None:
        parse.discard_run(self.call("discard_run", self.run_keys(run_id), [epoch]), run_id)

    def release_idempotency(self, namespace: str, idempotency_key: str, owner: str) -> bool:
        """Free an idempotency key that still names ``owner``, a run that has expired."""
        key = self.keys.namespace(namespace).idempotency(idempotency_key)
        return parse.release_idempotency(self.call("release_idempotency", None, [owner], key))

    def forget_runs(self, namespace: str, run_ids: Sequence[str]) -> None:
        """Drop runs whose keys have expired (run retention) from every index of the namespace."""
        self.indexes.forget(namespace, run_ids)

    @property
    def retention_ms(self) -> int:
        return self.settings.run_retention_seconds * 1000

    def _settled(
        self, run_id: str, namespace: str, idempotency_key: str, *, watch: bool = False, archive: bool = False
    ) -> None:
        """After a script settled the run (and started its keys' retention): the
        sweep stops watching it, and knows when it will be gone, to take it
        out of its namespace's index then (``prune_expired``); its
        idempotency key, in the namespace's slot, expires with it. A hint: the
        settling stands if this fails, and a listing that meets the run gone
        takes it out of the index. ``watch``: the sweep looks at it once more a
        lease from now (a child whose end its parent must still be told).
        ``archive``: the run settled for good, and is archived
        (``archive_run``), its keys read in the same round trip."""
        ttl_ms = self.retention_ms
        try:
            with storage_errors():
                pipe = self.client.pipeline(transaction=False)
                if watch:
                    pipe.zadd(self.keys.sweep_due, {run_id: self.clock() + self.lease_ms})
                else:
                    pipe.zrem(self.keys.sweep_due, run_id)
                told = 1  # the commands the sweep is told by (the async client's pipeline has no len())
                if ttl_ms > 0:
                    pipe.zadd(self.keys.sweep_expiring, {f"{namespace} {run_id}": self.clock() + ttl_ms})
                    told += 1
                    if idempotency_key:
                        pipe.pexpire(self.keys.namespace(namespace).idempotency(idempotency_key), ttl_ms)
                        told += 1
                if archive:
                    read_for_archive(pipe, self.run_keys(run_id))
                replies = pipe.execute(raise_on_error=False)
        except StorageError as exc:  # the settling stands: the sweep, a listing or a reader catches up
            logger.warning("run %s settled, but the sweep could not be told (nor the run archived): %s", run_id, exc)
            return
        failed = [reply for reply in replies[:told] if isinstance(reply, Exception)]
        if failed:
            logger.warning("run %s settled, but the sweep could not be told: %s", run_id, failed[0])
        if archive:
            self.archive_run(run_id, replies[told:])

    def archive_run(self, run_id: str, read: list[Any] | None = None) -> ArchiveVerdict | None:
        """Fold a run settled for good (completed or cancelled) into its archive
        (``schema/archive.py``, issue 42): its history, steps, progress and
        journal read in one round trip (``read``: read already, in the settle's
        own, ``_settled``), the archive built from them, and
        ``archive_run.lua`` keeps it and deletes them if the run is still
        settled so and they are still what was read. Every settle for good
        comes here (``finish``, and ``cancel`` when it settles the run itself).
        An optimisation, never the run's fate: a failure is logged (None) and
        the run stays unarchived, read as before; so does a death in between,
        and a run too long to archive (``ARCHIVED_ENTRIES_MAX``: None)."""
        try:
            if read is None:
                with storage_errors():
                    pipe = self.client.pipeline(transaction=False)
                    read_for_archive(pipe, self.run_keys(run_id))
                    read = pipe.execute(raise_on_error=False)
            for reply in read:
                if isinstance(reply, Exception):
                    raise reply
            history, steps, progress, journal, phases = read
            if max(len(history), len(progress)) > ARCHIVED_ENTRIES_MAX:
                return None
            blob = build_archive(history, steps, progress, journal)
            args = [blob, *shape(history, steps, progress, journal, phases)]
            return parse_control.archive_run(self.call("archive_run", self.run_keys(run_id), args), run_id)
        except Exception as exc:
            logger.warning("run %s settled, but could not be archived (it stays as it is): %s", run_id, exc)
            return None

    def _persist_idempotency(self, record: RunRecord) -> None:
        if record.idempotency_key:
            with storage_errors():
                self.client.persist(self.keys.namespace(record.namespace).idempotency(record.idempotency_key))

    def load_run(self, run_id: str) -> RunRecord | None:
        with storage_errors():
            raw = cast(dict[str, str], self.client.hgetall(self.run_keys(run_id).run))
        if not raw:
            return None
        record = schema.parse_run(run_id, raw)
        self.indexes.remember(run_id, record.namespace)
        return record

    def hashes(self, run_id: str) -> RunHashes:
        """The run's hashes as they are now (one round trip; all empty for an
        unknown run); an archived run's journal and steps from its archive."""
        k = self.run_keys(run_id)
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            for name in HASHES:
                pipe.hgetall(getattr(k, name))
            get_archive(pipe, k)
            *read, blob = pipe.execute()
        hashes = RunHashes(*read)
        archive = archive_of(run_id, blob)
        if archive is None:
            return hashes
        return replace(hashes, journal=archive.journal, steps=archive.steps)

    def load_runs(self, run_ids: Sequence[str]) -> tuple[list[RunRecord], dict[str, StorageCorruptError]]:
        """The runs that exist, in order, and apart from them the ones whose
        record is corrupt: one damaged run must not hide a namespace's others."""
        try:
            with storage_errors():
                pipe = self.client.pipeline(transaction=False)
                for run_id in run_ids:
                    pipe.hgetall(self.run_keys(run_id).run)
                raws: list[Any] = pipe.execute(raise_on_error=False)
        except StorageCorruptError:
            # A value that is not UTF-8 breaks the whole pipelined reply: read one by one.
            raws = [self._load_raw_or_error(run_id) for run_id in run_ids]
        records: list[RunRecord] = []
        corrupt: dict[str, StorageCorruptError] = {}
        for run_id, raw in zip(run_ids, raws, strict=True):
            try:
                if isinstance(raw, Exception):
                    with storage_errors():
                        raise raw
                if raw:
                    records.append(schema.parse_run(run_id, raw))
                    self.indexes.remember(run_id, records[-1].namespace)
            except StorageCorruptError as exc:
                corrupt[run_id] = exc
        return records, corrupt

    def _load_raw_or_error(self, run_id: str) -> Any:
        try:
            with storage_errors():
                return self.client.hgetall(self.run_keys(run_id).run)
        except StorageCorruptError as exc:
            return exc

    def step_rows(self, run_id: str) -> dict[str, str]:
        """Every step row: settled ones, then the ones running now (an
        archived run's settled ones from its archive, read in the same round trip)."""
        k = self.run_keys(run_id)
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(k.steps)
            pipe.hgetall(k.running)
            get_archive(pipe, k)
            settled, running, blob = pipe.execute()
        archive = archive_of(run_id, blob)
        return {**(settled if archive is None else archive.steps), **running}

    def agent_rows(self, run_id: str) -> dict[str, str]:
        with storage_errors():
            return cast(dict[str, str], self.client.hgetall(self.run_keys(run_id).agents))

    def refused_writes(self, run_id: str) -> int:
        """How many writes the fence refused for this run (stale epochs)."""
        with storage_errors():
            return int(cast(str | None, self.client.hget(self.run_keys(run_id).run, "refused")) or 0)

    def progress_page(self, run_id: str, phase_id: str, mode: PageMode, cursor: int, count: int) -> ProgressSlice:
        """A page of records in ascending seq: the first ``count`` after
        ``cursor``, the last ``count`` before it, or the newest ``count`` of
        the run (``phase_id`` ''), or of one phase; with its bounds, read in
        the same snapshot."""
        cursor = min(max(cursor, 0), MAX_SEQ)
        k = self.run_keys(run_id)
        read = parse.read_progress(self.call("read_progress", k, [phase_id, mode, cursor, count]), run_id)
        if not isinstance(read, Archived):
            return read
        # Archived: the same page from the archive, as the script pages the
        # stream (the archive is never changed, so its snapshot holds).
        archive = self.archive(run_id) or EMPTY
        reply = progress_reply(archive, read.counter, phase_id, mode, cursor, count)
        page = parse.read_progress(reply, run_id)
        assert not isinstance(page, Archived)
        return page

    def archive(self, run_id: str) -> Archive | None:
        """The run's archive (``schema/archive.py``), or None: unarchived, or gone."""
        return read_archive(self, run_id)
