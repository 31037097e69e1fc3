"""The one object that talks to Redis for runs, journals and progress.

Every write made on behalf of an attempt goes through a Lua script that
checks the attempt's epoch in the same script. Redis errors are translated
here, at the edge, into ``StorageUnavailableError``/``StorageCorruptError``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass
from typing import Any, cast

import redis
import redis.exceptions

from celery_durable.broker.keys import KeySpace, RunKeys
from celery_durable.broker.progress import MAX_SEQ, PageMode, ProgressSlice, parse_slice
from celery_durable.broker.records import RunRecord
from celery_durable.broker.scripts import Scripts
from celery_durable.config import Settings
from celery_durable.errors import StaleAttemptError, StorageCorruptError, StorageUnavailableError

logger = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


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


@dataclass(frozen=True, slots=True)
class Flags:
    """Control flags returned by every fenced write."""

    cancel: bool
    pause: bool
    limit: str = ""


@dataclass(frozen=True, slots=True)
class SequenceHistory:
    """One sequence as journaled: entries are (epoch, identity, value)."""

    cut: tuple[int, int] | None
    high_water: int
    entries: list[tuple[int, str, str | None]]

    def live_entries(self) -> list[tuple[str, str | None]]:
        """The history replay must follow: entries up to the first dead one."""
        live: list[tuple[str, str | None]] = []
        for index, (epoch, identity, value) in enumerate(self.entries):
            if self.cut is not None and index > self.cut[1] and epoch < self.cut[0]:
                break
            live.append((identity, value))
        return live


def _refuse(run_id: str, reply: Sequence[Any]) -> None:
    """Raise for a fence refusal; return for any other reply."""
    verdict = reply[0] if reply else "missing"
    if verdict == "missing":
        raise StorageCorruptError(f"Run record {run_id} is missing")
    if verdict in ("stale", "settled"):
        raise StaleAttemptError(f"Run {run_id}: this attempt no longer owns the run ({verdict})")


@dataclass(frozen=True, slots=True)
class PendingCommit:
    """A step's journal write, held back to travel with its sequence's next
    call (``commit_begin``): the arguments of ``record_op``, in the order of
    ``commit_begin.lua``'s ARGV[5..10]."""

    index: int
    identity: str
    value_field: str
    value: str
    step_key: str
    step_row: str


def _begin_args(
    cut: str | None, step_key: str, step_row: str, records: Sequence[tuple[int, str, str, str]]
) -> list[Any]:
    """The ARGV tail that begins a call (begin_call in ``_prelude.lua``):
    cut, step key, step row, then the buffered progress records, flat."""
    return [cut or "", step_key, step_row, len(records), *(field for record in records for field in record)]


def _flags(reply: Sequence[Any], offset: int = 1) -> Flags:
    return Flags(cancel=reply[offset] == "1", pause=reply[offset + 1] == "1", limit=str(reply[offset + 2] or ""))


