"""The one object that talks to Redis for runs, journals and progress.

Every write made on behalf of an attempt goes through a Lua script that
checks the attempt's epoch in the same script. Redis errors are translated
here, at the edge, into ``StorageUnavailableError``/``StorageCorruptError``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any, cast

import redis
import redis.exceptions
from redis.cluster import RedisCluster

from celery_durable.broker import schema
from celery_durable.broker.journal import Flags
from celery_durable.broker.keys import KeySpace, RunKeys
from celery_durable.broker.progress import MAX_SEQ, PageMode, ProgressSlice, parse_slice
from celery_durable.broker.records import STATUSES, RunRecord
from celery_durable.broker.redis_journal import RedisJournal, flags_of
from celery_durable.broker.scripts import Scripts, now_ms, refuse
from celery_durable.config import Settings
from celery_durable.errors import StorageCorruptError, StorageError, StorageUnavailableError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Signalled:
    """``signal.lua``'s answer: 'ok' (with the owners to wake), 'refused' (the
    run's ``status`` cannot continue) or 'missing'."""

    verdict: str
    status: str = ""
    epoch: int = 0
    owners: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Examined:
    """A run as the sweep sees it: status, epoch, and for a pending or running
    run its liveness verdict ('alive', 'waiting' or 'dead') with its detail
    (when to look again, or why it is dead)."""

    status: str
    epoch: int
    workflow: str
    verdict: str
    detail: str
    woken: list[str] = field(default_factory=list)
    """Owners whose timers fired here: the caller sends each its message."""

    @property
    def next_check(self) -> int | None:
        return int(float(self.detail)) if self.verdict in ("alive", "waiting") and self.detail else None


_NOT_NOW = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)
"""Redis is there but cannot take this write now: out of memory, a replica,
a cluster without a master. redis-py strips the error code ("OOM ...") from
their messages, so they are told apart by class, not by text."""


@contextlib.contextmanager
def storage_errors() -> Iterator[None]:
    """Translate redis-py errors into the two storage errors users see.

    Unavailable: nothing was written and the same call can succeed later.
    Corrupt: Redis holds data celery-durable did not write (a wrong type, a
    script that failed on a stored value). Messages never hold the URL, so a
    password in it cannot leak into logs.
    """
    try:
        yield
    except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError) as exc:
        raise StorageUnavailableError(
            f"Redis refused the credentials of redis_url (user and password, or ACL): {exc}"
        ) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        # BusyLoadingError (still loading its append-only file) is one of these.
        raise StorageUnavailableError(f"Redis is unavailable: {exc}") from None
    except redis.exceptions.NoPermissionError as exc:
        raise StorageUnavailableError(
            f"The Redis user of redis_url lacks a permission celery-durable needs (check its ACL): {exc}"
        ) from None
    except _NOT_NOW as exc:
        raise StorageUnavailableError(f"Redis cannot serve the journal now: {exc}") from None
    except redis.exceptions.ResponseError as exc:
        if str(exc).startswith(("BUSY", "LOADING", "MASTERDOWN")):
            raise StorageUnavailableError(f"Redis cannot serve the journal now: {exc}") from None
        raise StorageCorruptError(f"Redis refused an operation on stored data: {exc}") from None
    except redis.exceptions.RedisError as exc:
        # InvalidResponse and the like: the conversation broke, not the data.
        raise StorageUnavailableError(f"Redis is unavailable: {type(exc).__name__}: {exc}") from None
    except redis.exceptions.RedisClusterException as exc:
        # No RedisError: the cluster client found no node for a slot, or none
        # of the nodes it knows answers. The slot may be served again later.
        raise StorageUnavailableError(f"Redis Cluster cannot serve the journal now: {exc}") from None
    except UnicodeDecodeError as exc:
        # A stored value that is not UTF-8: nothing celery-durable writes.
        # redis-py drops the connection it was reading from, so the next call
        # starts clean; the data is what is wrong, every time it is read.
        raise StorageCorruptError(f"Redis holds a value that is not UTF-8 text: {exc}") from None


RedisClient = redis.Redis | RedisCluster
"""One Redis, or a Redis Cluster (``settings.redis_cluster``). Both speak the
same commands; on a cluster each script runs on the node that serves its
keys' slot, which is why every script is given keys of one hash tag only."""


