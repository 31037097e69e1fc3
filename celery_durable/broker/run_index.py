"""Keeping a namespace's indexes (by status, workflow, waiting, id; keys.py)
in line with its runs' records, around every script that may change what
they hold of a run: its status or its waiting summary.

The indexes live in the namespace's slot (``{ns:N}``), a run's record in its
own (``{R}``), and a Lua script on a Redis Cluster touches one slot only. So
the script that changes a run cannot write its namespace's indexes itself;
instead every such change bumps the run's ``ixv`` in the same script
(``set_status``/``set_waiting`` in ``_prelude.lua``), and ``index_sync.lua``
writes the indexes from the record *with the version it read*, never over
a newer one. Then:

- **One Redis**: the changing script and ``index_sync.lua`` (given the run
  hash to read) go in one MULTI/EXEC. Redis runs a transaction as one, and
  its AOF replays it whole or not at all (an unfinished MULTI at the end of
  the file is dropped), so the indexes equal the records at every instant,
  and after a restart from the AOF.
- **A Redis Cluster**: three writes, in this order. (1) ``index_intent.lua``
  counts a write under way in the namespace's intents hash; (2) the script
  changes the run; (3) the caller reads the record's index fields and
  ``index_sync.lua`` writes them with their version, and counts the intent
  done. A crash after (1) leaves the count above zero, and every filtered
  listing first brings the runs with intents in line (``repair``) from
  their records: a run changed by (2) is never missing from the index of
  its real status or wait as a listing that starts after (2) reads it.
  Concurrent writers of one run are ordered by ``ixv``: whichever syncs
  last, the newest version stands. A repair forgets an intent older than
  ``INTENT_GRACE_MS`` (its writer died, or is so late its sync would change
  nothing). The listing also checks every entry it reads against the record
  (it loads the record anyway), so an entry still behind a write under way
  is never shown under a filter the run no longer matches.

Runs whose keys expired leave every index with ``index_forget.lua`` (the
sweep's ``prune_expired``, or a listing that meets them gone).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from celery_durable.broker.connection import RedisClient, storage_errors
from celery_durable.broker.keys import KeySpace, NamespaceKeys
from celery_durable.broker.replies import index as parse
from celery_durable.broker.replies import run as run_replies
from celery_durable.broker.scripts import Clock, Scripts
from celery_durable.errors import StorageError

logger = logging.getLogger(__name__)

INTENT_GRACE_MS = 60_000
RECORD_FIELDS = ("id", "ixv", "status", "workflow", "created_at", "waiting")
NAMESPACE_CACHE = 65_536


class IndexWrites:
    """Runs the scripts of ``INDEXED_SCRIPTS`` with their index sync."""

    def __init__(self, client: RedisClient, scripts: Scripts, keys: KeySpace, clock: Clock) -> None:
        self._client = client
        self._scripts = scripts
        self._keys = keys
        self._clock = clock
        self._cluster = isinstance(client, RedisCluster)
        self._namespaces: dict[str, str] = {}

    def remember(self, run_id: str, namespace: str) -> None:
        """A run's namespace, as its record says (it never changes)."""
        if len(self._namespaces) >= NAMESPACE_CACHE:
            self._namespaces.clear()
        self._namespaces[run_id] = namespace

    def _namespace_of(self, run_id: str) -> str | None:
        namespace = self._namespaces.get(run_id)
        if namespace is None:
            with storage_errors():
                found = cast(str | None, self._client.hget(self._keys.run(run_id).run, "namespace"))
            if found:
                self.remember(run_id, found)
            namespace = found
        return namespace

    def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Script ``name`` on the run whose hash is ``keys[0]``, and the sync of its indexes."""
        run_id = self._keys.run_id_of(keys[0])
        namespace = self._namespace_of(run_id)
        if namespace is None:  # no record: the script refuses, and no index holds the run
            with storage_errors():
                return self._scripts[name](keys=list(keys), args=list(args))
        return self.run_then_sync(name, keys, args, namespace, run_id)

    def run_then_sync(self, name: str, keys: Sequence[str], args: Sequence[Any], namespace: str, run_id: str) -> Any:
        ns = self._keys.namespace(namespace)
        if self._cluster:
            return self._apart(name, keys, args, ns, run_id)
        return self._together(name, keys, args, ns, run_id)

    def _sync_keys(self, ns: NamespaceKeys) -> list[str]:
        return [ns.index, ns.index_state, ns.runs, ns.index_intents]

    def _together(self, name: str, keys: Sequence[str], args: Sequence[Any], ns: NamespaceKeys, run_id: str) -> Any:
        script, sync = self._scripts[name], self._scripts["index_sync"]
        sync_keys = [*self._sync_keys(ns), self._keys.run(run_id).run]
        sync_args: list[Any] = ["", self._clock(), INTENT_GRACE_MS, run_id]
        for attempt in range(2):
            with storage_errors():
                pipe = self._client.pipeline(transaction=True)
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.evalsha(sync.sha, len(sync_keys), *sync_keys, *sync_args)
                reply, synced = pipe.execute(raise_on_error=False)
                if attempt == 0 and (isinstance(reply, NoScriptError) or isinstance(synced, NoScriptError)):
                    # A restarted Redis: load both, and run them again together
                    # (a sync that ran alone found the run as it was: harmless).
                    self._client.script_load(script.script)
                    self._client.script_load(sync.script)
                    continue
                if isinstance(reply, Exception):
                    raise reply
            if isinstance(synced, Exception):
                logger.warning("run %s: its indexes were not synced (%s); `runs reindex` repairs them", run_id, synced)
            else:
                parse.index_sync(synced)
            return reply
        raise AssertionError("unreachable")

    def run_each_together(self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """``run`` of many calls of script ``name`` on one Redis, in one
        MULTI/EXEC: each call followed by its run's index sync, as ``run``
        does for one (a burst of timers the sweep fires, say). The raw
        replies in order, an error in its place (a ``NoScriptError`` left for
        the caller to run that call alone). Not for a Cluster, where each
        call goes through ``run`` by itself."""
        assert not self._cluster
        run_ids = [self._keys.run_id_of(keys[0]) for keys, _ in calls]
        namespaces = self._namespaces_of(run_ids)
        script, sync = self._scripts[name], self._scripts["index_sync"]
        now = self._clock()
        with storage_errors():
            pipe = self._client.pipeline(transaction=True)
            for (keys, args), run_id, namespace in zip(calls, run_ids, namespaces, strict=True):
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                if namespace is not None:
                    sync_keys = [*self._sync_keys(self._keys.namespace(namespace)), self._keys.run(run_id).run]
                    pipe.evalsha(sync.sha, len(sync_keys), *sync_keys, "", now, INTENT_GRACE_MS, run_id)
            replies = iter(pipe.execute(raise_on_error=False))
        out: list[Any] = []
        unsynced: dict[str, list[str]] = {}
        for run_id, namespace in zip(run_ids, namespaces, strict=True):
            out.append(next(replies))
            if namespace is None:
                continue
            synced = next(replies)
            if isinstance(synced, Exception):
                unsynced.setdefault(namespace, []).append(run_id)
            else:
                parse.index_sync(synced)
        for namespace, stale in unsynced.items():
            # The sync script was not loaded (a restarted Redis): sync from the records now.
            try:
                self.sync_from_records(self._keys.namespace(namespace), stale, "")
            except StorageError as exc:
                logger.warning("runs %s: their indexes were not synced (%s); `runs reindex` repairs them", stale, exc)
        return out

    def _namespaces_of(self, run_ids: Sequence[str]) -> list[str | None]:
        """Each run's namespace: remembered, or read in one round trip for those not yet seen."""
        unknown = [run_id for run_id in run_ids if run_id not in self._namespaces]
        if unknown:
            with storage_errors():
                pipe = self._client.pipeline(transaction=False)
                for run_id in unknown:
                    pipe.hget(self._keys.run(run_id).run, "namespace")
                for run_id, found in zip(unknown, pipe.execute(), strict=True):
                    if found:
                        self.remember(run_id, found)
        return [self._namespaces.get(run_id) for run_id in run_ids]

    def _apart(self, name: str, keys: Sequence[str], args: Sequence[Any], ns: NamespaceKeys, run_id: str) -> Any:
        with storage_errors():
            parse.index_intent(self._scripts["index_intent"](keys=[ns.index_intents], args=[run_id, self._clock()]))
        try:
            with storage_errors():
                return self._scripts[name](keys=list(keys), args=list(args))
        finally:
            try:
                self.sync_from_records(ns, [run_id], "w")
            except StorageError as exc:
                logger.warning("run %s: its indexes wait for a listing to repair them (%s)", run_id, exc)

    def index_run(self, keys: Sequence[str], args: Sequence[Any], namespace: str, run_id: str) -> str:
        """index_run.lua, then the run's first index entries, from its record."""
        return run_replies.index_run(self.run_then_sync("index_run", keys, args, namespace, run_id))

    def index_each(self, calls: Sequence[tuple[Sequence[str], Sequence[Any], str, str]]) -> None:
        """``index_run`` of many runs, each (keys, args, namespace, run id):
        on one Redis in one MULTI/EXEC, each index_run.lua followed by its
        run's sync as ``_together`` does for one; on a Cluster, or where a
        script was not loaded (a restarted Redis), each alone."""
        if self._cluster:
            for keys, args, namespace, run_id in calls:
                self.index_run(keys, args, namespace, run_id)
            return
        script, sync = self._scripts["index_run"], self._scripts["index_sync"]
        now = self._clock()
        with storage_errors():
            pipe = self._client.pipeline(transaction=True)
            for keys, args, namespace, run_id in calls:
                ns = self._keys.namespace(namespace)
                sync_keys = [*self._sync_keys(ns), self._keys.run(run_id).run]
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.evalsha(sync.sha, len(sync_keys), *sync_keys, "", now, INTENT_GRACE_MS, run_id)
            replies = pipe.execute(raise_on_error=False)
        for i, (keys, args, namespace, run_id) in enumerate(calls):
            reply, synced = replies[2 * i], replies[2 * i + 1]
            if isinstance(reply, NoScriptError) or isinstance(synced, NoScriptError):
                self.index_run(keys, args, namespace, run_id)  # loads both, and runs them again together
                continue
            if isinstance(reply, Exception):
                with storage_errors():
                    raise reply
            run_replies.index_run(reply)
            if isinstance(synced, Exception):
                logger.warning("run %s: its indexes were not synced (%s); `runs reindex` repairs them", run_id, synced)
            else:
                parse.index_sync(synced)

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
            parse.index_sync(self._scripts["index_sync"](keys=self._sync_keys(ns), args=args))

    def repair(self, namespace: str) -> int:
        """Sync the runs with writes under way or interrupted (Redis Cluster); how many."""
        if not self._cluster:
            return 0
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
