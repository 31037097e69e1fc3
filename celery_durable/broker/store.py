"""The one object that talks to Redis for runs, journals and progress.

Every write made on behalf of an attempt goes through a Lua script that
checks the attempt's epoch in the same script. Redis errors are translated
at the edge (``connection.storage_errors``) into
``StorageUnavailableError``/``StorageCorruptError``. The sweep's calls live
in ``fleet_store.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any, cast

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from celery_durable.broker import schema
from celery_durable.broker.connection import RedisClient, connect, storage_errors
from celery_durable.broker.fleet_store import FleetLiveness
from celery_durable.broker.journal import READ_ENTRIES_BUDGET, Activation, BranchStart, CallDone, Flags, PassHere
from celery_durable.broker.keys import KeySpace, RunKeys
from celery_durable.broker.progress import MAX_SEQ, PageMode, ProgressSlice, parse_slice
from celery_durable.broker.records import RunRecord
from celery_durable.broker.redis_journal import RedisJournal, flags_of
from celery_durable.broker.scripts import Clock, Scripts, now_ms, refuse
from celery_durable.config import Settings
from celery_durable.errors import StorageCorruptError, StorageError

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
class PassedOn:
    """``pass_on.lua``'s answer: whether the caller sends the new message, and
    whether this is the first message since a pass last ran to find no worker
    that knows the workflow."""

    sent: bool
    first: bool


HASHES = ("run", "journal", "steps", "running", "agents", "live", "waits", "signals")


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


class RunStore(FleetLiveness):
    """Runs, journals, progress and fencing on one Redis, or on a Redis Cluster."""

    def __init__(self, settings: Settings, client: RedisClient | None = None, clock: Clock = now_ms) -> None:
        self.settings = settings
        self.clock = clock
        """Milliseconds since the epoch, as every script is told the time: the
        wall clock, or a test environment's virtual one (``testing.clock``)."""
        self.keys = KeySpace(settings.key_prefix)
        self.client: RedisClient = client or connect(settings)
        self._scripts = Scripts(self.client)

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        with storage_errors():
            return self._scripts[name](keys=list(keys), args=list(args))

    def _run_and_look(self, name: str, keys: Sequence[str], args: Sequence[Any], run_id: str, now: int) -> Any:
        """Run a script, and have the sweep look at the run a lease from
        ``now`` at the latest (the schedule is a hint, in a slot of its own)."""
        at_ms = now + self.lease_ms
        return self._run_with(
            name, keys, args, lambda pipe: pipe.zadd(self.keys.sweep_due, {run_id: at_ms}, lt=True)
        )

    def _run_with(
        self, name: str, keys: Sequence[str], args: Sequence[Any], writes: Callable[[Any], None]
    ) -> Any:
        """Run a script, then ``writes`` (commands on keys outside its slot,
        none of which depends on it): in one round trip on one Redis, a
        pipeline but not a transaction; in two on a Cluster, where they
        live on other nodes. Returns the script's reply."""
        if isinstance(self.client, RedisCluster):
            reply = self._run(name, keys, args)
            with storage_errors():
                pipe = self.client.pipeline(transaction=False)  # type: ignore[no-untyped-call]
                writes(pipe)
                pipe.execute()
            return reply
        script = self._scripts[name]
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            writes(pipe)
            reply, *rest = pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):  # a restarted Redis: the script loads again
                reply = script(keys=list(keys), args=list(args))
            elif isinstance(reply, Exception):
                raise reply
            for failed in rest:
                if isinstance(failed, Exception):
                    raise failed
        return reply

    def now_ms(self) -> int:
        return self.clock()

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
        return bool(self._run("create_run", [k.run, k.live], [message, self.clock(), retention_ms, *flat]))

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

    def hashes(self, run_id: str) -> RunHashes:
        """The run's hashes as they are now (one round trip; all empty for an unknown run)."""
        k = self.run_keys(run_id)
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            for name in HASHES:
                pipe.hgetall(getattr(k, name))
            return RunHashes(*pipe.execute())

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

    def activate(self, run_id: str, epoch: int, token: str, namespace: str, resend: str) -> Flags | int:
        """Take the activation lock for the pass whose task id is ``token`` and
        return the run's flags; when another pass holds it (and was told to
        run once more), the ms until the message ``resend`` is due."""
        reply = self._activate(run_id, epoch, token, namespace, resend, [])
        return reply if isinstance(reply, int) else flags_of(reply)

    def activate_reading(
        self, run_id: str, epoch: int, token: str, namespace: str, resend: str, seq: str, start: int
    ) -> Activation:
        """``activate``, and once the lock is taken, sequence ``seq`` of the
        journal from index ``start`` on, read in the same script: a kept body
        learns whether it is still current without a round trip of its own."""
        reply = self._activate(run_id, epoch, token, namespace, resend, [seq, start])
        return _activation(run_id, reply, seq, start)

    def _activate(
        self, run_id: str, epoch: int, token: str, namespace: str, resend: str, tail: list[Any]
    ) -> list[Any] | int:
        k = self.run_keys(run_id)
        keys = [k.run, k.progress, k.live, *([k.journal] if tail else [])]
        args = [epoch, token, self.clock(), *self._lock_args(namespace, resend), *tail]
        reply = self._run("activate", keys, args)
        if reply and reply[0] == "busy":
            return int(reply[1])
        refuse(run_id, reply)
        return cast(list[Any], reply)

    def _lock_args(self, namespace: str, resend: str) -> list[Any]:
        """activate.lua's ARGV[4] to ARGV[7]: lock ttl, lease ttl, events channel, resend id."""
        return [self.lease_ms, self.lease_ms, self.channel(namespace), resend]

    def release(self, run_id: str, token: str, epoch: int) -> bool:
        """Release the lock; True when another activation arrived and the caller must run again."""
        k = self.run_keys(run_id)
        return bool(self._run("release", [k.run, k.live], [token, epoch, self.clock()]))

    def redirect_wake(self, run_id: str, epoch: int, token: str, new: str) -> bool:
        """A wake sent home and not started yet is to go to the coordinator
        queue as message ``new`` (``redirect_wake.lua``): True when it is."""
        k = self.run_keys(run_id)
        return bool(self._run("redirect_wake", [k.run, k.live], [epoch, token, new, self.clock()]))

    def pass_on(
        self, run_id: str, epoch: int, token: str, new: str, kind: str, due_ms: int, message: str
    ) -> PassedOn:
        """Message ``token`` reached a worker that does not know the run's
        workflow: it goes back to its queue as ``new`` (``pass_on.lua``)."""
        k = self.run_keys(run_id)
        reply = self._run(
            "pass_on", [k.run, k.live, k.progress], [epoch, token, new, self.clock(), kind, due_ms, message]
        )
        return PassedOn(sent=reply[0] == 1, first=reply[1] == 1)

    def heartbeat(
        self, run_id: str, epoch: int, token: str, *, coordinator: bool = False, wake: str = ""
    ) -> tuple[Flags, bool]:
        """Renew the running task ``token``; the flags, and whether a ceiling was
        newly reached and the coordinator must be woken by message ``wake``."""
        k = self.run_keys(run_id)
        reply = self._run(
            "heartbeat",
            [k.run, k.live],
            [epoch, token, self.clock(), self.lease_ms, self.lease_ms, wake, int(coordinator)],
        )
        refuse(run_id, reply)
        return flags_of(reply), reply[4] == 1

    def branch_start(
        self,
        run_id: str,
        epoch: int,
        workflow: str,
        token: str,
        call: str,
        indices: Sequence[int],
        seqs: Sequence[str],
    ) -> BranchStart | str:
        """A branch task for branches ``indices`` of fan-out ``call`` starts:
        its message runs, its lease starts now, and what it reads first comes
        back with it (``branch_start.lua``); or the refusal:
        'missing', 'stale' (another attempt's message), 'forged' (another
        workflow's, or naming branches its fan-out has not), 'unknown' (a
        message the run does not count in flight: never sent, or delivered
        again after it ended) or 'settled'."""
        k = self.run_keys(run_id)
        fields = [schema.branch_field(call, j) for j in indices]
        args = [epoch, workflow, token, self.clock(), self.lease_ms, schema.handoff_field(call, token)]
        reply = self._run("branch_start", [k.run, k.live, k.journal],
                          [*args, READ_ENTRIES_BUDGET, len(fields), *fields, *seqs])
        if not reply or reply[0] != "ok":
            return str(reply[0]) if reply else "missing"
        try:
            flat, handed, outcomes, sequences = reply[4], reply[5], reply[6], reply[7]
            raw = dict(zip(flat[::2], flat[1::2], strict=True))
        except (IndexError, TypeError, ValueError):
            raise StorageCorruptError(f"branch_start replied in a shape it never sends: {reply!r:.80}") from None
        return BranchStart(
            record=schema.parse_run(run_id, raw),
            flags=flags_of(reply),
            outcomes=[raw_outcome or None for raw_outcome in outcomes],
            handed_off=schema.parse_handoff(handed or None, epoch),
            sequences={
                seq: schema.parse_sequence(run_id, seq, history)
                for seq, history in zip(seqs, sequences, strict=False)
            },
        )

    def task_end(self, run_id: str, epoch: int, token: str, wake: str = "") -> bool:
        """A branch task ended; True when a pause waits for it and the
        coordinator must be woken by message ``wake``."""
        k = self.run_keys(run_id)
        reply = self._run("task_end", [k.run, k.live], [epoch, token, self.clock(), wake])
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
            clock=self.clock,
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
            [epoch, self.clock(), agent_id, token, self.lease_ms, resend, delay_ms],
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
            [epoch, self.clock(), agent_id, outcome, row_json, *usage, token, wake_prefix],
        )
        refuse(run_id, reply)
        return str(reply[1]).split()

    def agent_rows(self, run_id: str) -> dict[str, str]:
        with storage_errors():
            return cast(dict[str, str], self.client.hgetall(self.run_keys(run_id).agents))

    def pause(self, run_id: str, namespace: str, message: str) -> tuple[str, int | None]:
        """Request a pause; on 'requested' the caller sends coordinator message ``message``."""
        k = self.run_keys(run_id)
        reply = self._run("pause", [k.run, k.live], [self.channel(namespace), self.clock(), message])
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
                self.clock(),
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
                self.clock(),
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
        self.schedule_check(record.run_id, self.clock() + self.lease_ms)
        self._persist_idempotency(record)
        return int(reply[1])

    def halt(self, record: RunRecord) -> bool:
        """Halt a run whose attempt died (auto_recover off); False if it changed meanwhile."""
        k = self.run_keys(record.run_id)
        room = self.queue_room()
        reply = self._run(
            "halt",
            [k.run, k.progress, k.steps, k.running, k.agents, k.live, k.waits],
            [record.epoch, record.status, self.clock(), self.channel(record.namespace), self.lease_ms, room],
        )
        if reply[0] == "ok":
            self.unschedule(record.run_id)
            self._retain(record.run_id)
        return bool(reply[0] == "ok")

    def call_done(
        self, run_id: str, epoch: int, key: str, outcome: str, error: str, wake_prefix: str
    ) -> list[str] | None:
        """Journal a called task's outcome (``call_done.lua``): the owners to
        wake, the n-th by message ``f"{wake_prefix}-{n}"``; None when the call
        already had an outcome (a late or second delivery)."""
        done = self.call_done_here(run_id, epoch, key, outcome, error, wake_prefix, None)
        return None if done is None else done.owners

    def call_done_here(
        self, run_id: str, epoch: int, key: str, outcome: str, error: str, wake_prefix: str, here: PassHere | None
    ) -> CallDone | None:
        """``call_done``; with ``here``, when the answer wakes the main body
        alone, the same script takes the lock of its pass for the caller (one
        round trip where a wake run in place took two)."""
        k = self.run_keys(run_id)
        now = self.clock()
        keys = [k.run, k.journal, k.waits, k.live, k.running, k.steps]
        args: list[Any] = [epoch, now, key, outcome, error, wake_prefix]
        if here is not None:
            keys.append(k.progress)
            lock = self._lock_args(here.namespace, here.resend)
            args += [here.token, *lock, here.seq, here.start, "1" if here.soft else ""]
        # The sweep looks at the run a lease from now, should the wake this
        # answer sends be lost (a run waiting on a call without a time-out is
        # not on its schedule otherwise). Sent with the script, before its
        # reply says whether the answer was taken.
        reply = self._run_and_look("call_done", keys, args, run_id, now)
        if reply and reply[0] in ("settled", "missing"):
            self.unschedule(run_id)  # an answer after the end: the run has nothing for the sweep to watch
        if reply and reply[0] == "late":
            return None
        if reply and reply[0] == "here" and here is not None:
            activation = _activation(run_id, list(reply[1:]), here.seq, here.start)
            return CallDone([schema.MAIN], activation)
        refuse(run_id, reply)
        return CallDone([str(owner) for owner in reply[1:]])

    def signal(self, run_id: str, namespace: str, name: str, payload_json: str, wake_prefix: str) -> Signalled:
        """Keep a signal for the run and wake what waits for it (``signal.lua``)."""
        k = self.run_keys(run_id)
        reply = self._run(
            "signal",
            [k.run, k.signals, k.waits, k.live, k.progress],
            [self.clock(), name, payload_json, wake_prefix, self.channel(namespace)],
        )
        if not reply or reply[0] == "missing":
            return Signalled("missing")
        if reply[0] == "refused":
            return Signalled("refused", status=str(reply[1]))
        return Signalled("ok", epoch=int(reply[1]), owners=[str(owner) for owner in reply[2:]])

    def refused_writes(self, run_id: str) -> int:
        """How many writes the fence refused for this run (stale epochs)."""
        with storage_errors():
            return int(cast(str | None, self.client.hget(self.run_keys(run_id).run, "refused")) or 0)

    def cancel(self, run_id: str, namespace: str, message: str) -> tuple[str, int | None]:
        """Request cancellation; on 'requested' the caller sends coordinator message ``message``."""
        k = self.run_keys(run_id)
        args = [self.clock(), self.channel(namespace), message]
        reply = self._run("cancel", [k.run, k.progress, k.live, k.waits], args)
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


def _activation(run_id: str, reply: list[Any] | int, seq: str, start: int) -> Activation:
    """activate.lua's reply with a tail, parsed (a busy lock: already the ms)."""
    if isinstance(reply, int):
        return reply
    if reply and reply[0] == "busy":
        return int(reply[1])
    refuse(run_id, reply)
    return flags_of(reply), schema.parse_sequence(run_id, seq, reply[4:], start)