def connect(settings: Settings) -> RedisClient:
    """The journal's client, as ``settings`` describe it.

    Every call answers within the operation timeout, or fails with
    ``StorageUnavailableError``: a stalled Redis must not hang callers, and a
    worker must learn of it while its lease can still be defended. A cluster
    client reads the slot map from ``redis_url``'s node when it is made, and
    again whenever a node answers MOVED or stops answering.
    """
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_connect_timeout": settings.redis_timeout_seconds,
        "socket_timeout": settings.redis_timeout_seconds,
        "health_check_interval": 30,
    }
    if settings.redis_cluster:
        with storage_errors():
            return RedisCluster.from_url(settings.redis_url, **options)
    return redis.Redis.from_url(settings.redis_url, **options)


class RunStore:
    """Runs, journals, progress and fencing on one Redis, or on a Redis Cluster."""

    def __init__(self, settings: Settings, client: RedisClient | None = None) -> None:
        self.settings = settings
        self.keys = KeySpace(settings.key_prefix)
        self.client: RedisClient = client or connect(settings)
        self._scripts = Scripts(self.client)

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        with storage_errors():
            return self._scripts[name](keys=list(keys), args=list(args))

    def run_keys(self, run_id: str) -> RunKeys:
        return self.keys.run(run_id)

    def channel(self, namespace: str) -> str:
        return self.keys.namespace(namespace).events

    def ping(self) -> None:
        with storage_errors():
            self.client.ping()

    # -- run records ---------------------------------------------------------

    def create_run(self, run_id: str, fields: dict[str, str], message: str) -> bool:
        """Create the run record; ``message`` is the task id of its first coordinator message."""
        flat: list[str] = []
        for name, value in fields.items():
            flat.extend((name, value))
        k = self.run_keys(run_id)
        retention_ms = self.settings.run_retention_seconds * 1000
        return bool(self._run("create_run", [k.run, k.live], [message, now_ms(), retention_ms, *flat]))

    def index_run(self, namespace: str, run_id: str, idempotency_key: str | None) -> str:
        ns = self.keys.namespace(namespace)
        keys = [ns.runs, ns.counter]
        if idempotency_key is not None:
            keys.append(ns.idempotency(idempotency_key))
        return str(self._run("index_run", keys, [run_id, ns.events]))

    def discard_run(self, run_id: str, epoch: int) -> None:
        k = self.run_keys(run_id)
        self._run("discard_run", [k.run, k.live], [epoch])

    def release_idempotency(self, namespace: str, idempotency_key: str, owner: str) -> bool:
        """Free an idempotency key that still names ``owner``, a run that has expired."""
        key = self.keys.namespace(namespace).idempotency(idempotency_key)
        return bool(self._run("release_idempotency", [key], [owner]))

    def forget_runs(self, namespace: str, run_ids: Sequence[str]) -> None:
        """Drop runs whose keys have expired (run retention) from the namespace index."""
        if run_ids:
            with storage_errors():
                self.client.zrem(self.keys.namespace(namespace).runs, *run_ids)

    def expire_run(self, run_id: str) -> None:
        """Start the retention clock of a settled run (``settings.run_retention_seconds``).

        Not atomic with the write that settled the run, and need not be: it is
        a compare-and-set on the status, and a resume persists the keys again.
        """
        ttl_ms = self.settings.run_retention_seconds * 1000
        if ttl_ms <= 0:
            return
        reply = self._run("expire_run", astuple(self.run_keys(run_id)), [ttl_ms])
        if reply and reply[1]:
            with storage_errors():
                self.client.pexpire(self.keys.namespace(str(reply[0])).idempotency(str(reply[1])), ttl_ms)

    def _retain(self, run_id: str) -> None:
        """``expire_run`` after a run settled: the settling stands even if this fails."""
        try:
            self.expire_run(run_id)
        except StorageError as exc:
            logger.warning("run %s settled, but its retention could not be set: %s", run_id, exc)

    def _persist_idempotency(self, record: RunRecord) -> None:
        if record.idempotency_key:
            with storage_errors():
                self.client.persist(self.keys.namespace(record.namespace).idempotency(record.idempotency_key))

    def load_run(self, run_id: str) -> RunRecord | None:
        with storage_errors():
            raw = cast(dict[str, str], self.client.hgetall(self.run_keys(run_id).run))
        return schema.parse_run(run_id, raw) if raw else None

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
            except StorageCorruptError as exc:
                corrupt[run_id] = exc
        return records, corrupt

    def _load_raw_or_error(self, run_id: str) -> Any:
        try:
            with storage_errors():
                return self.client.hgetall(self.run_keys(run_id).run)
        except StorageCorruptError as exc:
            return exc

    def list_run_ids(self, namespace: str, before_score: float | None, count: int) -> list[tuple[str, float]]:
        """Run ids of a namespace, newest first, strictly before ``before_score``."""
        top = f"({before_score}" if before_score is not None else "+inf"
        with storage_errors():
            rows = self.client.zrevrangebyscore(
                self.keys.namespace(namespace).runs, top, "-inf", start=0, num=count, withscores=True
            )
        return [(str(member), float(score)) for member, score in rows]

    # -- activation, heartbeats, task starts and ends -------------------------

    @property
    def lease_ms(self) -> int:
        return int(self.settings.lease_seconds * 1000)

    def activate(self, run_id: str, epoch: int, token: str, namespace: str, resend: str) -> Flags | int:
        """Take the activation lock for the pass whose task id is ``token`` and
        return the run's flags; when another pass holds it (and was told to
        run once more), the ms until the message ``resend`` is due."""
        k = self.run_keys(run_id)
        reply = self._run(
            "activate",
            [k.run, k.progress, k.live],
            [epoch, token, now_ms(), self.lease_ms, self.lease_ms, self.channel(namespace), resend],
        )
        if reply and reply[0] == "busy":
            return int(reply[1])
        refuse(run_id, reply)
        return flags_of(reply)

    def release(self, run_id: str, token: str, epoch: int) -> bool:
        """Release the lock; True when another activation arrived and the caller must run again."""
        k = self.run_keys(run_id)
        return bool(self._run("release", [k.run, k.live], [token, epoch, now_ms()]))

    def heartbeat(
        self, run_id: str, epoch: int, token: str, *, coordinator: bool = False, wake: str = ""
    ) -> tuple[Flags, bool]:
        """Renew the running task ``token``; the flags, and whether a ceiling was
        newly reached and the coordinator must be woken by message ``wake``."""
        k = self.run_keys(run_id)
        reply = self._run(
            "heartbeat",
            [k.run, k.live],
            [epoch, token, now_ms(), self.lease_ms, self.lease_ms, wake, int(coordinator)],
        )
        refuse(run_id, reply)
        return flags_of(reply), reply[4] == 1

    def task_start(self, run_id: str, epoch: int, token: str) -> Flags:
        """A branch task starts: its message runs, and its lease starts now."""
        k = self.run_keys(run_id)
        reply = self._run("task_start", [k.run, k.live], [epoch, token, now_ms(), self.lease_ms])
        refuse(run_id, reply)
        return flags_of(reply)

    def task_end(self, run_id: str, epoch: int, token: str, wake: str = "") -> bool:
        """A branch task ended; True when a pause waits for it and the
        coordinator must be woken by message ``wake``."""
        k = self.run_keys(run_id)
        reply = self._run("task_end", [k.run, k.live], [epoch, token, now_ms(), wake])
        return bool(reply and len(reply) > 1 and reply[1] == 1)

    # -- the journal -------------------------------------------------------------

    def journal(self, run_id: str, epoch: int, namespace: str) -> RedisJournal:
        """The journal of ``run_id`` as attempt ``epoch`` sees and writes it."""
        return RedisJournal(
            self._run,
            self._hmget,
            self.run_keys(run_id),
            run_id=run_id,
            epoch=epoch,
            channel=self.channel(namespace),
            look_at=lambda at_ms: self.schedule_check(run_id, at_ms, sooner_only=True),
        )

    def _hmget(self, key: str, fields: list[str]) -> list[str | None]:
        with storage_errors():
            return cast(list[str | None], self.client.hmget(key, fields))

    # -- agents ------------------------------------------------------------------

    def agent_start(
        self, run_id: str, epoch: int, agent_id: str, token: str, resend: str, delay_ms: int
    ) -> tuple[str, str | None]:
        """('go', request json), ('wait', None): the turn comes back as message
        ``resend`` in ``delay_ms``, ('done', None), ('running', None): message
        ``token`` runs the turn already (a redelivery), or ('stale', None)."""
        k = self.run_keys(run_id)
        reply = self._run(
            "agent_start",
            [k.run, k.journal, k.agents, k.live],
            [epoch, now_ms(), agent_id, token, self.lease_ms, resend, delay_ms],
        )
        refuse(run_id, reply)
        return str(reply[0]), (str(reply[1]) if len(reply) > 1 else None)

    def agent_finish(
        self,
        run_id: str,
        epoch: int,
        agent_id: str,
        outcome: str,
        row_json: str,
        usage: tuple[int, int, int],
        token: str,
        wake_prefix: str,
    ) -> list[str]:
        """Journal a turn's outcome with its usage (nano-credits, prompt and
        completion tokens); returns the owners to wake, the n-th (from 1) by
        message ``f"{wake_prefix}-{n}"``."""
        k = self.run_keys(run_id)
        reply = self._run(
            "agent_finish",
            [k.run, k.journal, k.agents, k.live],
            [epoch, now_ms(), agent_id, outcome, row_json, *usage, token, wake_prefix],
        )
        refuse(run_id, reply)
        return str(reply[1]).split()

    def agent_rows(self, run_id: str) -> dict[str, str]:
        with storage_errors():
            return cast(dict[str, str], self.client.hgetall(self.run_keys(run_id).agents))

    def pause(self, run_id: str, namespace: str, message: str) -> tuple[str, int | None]:
        """Request a pause; on 'requested' the caller sends coordinator message ``message``."""
        k = self.run_keys(run_id)
        reply = self._run("pause", [k.run, k.live], [self.channel(namespace), now_ms(), message])
        return str(reply[0]), (int(reply[1]) if reply[0] == "requested" else None)

    def step_rows(self, run_id: str) -> dict[str, str]:
        """Every step row: settled ones, then the ones running now."""
        k = self.run_keys(run_id)
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(k.steps)
            pipe.hgetall(k.running)
            settled, running = pipe.execute()
        return {**settled, **running}

    # -- settling, resuming, cancelling ---------------------------------------

    def finish(
        self,
        run_id: str,
        epoch: int,
        namespace: str,
        status: str,
        *,
        reason: str = "",
        error: str = "",
        can_resume: bool = False,
        result_json: str | None = None,
        message: str = "",
    ) -> None:
        k = self.run_keys(run_id)
        reply = self._run(
            "finish",
            [k.run, k.progress, k.steps, k.running, k.agents, k.live, k.waits],
            [
                epoch,
                now_ms(),
                self.channel(namespace),
                status,
                reason,
                error,
                int(can_resume),
                int(result_json is not None),
                result_json or "",
                message,
            ],
        )
        refuse(run_id, reply)
        self.unschedule(run_id)
        self._retain(run_id)

    def resume(
        self,
        record: RunRecord,
        *,
        limits_json: str,
        message: str,
        code_hash: str,
        message_id: str,
        recovery: bool = False,
        ceilings: str = "",
    ) -> int | None:
        """Bump the epoch if the run is still as ``record`` saw it (and, for a
        recovery, its attempt is dead); the new epoch, or None. The new
        attempt's first coordinator message is ``message_id``."""
        k = self.run_keys(record.run_id)
        first = [k.run, k.progress, k.steps, k.running, k.agents, k.live, k.waits]
        reply = self._run(
            "resume",
            [*first, *(key for key in astuple(k) if key not in first)],
            [
                record.epoch,
                record.status,
                now_ms(),
                self.channel(record.namespace),
                limits_json,
                message,
                self.lease_ms,
                code_hash,
                int(recovery),
                ceilings,
                message_id,
                self.queue_room() if recovery else "",
            ],
        )
        if reply[0] != "ok":
            return None
        self.schedule_check(record.run_id, now_ms() + self.lease_ms)
        self._persist_idempotency(record)
        return int(reply[1])

    def halt(self, record: RunRecord) -> bool:
        """Halt a run whose attempt died (auto_recover off); False if it changed meanwhile."""
        k = self.run_keys(record.run_id)
        reply = self._run(
            "halt",
            [k.run, k.progress, k.steps, k.running, k.agents, k.live, k.waits],
            [record.epoch, record.status, now_ms(), self.channel(record.namespace), self.lease_ms, self.queue_room()],
        )
        if reply[0] == "ok":
            self.unschedule(record.run_id)
            self._retain(record.run_id)
        return bool(reply[0] == "ok")

    # -- the recovery sweep's schedule (not atomic with the run: it is a hint,
    # and every look at a run reads the run itself) ----------------------------

    def schedule_check(self, run_id: str, at_ms: int, *, sooner_only: bool = False) -> None:
        """Have the sweep look at the run at ``at_ms``; ``sooner_only`` never
        puts off a look already scheduled earlier."""
        with storage_errors():
            self.client.zadd(self.keys.sweep_due, {run_id: at_ms}, lt=sooner_only)

    def unschedule(self, run_id: str) -> None:
        with storage_errors():
            self.client.zrem(self.keys.sweep_due, run_id)

    def claim_due(self, now: int, count: int, hold_ms: int) -> tuple[list[str], int | None]:
        """Runs due now, each handed to this caller alone for ``hold_ms``; and
        when the next run falls due (None: none scheduled)."""
        reply = self._run("claim_due", [self.keys.sweep_due], [now, count, hold_ms])
        next_due = int(float(reply[0])) if reply and reply[0] not in ("", None) else None
        return [str(run_id) for run_id in reply[1:]], next_due

    def examine(self, run_id: str, room: str, *, fire_prefix: str = "") -> Examined | None:
        """The run's status and liveness (``examine.lua``), or None when it does
        not exist. With ``fire_prefix``, its due timers fire: the owners to wake
        come back in ``woken``, the n-th (from 1) by message ``f"{fire_prefix}-{n}"``."""
        k = self.run_keys(run_id)
        args = [now_ms(), self.lease_ms, room, int(bool(fire_prefix)), fire_prefix]
        reply = self._run("examine", [k.run, k.live, k.waits], args)
        if not reply:
            return None
        try:
            if reply[0] not in STATUSES:
                raise ValueError(f"unknown status {reply[0]!r}")
            return Examined(
                str(reply[0]), int(reply[1]), str(reply[2]), str(reply[3]), str(reply[4]), [str(o) for o in reply[5:]]
            )
        except (ValueError, IndexError) as exc:
            raise StorageCorruptError(f"Run record {run_id} is corrupt: {exc!r}") from None

    def call_done(
        self, run_id: str, epoch: int, key: str, outcome: str, error: str, wake_prefix: str
    ) -> list[str] | None:
        """Journal a called task's outcome (``call_done.lua``): the owners to
        wake, the n-th by message ``f"{wake_prefix}-{n}"``; None when the call
        already had an outcome (a late or second delivery)."""
        k = self.run_keys(run_id)
        reply = self._run(
            "call_done",
            [k.run, k.journal, k.waits, k.live, k.running, k.steps],
            [epoch, now_ms(), key, outcome, error, wake_prefix],
        )
        if reply and reply[0] == "late":
            return None
        refuse(run_id, reply)
        return [str(owner) for owner in reply[1:]]

    def signal(self, run_id: str, namespace: str, name: str, payload_json: str, wake_prefix: str) -> Signalled:
        """Keep a signal for the run and wake what waits for it (``signal.lua``)."""
        k = self.run_keys(run_id)
        reply = self._run(
            "signal",
            [k.run, k.signals, k.waits, k.live, k.progress],
            [now_ms(), name, payload_json, wake_prefix, self.channel(namespace)],
        )
        if not reply or reply[0] == "missing":
            return Signalled("missing")
        if reply[0] == "refused":
            return Signalled("refused", status=str(reply[1]))
        return Signalled("ok", epoch=int(reply[1]), owners=[str(owner) for owner in reply[2:]])

    def report_worker(self, worker: str, held: dict[str, str], gone: Sequence[str], at_ms: int) -> None:
        """Worker ``worker`` is alive at ``at_ms``, holds these messages (task id
        -> run id) and no longer holds ``gone``. Written as a change, never as
        a whole new set: a message reported by ``hold_message`` meanwhile stays."""
        held_key = self.keys.held_prefix + worker
        with storage_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.zadd(self.keys.workers, {worker: at_ms})
            if gone:
                pipe.hdel(held_key, *gone)
            if held:
                pipe.hset(held_key, mapping=held)
            pipe.execute()

    def hold_message(self, worker: str, task_id: str, run_id: str, at_ms: int) -> None:
        """Worker ``worker`` just received message ``task_id`` of the run: said
        at once, before the worker can die holding a message nobody knows of."""
        with storage_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.zadd(self.keys.workers, {worker: at_ms})
            pipe.hset(self.keys.held_prefix + worker, task_id, run_id)
            pipe.execute()

    def forget_worker(self, worker: str) -> None:
        """A worker that stops cleanly holds nothing: it is not dead, only gone."""
        with storage_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.zrem(self.keys.workers, worker)
            pipe.delete(self.keys.held_prefix + worker)
            pipe.execute()

    def claim_dead_workers(self, silent_since_ms: int) -> dict[str, dict[str, list[str]]]:
        """Workers silent since before ``silent_since_ms``, claimed by this caller alone:
        worker -> run id -> the task ids of the run it held."""
        reply = self._run("claim_dead_workers", [self.keys.workers], [silent_since_ms, self.keys.held_prefix])
        dead: dict[str, dict[str, list[str]]] = {}
        for worker, text in zip(reply[::2], reply[1::2], strict=True):
            runs: dict[str, list[str]] = {}
            for pair in str(text).split():
                task_id, _, run_id = pair.partition("|")
                runs.setdefault(run_id, []).append(task_id)
            dead[str(worker)] = runs
        return dead

    def mark_lost(self, run_id: str, task_ids: Sequence[str]) -> int:
        """The messages ``task_ids`` of the run died with their worker; how many were in flight."""
        k = self.run_keys(run_id)
        return int(self._run("mark_lost", [k.run, k.live], [now_ms(), *task_ids]))

    def report_empty(self, queues: Sequence[str], at_ms: int) -> None:
        """The broker held no message in ``queues`` at ``at_ms``."""
        if queues:
            with storage_errors():
                self.client.hset(self.keys.queues_empty, mapping=dict.fromkeys(queues, at_ms))

    def queue_room(self) -> str:
        """When each of the engine's queues was last found empty, as liveness takes it."""
        with storage_errors():
            seen = cast(dict[str, str], self.client.hgetall(self.keys.queues_empty))
        s = self.settings
        kinds = {"c": s.coordinator_queue, "s": s.steps_queue, "a": s.agents_queue}
        return ",".join(f"{kind}={seen[queue]}" for kind, queue in kinds.items() if seen.get(queue, "").isdigit())

    def refused_writes(self, run_id: str) -> int:
        """How many writes the fence refused for this run (stale epochs)."""
        with storage_errors():
            return int(cast(str | None, self.client.hget(self.run_keys(run_id).run, "refused")) or 0)

    def cancel(self, run_id: str, namespace: str, message: str) -> tuple[str, int | None]:
        """Request cancellation; on 'requested' the caller sends coordinator message ``message``."""
        k = self.run_keys(run_id)
        reply = self._run("cancel", [k.run, k.progress, k.live, k.waits], [now_ms(), self.channel(namespace), message])
        epoch = int(reply[1]) if reply[0] == "requested" else None
        if reply[0] == "cancelled":
            self.unschedule(run_id)
            self._retain(run_id)
        return str(reply[0]), epoch

    # -- progress --------------------------------------------------------------

    def progress_page(self, run_id: str, phase_id: str, mode: PageMode, cursor: int, count: int) -> ProgressSlice:
        """A page of records in ascending seq: the first ``count`` after
        ``cursor``, the last ``count`` before it, or the newest ``count`` of
        the run (``phase_id`` ''), or of one phase; with its bounds, read in
        the same snapshot."""
        k = self.run_keys(run_id)
        cursor = min(max(cursor, 0), MAX_SEQ)
        reply = self._run("read_progress", [k.run, k.progress, k.progress_phases], [phase_id, mode, cursor, count])
        return parse_slice(run_id, reply)

