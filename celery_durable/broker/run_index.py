"""Keeping a namespace's indexes (by status, workflow, waiting, id; keys.py)
in line with its runs' records, around every script that may change what
they hold of a run: its status or its waiting summary (``indexed`` in
``ops.py``), and ``index_run.lua``, which lists a new run.

The indexes live in the namespace's slot (``{ns:N}``), a run's record in its
own (``{R}``), and a Lua script on a Redis Cluster touches one slot only. So
the script that changes a run cannot write its namespace's indexes itself;
instead every such change bumps the run's ``ixv`` in the same script
(``set_status``/``set_waiting`` in ``_prelude.lua``), and one protocol, the
same on one Redis and on a Cluster, keeps the indexes (``run_each``), for
one call or a batch, each step pipelined over the batch:

1. ``index_intent.lua`` counts a write under way for each run, in the
   namespace's intents hash;
2. the scripts change the runs;
3. the caller reads the records' index fields, and ``index_sync.lua`` writes
   them *with the version read* (never over a newer one) and counts each
   intent done.

A crash after (1) leaves the count above zero, and every filtered listing
first brings the runs with intents in line (``repair``) from their records:
a run changed by (2) is never missing from the index of its real status or
wait as a listing that starts after (2) reads it. Concurrent writers of one
run are ordered by ``ixv``: whichever syncs last, the newest version
stands. A repair forgets an intent older than ``INTENT_GRACE_MS`` (its
writer died, or is so late its sync would change nothing). The listing also
checks every entry it reads against the record (it loads the record
anyway), so an entry still behind a write under way is never shown under a
filter the run no longer matches.

Runs whose keys expired leave every index with ``index_forget.lua`` (the
sweep's ``prune_expired``, or a listing that meets them gone).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from celery_durable.broker.connection import Clock, RedisClient, Scripts, storage_errors
from celery_durable.broker.keys import KeySpace, NamespaceKeys
from celery_durable.broker.replies import index as parse
from celery_durable.errors import StorageCorruptError, StorageError

logger = logging.getLogger(__name__)

INTENT_GRACE_MS = 60_000
RECORD_FIELDS = ("id", "ixv", "status", "workflow", "created_at", "waiting")
NAMESPACE_CACHE = 65_536


Calls = Sequence[tuple[Sequence[str], Sequence[Any]]]
First = Sequence[tuple[str, Sequence[str], Sequence[Any]]]
"""Scripts ``(name, keys, args)`` that must run before the calls: the run's
look (``store_core.LOOK_FIRST``), a new run's record before it is listed.
In the calls' own transaction on one Redis, alone before them otherwise."""
RunEach = Callable[[str, Calls], list[Any]]
"""Runs a script once per (keys, args), pipelined: the replies in order, a
call's ``StorageCorruptError`` in its place (``StoreCore._run_plain_each``)."""


