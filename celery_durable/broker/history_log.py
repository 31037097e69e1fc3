"""A run's history as stored: the events its scripts recorded
(``schema.history``), read by number, and the values a page previews.

The reads are split from what is made of them (``celery_durable.client.history``)
so that a client of another kind (asyncio) runs the same decoding on its
own I/O: ``read_history``'s row in ``ops.py`` says what to send,
``parse_page`` what came back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from celery_durable.broker.connection import storage_errors
from celery_durable.broker.replies import history as parse
from celery_durable.broker.schema.history import StoredEvent
from celery_durable.broker.store_core import StoreCore

HISTORY_SCRIPT = "read_history"
VALUE_HASHES = ("journal", "signals")
"""Where a previewed value lives: a journal field (``v:``, ``a:``, ``i:``) or a
signal's payload and taker (``p:``, ``k:``)."""


def parse_page(reply: Any, run_id: str) -> tuple[int, list[StoredEvent]] | None:
    """The run's event count and the events read; None for a run that does not exist."""
    return parse.read_history(reply, run_id)


def read_events(store: StoreCore, run_id: str, after: int, count: int) -> tuple[int, list[StoredEvent]] | None:
    """Up to ``count`` events with seq > ``after``, oldest first: O(count) whatever the run's size."""
    return parse_page(store.call(HISTORY_SCRIPT, store.run_keys(run_id), ["after", after, count]), run_id)


def read_tail(store: StoreCore, run_id: str, count: int) -> tuple[int, list[StoredEvent]] | None:
    """The newest ``count`` events, oldest first."""
    read = parse_page(store.call(HISTORY_SCRIPT, store.run_keys(run_id), ["tail", 0, count]), run_id)
    return None if read is None else (read[0], read[1][::-1])


def read_values(store: StoreCore, run_id: str, refs: Sequence[tuple[str, str]]) -> list[str | None]:
    """The raw values at ``refs``, each (hash, field) with hash one of ``VALUE_HASHES``."""
    if not refs:
        return []
    k = store.run_keys(run_id)
    with storage_errors():
        pipe = store.client.pipeline(transaction=False)
        for hash_name, field in refs:
            pipe.hget(getattr(k, hash_name), field)
        return cast(list[str | None], pipe.execute())
