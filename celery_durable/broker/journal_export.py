"""A run's journal as raw fields: read out for a history document, and
written back into a scratch store to replay it (SPEC §8a).

The fields are the journal hash's own (``broker/schema``), so a history
replays through the same read scripts as the run did; nothing here
interprets them.
"""

from __future__ import annotations

from typing import cast

from celery_durable.broker.connection import storage_errors
from celery_durable.broker.run_records import archive_of, get_archive
from celery_durable.broker.store_core import StoreCore


def read_journal(store: StoreCore, run_id: str) -> dict[str, str]:
    """Every field of the run's journal hash, as stored: an archived run's
    from its archive (read in the same round trip)."""
    k = store.run_keys(run_id)
    with storage_errors():
        pipe = store.client.pipeline(transaction=False)
        pipe.hgetall(k.journal)
        get_archive(pipe, k)
        journal, blob = pipe.execute()
    archive = archive_of(run_id, blob)
    return cast(dict[str, str], journal if archive is None else archive.journal)


def write_journal(store: StoreCore, run_id: str, fields: dict[str, str], ttl_ms: int) -> None:
    """Put ``fields`` as the journal of ``run_id`` in a store kept for a
    replay (a key prefix of its own), gone after ``ttl_ms`` should nobody
    delete it (``forget_journal``)."""
    key = store.run_keys(run_id).journal
    with storage_errors():
        pipe = store.client.pipeline(transaction=True)
        pipe.delete(key)
        if fields:
            pipe.hset(key, mapping=fields)
            pipe.pexpire(key, ttl_ms)
        pipe.execute()


def forget_journal(store: StoreCore, run_id: str) -> None:
    with storage_errors():
        store.client.delete(store.run_keys(run_id).journal)
