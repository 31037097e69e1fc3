"""What every part of ``RunStore`` stands on: the client, the registered
scripts and how one runs (alone, or with writes to other slots in the same
round trip), the store's clock, and the recovery sweep's schedule.

Every write made on behalf of an attempt goes through a Lua script that
checks the attempt's epoch in the same script. Redis errors are translated
at the edge (``connection.storage_errors``) into
``StorageUnavailableError``/``StorageCorruptError``; a script's reply is
turned into Python by the parse function named after it (``replies``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, NoScriptError, TryAgainError

from celery_durable.broker.connection import Clock, RedisClient, Scripts, connect, now_ms, storage_errors
from celery_durable.broker.events import SharedWatches
from celery_durable.broker.keys import KeySpace, RunKeys
from celery_durable.broker.ops import INDEXED_SCRIPTS, LOOK_FIRST, OPS, WATCHED_CALLERS, Request
from celery_durable.broker.replies import fleet as parse_fleet
from celery_durable.broker.run_index import First, IndexWrites
from celery_durable.config import Settings
from celery_durable.errors import StorageCorruptError, StorageError

__all__ = ["LOOK_FIRST", "WATCHED_CALLERS", "StoreCore"]

Runner = Callable[[str, Sequence[str], Sequence[Any]], Any]

ALONE = object()
"""In place of a pipelined reply: run that call again by itself."""

NOT_RUN = (NoScriptError, AskError, TryAgainError, ClusterDownError)
"""The error replies of a script that did not run (not loaded there, its
slot elsewhere — ``MovedError`` is an ``AskError`` — or the cluster not
serving it): only those are run again alone. Any other error reply may
follow writes the script made, so it stays in the call's place rather than
run the script twice."""


class StoreCore:
    """One Redis, or a Redis Cluster, and the scripts registered on it."""

    def __init__(self, settings: Settings, client: RedisClient | None = None, clock: Clock = now_ms) -> None:
        self.settings = settings
        self.clock = clock
        """Milliseconds since the epoch, as every script is told the time: the
        wall clock, or a test environment's virtual one (``testing.clock``)."""
        self.keys = KeySpace(settings.key_prefix)
        self.client: RedisClient = client or connect(settings)
        self._scripts = Scripts(self.client)
        self.indexes = IndexWrites(self.client, self._scripts, self.keys, lambda: self.clock())
        """The namespace indexes' writes, around the scripts that change what they hold (run_index.py)."""
        self.watches = SharedWatches(self.client)
        """The namespaces' update channels, one subscription each for all of this process's watches."""
        self.after_settle: Callable[[str], None] | None = None
        """Called with a run's id after a script settled, paused, halted or
        cancelled it, or gave it a new attempt: the engine gives back the
        throttle slots its old attempts held (``tasks/throttling.give_back``)."""

    @property
    def lease_ms(self) -> int:
        return int(self.settings.lease_seconds * 1000)

    def now_ms(self) -> int:
        return self.clock()

    def run_keys(self, run_id: str) -> RunKeys:
        return self.keys.run(run_id)

    def channel(self, namespace: str) -> str:
        return self.keys.namespace(namespace).events

    def ping(self) -> None:
        with storage_errors():
            self.client.ping()

    def call(self, name: str, on: Any, args: Sequence[Any] | Request, *more: str) -> Any:
        """Script ``name`` on the keys of ``on`` (a ``RunKeys``, ``ThrottleKeys``…)
        its row names (``ops.OPS``), and ``more``, the optional keys it takes,
        with ``args``, its row's typed request where it has one: the one way
        a script is called, so that its row's rules hold."""
        op = OPS[name]
        return self._run(name, [*op.keys_of(on), *more], op.argv(name, args))

    def call_each(self, name: str, calls: Sequence[tuple[Any, Sequence[Any]]]) -> list[Any]:
        """``call`` of many ``(on, args)``, pipelined (``_run_each``); a script
        of ``LOOK_FIRST`` once its runs' looks are scheduled."""
        keyed = [(OPS[name].keys_of(on), args) for on, args in calls]
        if name in LOOK_FIRST:
            return self._look_then_run_each(name, keyed)
        return self._run_each(name, keyed)

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Script ``name``'s raw reply, for the parse function of the same name
        in ``replies``; a script that may change a run's status or waiting
        summary brings its namespace's indexes in line too (run_index.py)."""
        if name in LOOK_FIRST:
            return self._look_then_run(name, keys, args)
        return self._run_alone(name, keys, args)

    def _run_alone(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if name in INDEXED_SCRIPTS:
            [reply] = self._indexed_each(name, [(keys, args)], [self.keys.run_id_of(keys[0])])
            if isinstance(reply, Exception):
                raise reply
            return reply
        return self._run_script(name, keys, args)

    def _run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        with storage_errors():
            return self._scripts[name](keys=list(keys), args=list(args))

    def _look_then_run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Script ``name`` of ``LOOK_FIRST``, once its run (``keys[0]``) has a
        look scheduled a lease from now at the latest: in the same round trip
        on one Redis, the look first; before it on a Cluster, where the
        sweep's schedule lives in a slot of its own."""
        run_id = self.keys.run_id_of(keys[0])
        at_ms = self.clock() + self.lease_ms
        if isinstance(self.client, RedisCluster):
            self.look([run_id], at_ms)
            return self._run_alone(name, keys, args)
        if name in INDEXED_SCRIPTS:  # the look opens the script's own transaction (run_index.py)
            [reply] = self._indexed_each(name, [(keys, args)], [run_id], first=[self.look_call([run_id], at_ms)])
            if isinstance(reply, Exception):
                raise reply
            return reply
        look, script = self._scripts["look"], self._scripts[name]
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(look.sha, 1, self.keys.sweep_due, at_ms, run_id)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            looked, reply = pipe.execute(raise_on_error=False)
            if isinstance(looked, Exception):
                # Not loaded (a restarted Redis) or refused: the look alone, which
                # loads it. The script is never run twice: one that did run
                # beside the failed look stands (its run may wait a lease longer
                # for a look only if this process dies in this very line).
                self.look([run_id], at_ms)
                if not isinstance(reply, NoScriptError):
                    if isinstance(reply, Exception):
                        raise reply
                    return reply
                return self._run_alone(name, keys, args)
            if isinstance(reply, NoScriptError):
                reply = script(keys=list(keys), args=list(args))
            elif isinstance(reply, Exception):
                raise reply
        return reply

    def _run_each_with(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], writes: Callable[[Any], None]
    ) -> list[Any]:
        """Script ``name`` once per ``(keys, args)``, then ``writes`` (commands
        on keys outside their slots, none of which depends on them), made
        whatever the scripts answer: in one round trip on one Redis, a
        pipeline but not a transaction; on a Cluster, the scripts as
        ``_run_each`` sends them, then the writes, which live on other nodes.
        Returns the scripts' replies; the first failure, a script's or a
        write's, is raised as a ``StorageError``. (Not for the scripts of
        ``INDEXED_SCRIPTS``.)"""
        assert name not in INDEXED_SCRIPTS, name
        with storage_errors():
            if isinstance(self.client, RedisCluster):
                try:
                    replies = self._run_each(name, calls)
                finally:
                    pipe = self.client.pipeline(transaction=False)  # type: ignore[no-untyped-call]
                    writes(pipe)
                    pipe.execute()
            else:
                script = self._scripts[name]
                pipe = self.client.pipeline(transaction=False)
                for keys, args in calls:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                writes(pipe)
                results = pipe.execute(raise_on_error=False)
                replies = results[: len(calls)]
                for i, ((keys, args), reply) in enumerate(zip(calls, replies, strict=True)):
                    if isinstance(reply, NoScriptError):  # a restarted Redis: the script loads again
                        replies[i] = script(keys=list(keys), args=list(args))
                for failed in results[len(calls) :]:
                    if isinstance(failed, Exception):
                        raise failed
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _look_then_run_each(self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Script ``name`` of ``LOOK_FIRST`` once per ``(keys, args)``, as
        ``_run_each`` does, once every call's run (``keys[0]``) has a look
        scheduled a lease from now at the latest: one ``look.lua`` for all of
        them first, in a round trip before the scripts (its own slot on a
        Cluster; and a look that failed sends no script). A call run again
        alone (``_reply_or_error``) goes through ``_run``, which looks again."""
        if not calls:
            return []
        self.look([self.keys.run_id_of(keys[0]) for keys, _ in calls], self.clock() + self.lease_ms)
        return self._run_each(name, calls, looked=True)

    def _run_each(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], *, looked: bool = False
    ) -> list[Any]:
        """Script ``name`` once per ``(keys, args)``, pipelined: one round
        trip on one Redis, one per master on a Cluster (each call still
        touches one slot). The replies in order; a call that failed has its
        error in its place, translated (``StorageCorruptError``, say), so one
        damaged run does not fail the others. A reply that cannot be decoded
        breaks the whole pipelined read: then each call runs alone.
        ``looked``: a script of ``LOOK_FIRST`` whose runs' looks were
        scheduled already (``_look_then_run_each``), the one way it comes here."""
        if not calls:
            return []
        assert looked or name not in LOOK_FIRST, name
        if name in INDEXED_SCRIPTS:
            return self._indexed_each(name, calls, [self.keys.run_id_of(keys[0]) for keys, _ in calls])
        return self._run_plain_each(name, calls, self._run)

    def _indexed_each(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], run_ids: Sequence[str], first: First = ()
    ) -> list[Any]:
        """``_run_each`` of a script that changes what the indexes hold of
        ``run_ids``, inside their protocol (run_index.py), after ``first``."""
        return self.indexes.run_each(name, calls, run_ids, self._run_plain_each, first)

    def _run_plain_each(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], again: Runner | None = None
    ) -> list[Any]:
        """``_run_each`` itself: ``again`` runs a call alone whose pipelined
        reply was not had (the script by itself, unless said otherwise)."""
        again = again or self._run_script
        if isinstance(self.client, RedisCluster):
            return self._run_each_on_masters(name, calls, again)
        script = self._scripts[name]
        try:
            with storage_errors():
                pipe = self.client.pipeline(transaction=False)
                for keys, args in calls:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                replies = pipe.execute(raise_on_error=False)
        except StorageCorruptError:
            replies = [ALONE] * len(calls)
        return [
            _reply_or_error(again, name, keys, args, reply) for (keys, args), reply in zip(calls, replies, strict=True)
        ]

    def _run_each_on_masters(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], again: Runner
    ) -> list[Any]:
        """``_run_each`` on a Cluster, whose client pipelines no scripts: a
        pipeline per master, on that master's own connection, for the calls
        whose slot it serves. A call that meets anything but its reply there
        (a slot moved meanwhile, the script not loaded on that master) runs
        again alone, through the cluster client, which follows the slot."""
        assert isinstance(self.client, RedisCluster)
        if len(calls) == 1:  # nothing to pipeline: the cluster client's own call, run once
            ((keys, args),) = calls
            return [_reply_or_error(again, name, keys, args, ALONE)]
        script = self._scripts[name]
        replies: list[Any] = [ALONE] * len(calls)
        by_node: dict[str, list[int]] = {}
        nodes: dict[str, Any] = {}
        with storage_errors():
            for i, (keys, _) in enumerate(calls):
                node = self.client.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
                nodes[node.name] = node
                by_node.setdefault(node.name, []).append(i)
        for node_name, indices in by_node.items():
            connection = nodes[node_name].redis_connection
            if connection is None:
                continue
            try:
                with storage_errors():
                    pipe = connection.pipeline(transaction=False)
                    for i in indices:
                        keys, args = calls[i]
                        pipe.evalsha(script.sha, len(keys), *keys, *args)
                    for i, reply in zip(indices, pipe.execute(raise_on_error=False), strict=True):
                        replies[i] = ALONE if isinstance(reply, NOT_RUN) else reply
            except StorageError:
                continue  # that master's calls run alone: the cluster client finds their nodes
        return [
            _reply_or_error(again, name, keys, args, reply) for (keys, args), reply in zip(calls, replies, strict=True)
        ]

    def _hmget(self, key: str, fields: list[str]) -> list[str | None]:
        with storage_errors():
            return cast(list[str | None], self.client.hmget(key, fields))

    # -- the recovery sweep's schedule (not atomic with the run: it is a hint,
    # and every look at a run reads the run itself) ----------------------------

    def schedule_check(self, run_id: str, at_ms: int, *, sooner_only: bool = False) -> None:
        """Have the sweep look at the run at ``at_ms``; ``sooner_only`` never
        puts off a look already scheduled earlier (``look``)."""
        if sooner_only:
            self.look([run_id], at_ms)
            return
        with storage_errors():
            self.client.zadd(self.keys.sweep_due, {run_id: at_ms})

    def look(self, run_ids: Sequence[str], at_ms: int) -> None:
        """Have the sweep look at the runs by ``at_ms`` at the latest, a
        sweeper's claim on them notwithstanding (``look.lua``)."""
        if run_ids:
            parse_fleet.look(self._run_alone(*self.look_call(run_ids, at_ms)))

    def look_call(self, run_ids: Sequence[str], at_ms: int) -> tuple[str, list[str], list[Any]]:
        """``look``'s script call, to run first in a transaction of its own (``run_index.First``)."""
        return "look", [self.keys.sweep_due], [at_ms, *run_ids]

    def looked(self, claim: str, looks: dict[str, int], done: Sequence[str]) -> None:
        """What a sweep found of the runs it claimed (``claim``, the score
        ``claim_due`` left): each one's next look, or none for ``done``; a run
        whose look was asked for meanwhile keeps it (``looked.lua``)."""
        if not looks and not done:
            return
        pairs: list[Any] = [item for run_id, at_ms in looks.items() for item in (run_id, at_ms)]
        pairs += [item for run_id in done for item in (run_id, "")]
        parse_fleet.looked(self._run_alone("looked", [self.keys.sweep_due], [claim, *pairs]))

    def unschedule(self, run_id: str) -> None:
        with storage_errors():
            self.client.zrem(self.keys.sweep_due, run_id)


def _reply_or_error(again: Runner, name: str, keys: Sequence[str], args: Sequence[Any], reply: Any) -> Any:
    """One reply of ``_run_each``: run alone again (``again``) where the script
    was not loaded (a restarted Redis, a Cluster node not asked before)."""
    try:
        if reply is ALONE or isinstance(reply, NoScriptError):
            return again(name, keys, args)
        if isinstance(reply, Exception):
            with storage_errors():
                raise reply
    except StorageCorruptError as exc:
        return exc
    return reply
