"""Reading a namespace's indexes (keys.py, indexes.py), and rebuilding
them from the records (``celery-durable runs reindex``).

Part of ``RunStore`` (a base class of it); the writes are ``run_index.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from celery_durable.broker import indexes
from celery_durable.broker.connection import storage_errors
from celery_durable.broker.indexes import OrdRange
from celery_durable.broker.store_core import StoreCore

REINDEX_BATCH = 1_000


class IndexReads(StoreCore):
    """``RunStore``'s reads of the namespace indexes."""

    def index_built(self, namespace: str) -> bool:
        """Whether the indexes cover every run of the namespace: it was born
        with them, or `runs reindex` rebuilt them (an older store's runs)."""
        ns = self.keys.namespace(namespace)
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(ns.index_meta, "built")
            pipe.exists(ns.runs)
            built, listed = pipe.execute()
        return built == "1" or not listed  # a namespace with no run yet is born indexed

    def index_counts(self, namespace: str, prefixes: Sequence[str], rng: OrdRange) -> list[int]:
        """How many runs each filter holds in ``rng`` (O(log n) each, one round trip)."""
        key = self.keys.namespace(namespace).index
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            for prefix in prefixes:
                top, bottom = rng.bounds(prefix)
                pipe.zlexcount(key, bottom, top)
            return [int(n) for n in pipe.execute()]

    def index_page(self, namespace: str, prefix: str, rng: OrdRange, count: int) -> list[tuple[str, str]]:
        """(ord, run id) of the filter's runs in ``rng``, newest first."""
        top, bottom = rng.bounds(prefix)
        with storage_errors():
            members = cast(
                list[str], self.client.zrevrangebylex(self.keys.namespace(namespace).index, top, bottom, 0, count)
            )
        return [indexes.parse_member(prefix, member) for member in members]

    def ids_page(self, namespace: str, prefix: str, after: str | None, count: int) -> list[str]:
        """Ids of runs that start with ``prefix``, after ``after``, in id order."""
        low, high = indexes.id_bounds(prefix, after)
        with storage_errors():
            members = cast(
                list[str], self.client.zrangebylex(self.keys.namespace(namespace).index, low, high, 0, count)
            )
        return [member[len(indexes.ID_PREFIX) :] for member in members]

    def repair_indexes(self, namespace: str, run_ids: Sequence[str] = ()) -> int:
        """Bring in line the runs whose writes are under way or were cut off
        (their intents, run_index.py), and ``run_ids``; how many were looked at."""
        if run_ids:
            self.indexes.sync_from_records(self.keys.namespace(namespace), run_ids, "")
        return self.indexes.repair(namespace) + len(run_ids)

    def reindex(self, namespace: str) -> int:
        """Rebuild the namespace's indexes from its records (a store written
        before they existed, or one to check); how many runs it holds. Safe
        while workers run: each run is written with the version its record
        had, and a change meanwhile writes a newer one."""
        ns = self.keys.namespace(namespace)
        with storage_errors():
            self.client.hdel(ns.index_meta, "built")
        total, before = 0, "+inf"
        while True:
            batch = self.list_run_ids(namespace, None if before == "+inf" else float(before), REINDEX_BATCH)
            if not batch:
                break
            self.indexes.sync_from_records(ns, [run_id for run_id, _ in batch], "")
            total += len(batch)
            before = str(batch[-1][1])
        self._drop_strays(namespace)
        with storage_errors():
            self.client.hset(ns.index_meta, "built", "1")
        return total

    def _drop_strays(self, namespace: str) -> None:
        """Index states of runs no longer in the namespace's runs zset."""
        ns = self.keys.namespace(namespace)
        with storage_errors():
            cursor = 0
            while True:
                cursor, chunk = cast(
                    tuple[int, dict[str, str]], self.client.hscan(ns.index_state, cursor, count=REINDEX_BATCH)
                )
                run_ids = list(chunk)
                if run_ids:
                    pipe = self.client.pipeline(transaction=False)
                    for run_id in run_ids:
                        pipe.zscore(ns.runs, run_id)
                    scores = pipe.execute()
                    strays = [r for r, score in zip(run_ids, scores, strict=True) if score is None]
                    if strays:
                        self.indexes.forget(namespace, strays)
                if cursor == 0:
                    break

    def list_run_ids(self, namespace: str, before_score: float | None, count: int) -> list[tuple[str, float]]:
        """Run ids of a namespace, newest first, strictly before ``before_score``."""
        top = f"({before_score}" if before_score is not None else "+inf"
        with storage_errors():
            rows = self.client.zrevrangebyscore(
                self.keys.namespace(namespace).runs, top, "-inf", start=0, num=count, withscores=True
            )
        return [(str(member), float(score)) for member, score in rows]