class IndexWrites:
    """Runs the scripts that change what the indexes hold, inside the protocol."""

    def __init__(self, client: RedisClient, scripts: Scripts, keys: KeySpace, clock: Clock) -> None:
        self._client = client
        self._scripts = scripts
        self._keys = keys
        self._clock = clock
        self._cluster = isinstance(client, RedisCluster)
        self._namespaces: dict[str, str] = {}
        self._claims = threading.local()

    def remember(self, run_id: str, namespace: str) -> None:
        """A run's namespace, as its record says (it never changes)."""
        if len(self._namespaces) >= NAMESPACE_CACHE:
            self._namespaces.clear()
        self._namespaces[run_id] = namespace

    def known(self, run_id: str) -> str | None:
        """The run's namespace if this process has met it (no round trip)."""
        return self._namespaces.get(run_id)

    @contextlib.contextmanager
    def claimed(self, run_id: str, namespace: str) -> Iterator[None]:
        """A namespace a message claims for a run, taken by this thread's
        calls inside where none is known (sparing the read ``run_each`` would
        make), and by no other thread's: unchecked, it must not send another
        writer's sync astray. Synced under a wrong one, the run is 'unlisted'
        there: nothing is written. Whoever checks it remembers it (``remember``)."""
        self._claims.of = {run_id: namespace}
        try:
            yield
        finally:
            self._claims.of = {}

    def _namespaces_of(self, run_ids: Sequence[str]) -> list[str | None]:
        """Each run's namespace: remembered, claimed (``claimed``), or read in
        one round trip for those not yet seen."""
        claims: dict[str, str] = getattr(self._claims, "of", {})
        unknown = [run_id for run_id in run_ids if run_id not in self._namespaces and run_id not in claims]
        if unknown:
            with storage_errors():
                pipe = self._client.pipeline(transaction=False)
                for run_id in unknown:
                    pipe.hget(self._keys.run(run_id).run, "namespace")
                for run_id, found in zip(unknown, pipe.execute(), strict=True):
                    if found:
                        self.remember(run_id, found)
        return [self._namespaces.get(run_id) or claims.get(run_id) for run_id in run_ids]

    def run_each(self, name: str, calls: Calls, run_ids: Sequence[str], run: RunEach, first: First = ()) -> list[Any]:
        """Script ``name`` once per call, on run ``run_ids[i]``, inside the
        protocol, after the ``first`` scripts; the replies in order, a call's
        ``StorageCorruptError`` in its place. A run with no record (no
        namespace) has no index to keep: its script refuses."""
        if not calls:
            return []
        namespaces = self._namespaces_of(run_ids)
        runs = _grouped(run_ids, namespaces)
        if self._cluster:
            self._alone(first)
            return self._apart(name, calls, runs, run)
        try:
            replies = self._together(name, calls, runs, first)
        except StorageCorruptError:  # a reply that cannot be decoded: each call again, as _apart runs it
            self._alone(first)  # each of them may run twice: a look, a record refused once it exists
            return self._apart(name, calls, runs, run)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:  # a restarted Redis: those calls again, with their intents (their script loads)
            again = _grouped([run_ids[i] for i in missing], [namespaces[i] for i in missing])
            for i, reply in zip(missing, self._apart(name, [calls[i] for i in missing], again, run), strict=True):
                replies[i] = reply
        return replies

    def _apart(self, name: str, calls: Calls, by_namespace: dict[str, list[str]], run: RunEach) -> list[Any]:
        """Steps 1 to 3, each pipelined over the calls (a Cluster, or one Redis
        that lost its scripts): a round trip per namespace, per master, per
        namespace again."""
        now = self._clock()
        for namespace, ids in by_namespace.items():
            with storage_errors():
                keys = [self._keys.namespace(namespace).index_intents]
                parse.index_intent(self._scripts["index_intent"](keys=keys, args=[now, *ids]))
        try:
            return run(name, calls)
        finally:
            for namespace, ids in by_namespace.items():
                try:
                    self.sync_from_records(self._keys.namespace(namespace), ids, "w")
                except StorageError as exc:
                    logger.warning("runs %s: their indexes wait for a listing to repair them (%s)", ids, exc)

    def _alone(self, first: First) -> None:
        """The ``first`` scripts, each by itself, in order (which loads one not loaded)."""
        for name, keys, args in first:
            with storage_errors():
                self._scripts[name](keys=list(keys), args=list(args))

    def _together(self, name: str, calls: Calls, by_namespace: dict[str, list[str]], first: First = ()) -> list[Any]:
        """One Redis: the ``first`` scripts, the calls, then each namespace's
        sync reading the records itself, in one MULTI/EXEC. Redis runs a
        transaction as one, and its AOF replays it whole or not at all (an
        unfinished MULTI at the end of the file is dropped), so no intent is
        needed: the indexes equal the records at every instant, and after a
        restart from the AOF (one round trip: measured 0.19 ms per activate
        and release where the three steps apart take 0.30 to 0.54). A call
        whose script is not loaded has its ``NoScriptError`` in its place; a
        ``first`` script that failed runs again alone, at once (a look late
        by a round trip, as ``StoreCore._look_then_run`` has it)."""
        script, sync = self._scripts[name], self._scripts["index_sync"]
        now = self._clock()
        with storage_errors():
            pipe = self._client.pipeline(transaction=True)
            for first_name, keys, args in first:
                pipe.evalsha(self._scripts[first_name].sha, len(keys), *keys, *args)
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            for namespace, ids in by_namespace.items():
                ns = self._keys.namespace(namespace)
                keys = [ns.index, ns.index_state, ns.runs, ns.index_intents, *(self._keys.run(r).run for r in ids)]
                pipe.evalsha(sync.sha, len(keys), *keys, "", now, INTENT_GRACE_MS, *ids)
            results = pipe.execute(raise_on_error=False)
        self._alone([call for call, reply in zip(first, results, strict=False) if isinstance(reply, Exception)])
        results = results[len(first) :]
        for (namespace, ids), synced in zip(by_namespace.items(), results[len(calls) :], strict=True):
            if not isinstance(synced, Exception):
                parse.index_sync(synced)
                continue
            try:  # not loaded (a restarted Redis): from the records now, which loads it
                self.sync_from_records(self._keys.namespace(namespace), ids, "")
            except StorageError as exc:
                logger.warning("runs %s: their indexes were not synced (%s); `runs reindex` repairs them", ids, exc)
        return [_translated(reply) for reply in results[: len(calls)]]

    def sync_from_records(self, ns: NamespaceKeys, run_ids: Sequence[str], mode: str) -> None:
        """Bring each run's entries in line with its record as read now
        (``mode``: 'w' a writer's sync, 'r' a repair, '' neither): one read
        of the records, one script call in the namespace's slot."""
        if not run_ids:
            return
        with storage_errors():
            pipe = self._client.pipeline(transaction=False)
            for run_id in run_ids:
                pipe.hmget(self._keys.run(run_id).run, list(RECORD_FIELDS))
            rows = pipe.execute()
            args: list[Any] = [mode, self._clock(), INTENT_GRACE_MS]
            for run_id, row in zip(run_ids, rows, strict=True):
                args.extend((run_id, "1" if row[0] is not None else "0"))
                args.extend("" if value is None else str(value) for value in row[1:])
            keys = [ns.index, ns.index_state, ns.runs, ns.index_intents]
            parse.index_sync(self._scripts["index_sync"](keys=keys, args=args))

    def repair(self, namespace: str) -> int:
        """Sync the runs with writes under way or interrupted; how many."""
        ns = self._keys.namespace(namespace)
        with storage_errors():
            pending = cast(list[str], self._client.hkeys(ns.index_intents))
        for start in range(0, len(pending), 500):
            self.sync_from_records(ns, pending[start : start + 500], "r")
        return len(pending)

    def forget(self, namespace: str, run_ids: Sequence[str]) -> int:
        """Take runs whose keys are gone out of every index; how many were listed."""
        if not run_ids:
            return 0
        ns = self._keys.namespace(namespace)
        keys = [ns.runs, ns.index, ns.index_state, ns.index_intents]
        with storage_errors():
            return parse.index_forget(self._scripts["index_forget"](keys=keys, args=list(run_ids)))


def _grouped(run_ids: Sequence[str], namespaces: Sequence[str | None]) -> dict[str, list[str]]:
    """The runs of each namespace (a run with none has no record, and no index)."""
    grouped: dict[str, list[str]] = {}
    for run_id, namespace in zip(run_ids, namespaces, strict=True):
        if namespace is not None:
            grouped.setdefault(namespace, []).append(run_id)
    return grouped


def _translated(reply: Any) -> Any:
    """A script's reply from a transaction: an error translated, a run's
    ``StorageCorruptError`` in its place; a ``NoScriptError`` left as it is."""
    if isinstance(reply, Exception) and not isinstance(reply, NoScriptError):
        try:
            with storage_errors():
                raise reply
        except StorageCorruptError as exc:
            return exc
    return reply