class RunStore:
    """Runs, journals, progress and fencing on one Redis."""

    def __init__(self, settings: Settings, client: redis.Redis | None = None) -> None:
        self.settings = settings
        self.keys = KeySpace(settings.key_prefix)
        self.client: redis.Redis = client or redis.Redis.from_url(
            settings.redis_url,
            decode_responses=True,
            socket_connect_timeout=5,
            socket_timeout=30,
            health_check_interval=30,
        )
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

    def create_run(self, run_id: str, fields: dict[str, str]) -> bool:
        flat: list[str] = []
        for name, value in fields.items():
            flat.extend((name, value))
        return bool(self._run("create_run", [self.run_keys(run_id).run], flat))

    def index_run(self, namespace: str, run_id: str, idempotency_key: str | None) -> str:
        ns = self.keys.namespace(namespace)
        keys = [ns.runs, ns.counter]
        if idempotency_key is not None:
            keys.append(ns.idempotency(idempotency_key))
        return str(self._run("index_run", keys, [run_id, ns.events]))

    def discard_run(self, run_id: str, epoch: int) -> None:
        self._run("discard_run", [self.run_keys(run_id).run], [epoch])

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
        except (StorageUnavailableError, StorageCorruptError) as exc:
            logger.warning("run %s settled, but its retention could not be set: %s", run_id, exc)

    def _persist_idempotency(self, record: RunRecord) -> None:
        if record.idempotency_key:
            with storage_errors():
                self.client.persist(self.keys.namespace(record.namespace).idempotency(record.idempotency_key))

    def load_run(self, run_id: str) -> RunRecord | None:
        with storage_errors():
            raw = cast(dict[str, str], self.client.hgetall(self.run_keys(run_id).run))
        return RunRecord.parse(run_id, raw) if raw else None

    def load_runs(self, run_ids: Sequence[str]) -> list[RunRecord]:
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            for run_id in run_ids:
                pipe.hgetall(self.run_keys(run_id).run)
            raws = pipe.execute()
        return [RunRecord.parse(run_id, raw) for run_id, raw in zip(run_ids, raws, strict=True) if raw]

    def list_run_ids(self, namespace: str, before_score: float | None, count: int) -> list[tuple[str, float]]:
        """Run ids of a namespace, newest first, strictly before ``before_score``."""
        top = f"({before_score}" if before_score is not None else "+inf"
        with storage_errors():
            rows = self.client.zrevrangebyscore(
                self.keys.namespace(namespace).runs, top, "-inf", start=0, num=count, withscores=True
            )
        return [(str(member), float(score)) for member, score in rows]

    # -- activation and liveness ---------------------------------------------

    def activate(self, run_id: str, epoch: int, token: str, namespace: str) -> Flags | int:
        """Take the activation lock and return the run's flags; when another
        pass holds it (and was told to run once more), the ms its lock has left."""
        k = self.run_keys(run_id)
        lease_ms = int(self.settings.lease_seconds * 1000)
        reply = self._run(
            "activate",
            [k.run, k.progress],
            [epoch, token, now_ms(), lease_ms, lease_ms, self.channel(namespace)],
        )
        if reply[0] == "busy":
            return int(reply[1])
        _refuse(run_id, reply)
        return _flags(reply)

    def release(self, run_id: str, token: str, epoch: int) -> bool:
        """Release the lock; True when another activation arrived and the caller must run again."""
        return bool(self._run("release", [self.run_keys(run_id).run], [token, epoch]))

    def heartbeat(self, run_id: str, epoch: int, token: str = "") -> Flags:
        lease_ms = int(self.settings.lease_seconds * 1000)
        reply = self._run("heartbeat", [self.run_keys(run_id).run], [epoch, token, now_ms(), lease_ms, lease_ms])
        _refuse(run_id, reply)
        return _flags(reply)

    # -- the journal -----------------------------------------------------------

    def read_sequence(self, run_id: str, seq: str) -> SequenceHistory:
        reply = self._run("read_sequence", [self.run_keys(run_id).journal], [seq])
        try:
            cut: tuple[int, int] | None = None
            if reply[0]:
                cut_epoch, cut_index = reply[0].split(":", 1)
                cut = (int(cut_epoch), int(cut_index))
            entries: list[tuple[int, str, str | None]] = []
            for i in range(2, len(reply), 2):
                epoch, identity = reply[i].split(":", 1)
                entries.append((int(epoch), identity, reply[i + 1] or None))
            return SequenceHistory(cut=cut, high_water=int(reply[1]) if reply[1] else -1, entries=entries)
        except (ValueError, IndexError) as exc:
            raise StorageCorruptError(f"Journal of run {run_id} is corrupt in sequence {seq}: {exc!r}") from None

    def begin_op(
        self,
        run_id: str,
        epoch: int,
        namespace: str,
        seq: str,
        cut: str | None,
        step_key: str,
        step_row: str,
        records: Sequence[tuple[int, str, str, str]],
    ) -> tuple[Flags, str | None]:
        """Flush progress and show a step running; returns the flags and the
        step's live outcome when it is already journaled."""
        k = self.run_keys(run_id)
        args = [epoch, now_ms(), self.channel(namespace), seq, *_begin_args(cut, step_key, step_row, records)]
        reply = self._run("begin_op", [k.run, k.progress, k.journal, k.running, k.progress_phases], args)
        _refuse(run_id, reply)
        return _flags(reply), (reply[4] or None)

    def commit_begin(
        self,
        run_id: str,
        epoch: int,
        namespace: str,
        seq: str,
        commit: PendingCommit,
        cut: str | None,
        step_key: str,
        step_row: str,
        records: Sequence[tuple[int, str, str, str]],
    ) -> tuple[str, Flags, str | None]:
        """Journal ``commit`` (the step the sequence ran last) and begin its
        next call, in one script. Returns ('ok', flags, the next step's live
        outcome or None), ('conflict', no flags, journaled identity) or
        ('winner', no flags, the value journaled first)."""
        k = self.run_keys(run_id)
        args = [
            epoch,
            now_ms(),
            self.channel(namespace),
            seq,
            *astuple(commit),
            *_begin_args(cut, step_key, step_row, records),
        ]
        reply = self._run("commit_begin", [k.run, k.progress, k.journal, k.running, k.progress_phases, k.steps], args)
        if reply[0] in ("conflict", "winner"):
            return str(reply[0]), Flags(False, False), str(reply[1])
        _refuse(run_id, reply)
        return "ok", _flags(reply), (reply[4] or None)

    def record_op(
        self,
        run_id: str,
        epoch: int,
        seq: str,
        index: int,
        identity: str,
        value_field: str = "",
        value: str = "",
        step_key: str = "",
        step_row: str = "",
    ) -> tuple[Flags, str | None, str | None]:
        """Journal one op. Returns (flags, winning value or None, conflicting identity or None)."""
        k = self.run_keys(run_id)
        reply = self._run(
            "record_op",
            [k.run, k.journal, k.steps, k.running],
            [epoch, now_ms(), seq, index, identity, value_field, value, step_key, step_row],
        )
        if reply[0] == "conflict":
            return Flags(False, False), None, str(reply[1])
        _refuse(run_id, reply)
        return _flags(reply), (reply[4] or None), None

    def dispatch(
        self, run_id: str, epoch: int, seq: str, index: int, identity: str, count: int, token: str, position: int
    ) -> tuple[str, bool, Any]:
        """Journal a fan-out op; returns (verdict, cut, detail): ('dispatch', cut, [indices]),
        ('pending', False, []) or ('conflict', False, journaled identity)."""
        k = self.run_keys(run_id)
        reply = self._run("dispatch", [k.run, k.journal], [epoch, seq, index, identity, count, token, position])
        if reply[0] == "conflict":
            return "conflict", False, str(reply[1])
        _refuse(run_id, reply)
        if reply[0] == "pending":
            return "pending", False, []
        return "dispatch", reply[1] == 1, [int(j) for j in reply[2:]]

    def mark_sent(self, run_id: str, epoch: int, call: str) -> None:
        k = self.run_keys(run_id)
        _refuse(run_id, self._run("mark_sent", [k.run, k.journal], [epoch, call]))

    def branch_outcomes(self, run_id: str, call: str, count: int) -> list[str | None]:
        fields = [f"r:{call}:{j}" for j in range(count)]
        if not fields:
            return []
        with storage_errors():
            return cast(list[str | None], self.client.hmget(self.run_keys(run_id).journal, fields))

    def complete_branch(self, run_id: str, epoch: int, call: str, index: int, outcome: str) -> bool:
        """Journal a branch outcome; True when the coordinator must be woken."""
        k = self.run_keys(run_id)
        reply = self._run("complete_branch", [k.run, k.journal], [epoch, call, index, outcome])
        _refuse(run_id, reply)
        return bool(reply[1] == 1)

    # -- agents ------------------------------------------------------------------

    def agent_call(
        self,
        run_id: str,
        epoch: int,
        seq: str,
        index: int,
        agent_id: str,
        request_json: str,
        owner: str,
        row_json: str,
        cut: str | None,
    ) -> tuple[str, Flags, str | None]:
        """Ask for an agent turn; (verdict, flags, outcome or conflicting identity)."""
        k = self.run_keys(run_id)
        reply = self._run(
            "agent_call",
            [k.run, k.journal, k.agents],
            [epoch, now_ms(), seq, index, f"a|{agent_id}", agent_id, request_json, owner, row_json, cut or ""],
        )
        if reply[0] == "conflict":
            return "conflict", Flags(False, False), str(reply[1])
        _refuse(run_id, reply)
        return str(reply[0]), _flags(reply), (reply[4] if len(reply) > 4 else None)

    def agent_start(self, run_id: str, epoch: int, agent_id: str) -> tuple[str, str | None]:
        """('go', request json), ('wait', None), ('done', None) or ('stale', None)."""
        k = self.run_keys(run_id)
        reply = self._run("agent_start", [k.run, k.journal, k.agents], [epoch, now_ms(), agent_id])
        _refuse(run_id, reply)
        return str(reply[0]), (str(reply[1]) if len(reply) > 1 else None)

    def agent_finish(
        self,
        run_id: str,
        epoch: int,
        agent_id: str,
        outcome: str,
        row_json: str,
        credits_nano: int,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> list[str]:
        """Journal a turn's outcome; returns the owners to wake."""
        k = self.run_keys(run_id)
        reply = self._run(
            "agent_finish",
            [k.run, k.journal, k.agents],
            [epoch, now_ms(), agent_id, outcome, row_json, credits_nano, prompt_tokens, completion_tokens],
        )
        _refuse(run_id, reply)
        return [owner for owner in str(reply[1]).split() if owner]

    def agent_rows(self, run_id: str) -> dict[str, str]:
        with storage_errors():
            return cast(dict[str, str], self.client.hgetall(self.run_keys(run_id).agents))

    def pause(self, run_id: str, namespace: str) -> tuple[str, int | None]:
        reply = self._run("pause", [self.run_keys(run_id).run], [self.channel(namespace)])
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
            [k.run, k.progress, k.steps, k.running, k.agents],
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
        _refuse(run_id, reply)
        self.unschedule(run_id)
        self._retain(run_id)

    def resume(
        self,
        record: RunRecord,
        *,
        limits_json: str,
        message: str,
        code_hash: str,
        require_expired: bool = False,
        ceilings: str = "",
    ) -> int | None:
        """Bump the epoch if the run is still as ``record`` saw it (and, for a
        recovery, its lease has expired); the new epoch, or None."""
        k = self.run_keys(record.run_id)
        first = [k.run, k.progress, k.steps, k.running, k.agents]
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
                int(self.settings.lease_seconds * 1000),
                code_hash,
                int(require_expired),
                ceilings,
            ],
        )
        if reply[0] != "ok":
            return None
        self.schedule_check(record.run_id, now_ms() + int(self.settings.lease_seconds * 1000))
        self._persist_idempotency(record)
        return int(reply[1])

    def halt(self, record: RunRecord) -> bool:
        """Halt a run whose attempt died (auto_recover off); False if it changed meanwhile."""
        k = self.run_keys(record.run_id)
        reply = self._run(
            "halt",
            [k.run, k.progress, k.steps, k.running, k.agents],
            [record.epoch, record.status, now_ms(), self.channel(record.namespace)],
        )
        if reply[0] == "ok":
            self.unschedule(record.run_id)
            self._retain(record.run_id)
        return bool(reply[0] == "ok")

    # -- the recovery sweep's schedule (not atomic with the run: it is a hint,
    # and the sweep re-reads the run hash before it acts) ---------------------

    def schedule_check(self, run_id: str, at_ms: int) -> None:
        with storage_errors():
            self.client.zadd(self.keys.sweep_due, {run_id: at_ms})

    def unschedule(self, run_id: str) -> None:
        with storage_errors():
            self.client.zrem(self.keys.sweep_due, run_id)

    def due_runs(self, now: int, count: int) -> list[str]:
        with storage_errors():
            due = self.client.zrangebyscore(self.keys.sweep_due, "-inf", now, start=0, num=count)
        return [str(member) for member in cast(list[Any], due)]

    def refused_writes(self, run_id: str) -> int:
        """How many writes the fence refused for this run (stale epochs)."""
        with storage_errors():
            return int(cast(str | None, self.client.hget(self.run_keys(run_id).run, "refused")) or 0)

    def cancel(self, run_id: str, namespace: str) -> tuple[str, int | None]:
        k = self.run_keys(run_id)
        reply = self._run("cancel", [k.run, k.progress], [now_ms(), self.channel(namespace)])
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

