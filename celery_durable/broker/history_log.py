"""A run's history as stored: the events its scripts recorded
(``schema.history``), read by number, and the values a page previews.

The reads are split from what is made of them (``celery_durable.client.history``)
so that a client of another kind (asyncio) runs the same decoding on its
own I/O: ``read_history``'s row in ``ops.py`` says what to send,
``replies.history.read_history`` what came back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from celery_durable.broker.connection import storage_errors
from celery_durable.broker.progress import MAX_SEQ
from celery_durable.broker.replies import history as parse
from celery_durable.broker.run_records import EMPTY, archive_of, get_archive, read_archive
from celery_durable.broker.schema.archive import Archived, history_reply
from celery_durable.broker.schema.history import StoredEvent
from celery_durable.broker.store_core import StoreCore


def _page(store: StoreCore, run_id: str, mode: str, after: int, count: int) -> tuple[int, list[StoredEvent]] | None:
    """read_history.lua's page; for an archived run, the same page from its
    archive (which never changes, so the count read with it still holds)."""
    read = parse.read_history(store.call("read_history", store.run_keys(run_id), [mode, after, count]), run_id)
    if not isinstance(read, Archived):
        return read
    archive = read_archive(store, run_id) or EMPTY
    page = parse.read_history(history_reply(archive, read.counter, mode, after, count), run_id)
    assert not isinstance(page, Archived)
    return page


def read_events(store: StoreCore, run_id: str, after: int, count: int) -> tuple[int, list[StoredEvent]] | None:
    """Up to ``count`` events with seq > ``after``, oldest first: O(count) whatever the run's size.
    ``after`` is clamped as a progress cursor is (``MAX_SEQ``): a stream id cannot
    hold a larger one, and no run has an event past it."""
    return _page(store, run_id, "after", min(max(after, 0), MAX_SEQ), count)


def read_tail(store: StoreCore, run_id: str, count: int) -> tuple[int, list[StoredEvent]] | None:
    """The newest ``count`` events, oldest first."""
    read = _page(store, run_id, "tail", 0, count)
    return None if read is None else (read[0], read[1][::-1])


def read_values(store: StoreCore, run_id: str, refs: Sequence[tuple[str, str]]) -> list[str | None]:
    """The raw values at ``refs``, each (hash, field) with hash where a
    previewed value lives: ``journal`` (a ``v:``, ``a:`` or ``i:`` field) or
    ``signals`` (a signal's payload and taker, ``p:``, ``k:``); an archived
    run's journal values from its archive, read in the same round trip."""
    if not refs:
        return []
    k = store.run_keys(run_id)
    with storage_errors():
        pipe = store.client.pipeline(transaction=False)
        for hash_name, field in refs:
            pipe.hget(getattr(k, hash_name), field)
        get_archive(pipe, k)
        *values, blob = pipe.execute()
    archive = archive_of(run_id, blob)
    if archive is None:
        return cast(list[str | None], values)
    return [
        archive.journal.get(field) if hash_name == "journal" else value
        for (hash_name, field), value in zip(refs, values, strict=True)
    ]
