"""What the recovery sweep reads and writes: the runs due on its schedule,
each run's liveness verdict, and the fleet's beats (which worker is
alive, which messages it holds, which queues were found empty).

Part of ``RunStore`` (a base class of it): these are the store's calls that
serve the sweep rather than one run's attempt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

from celery_durable.broker.connection import storage_errors
from celery_durable.broker.ops import OPS
from celery_durable.broker.replies import fleet as parse
from celery_durable.broker.replies.fleet import DeadWorker, DueRuns, Examined
from celery_durable.broker.schema.live import HeldMessage
from celery_durable.broker.store_core import StoreCore
from celery_durable.errors import StorageCorruptError

BUSY_AFTER_MS = 1500
"""Three sweep intervals: every worker's sweep looks at the queues twice a second."""

CHECKED = "checked"
"""The field of ``{fleet}:empty`` that says when the queues were last looked at."""

TAKE_OVER_WINDOW_MS = 3_600_000
"""How long a take-over is kept in its namespace's list: the fleet page shows the last hour."""
REGISTRY_KEPT_MS = 86_400_000
"""How long a worker that stopped beating stays in the registry (``list_workers`` shows it dead)."""
TAKE_OVERS_KEPT = 1000
"""At most this many are kept per namespace, the newest: a storm of take-overs costs no more."""


@dataclass(frozen=True, slots=True)
class TakeOverNote:
    """A run taken over by the sweep or a redelivery: recovered as a new
    attempt, or halted (``auto_recover`` off, or ``recovery_limit``)."""

    run_id: str
    outcome: str
    """``recovered``, ``halted`` or ``recovery_limit``."""
    cause: str
    """How the attempt died, as the sweep judged it."""
    epoch: int | None
    """The new attempt's epoch when recovered."""
    at_ms: int

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> TakeOverNote | None:
        """None for a member this version cannot read (it is skipped, not fatal)."""
        try:
            data = json.loads(text)
            return cls(str(data["run_id"]), str(data["outcome"]), str(data["cause"]), data["epoch"], int(data["at_ms"]))
        except (ValueError, KeyError, TypeError):
            return None


class FleetLiveness(StoreCore):
    """The sweep's calls of ``RunStore``."""

    def claim_due(self, now: int, count: int, hold_ms: int) -> DueRuns:
        """Runs due now, each handed to this caller alone for ``hold_ms``; and
        when the next run falls due."""
        return parse.claim_due(self.call("claim_due", None, [now, count, hold_ms], self.keys.sweep_due))

    def examine(self, run_id: str, room: str, *, fire_prefix: str = "") -> Examined | None:
        """The run's status and liveness (``examine.lua``), or None when it does
        not exist. With ``fire_prefix``, its due timers fire: the owners to wake
        come back in ``woken``, the n-th (from 1) by message ``f"{fire_prefix}-{n}"``."""
        args = [self.clock(), self.lease_ms, room, int(bool(fire_prefix)), fire_prefix]
        return parse.examine(self.call("examine", self.run_keys(run_id), args), run_id)

    def examine_each(
        self, run_ids: Sequence[str], room: str, fire_prefixes: Sequence[str], *, resend: bool = False
    ) -> list[Examined | StorageCorruptError | None]:
        """``examine`` of many runs, their due timers fired, in one round trip
        (each run's script touches its own slot alone): the i-th run's woken
        owners by messages ``f"{fire_prefixes[i]}-{n}"``. With ``resend``
        (automatic recovery off), a run whose only fault is a coordinator
        message lost before it started is not dead: its main body is among the
        woken, at the same epoch. A run whose record is corrupt has its error
        in its place, so that the others go on."""
        now = self.clock()
        calls = [
            (self.run_keys(run_id), [now, self.lease_ms, room, int(bool(prefix)), prefix, int(resend)])
            for run_id, prefix in zip(run_ids, fire_prefixes, strict=True)
        ]
        looks: list[Examined | StorageCorruptError | None] = []
        for run_id, reply in zip(run_ids, self.call_each("examine", calls), strict=True):
            if isinstance(reply, StorageCorruptError):
                looks.append(reply)
                continue
            try:
                looks.append(parse.examine(reply, run_id))
            except StorageCorruptError as exc:
                looks.append(exc)
        return looks

    def report_worker(
        self, worker: str, held: dict[str, str], gone: Sequence[str], at_ms: int, profile: str | None = None
    ) -> None:
        """Worker ``worker`` is alive at ``at_ms``, holds these messages (task id
        -> run id) and no longer holds ``gone``. Written as a change, never as
        a whole new set: a message reported by ``hold_messages`` meanwhile stays.
        ``profile``: what it serves (``schema.profiles``), for ``list_workers``."""
        held_key = self.keys.held_prefix + worker
        with storage_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.zadd(self.keys.workers, {worker: at_ms})
            if profile is not None:
                pipe.zadd(self.keys.registry, {worker: at_ms})
                pipe.hset(self.keys.profiles, worker, profile)
            if gone:
                pipe.hdel(held_key, *gone)
            if held:
                pipe.hset(held_key, mapping=held)
            pipe.execute()

    def hold_messages(self, worker: str, held: Sequence[tuple[str, str]], at_ms: int) -> None:
        """Worker ``worker`` received these messages (``(task_id, held value)``,
        ``schema.live.HeldMessage``), not yet started: said in its beat's
        record, and a run's own marked held in its live hash (``received.lua``,
        one per run; a call's answer has no entry there). The fleet's keys and
        a run's live hash have different hash tags: one round trip on one
        Redis, more on a Cluster."""
        by_run: dict[str, list[str]] = {}
        for task_id, value in held:
            message = HeldMessage.parse(value)
            if message.answer_tag is None:
                by_run.setdefault(message.run_id, []).append(task_id)

        def beat(pipe: Any) -> None:
            pipe.zadd(self.keys.workers, {worker: at_ms})
            pipe.hset(self.keys.held_prefix + worker, mapping=dict(held))

        received = OPS["received"]
        calls = [(received.keys_of(self.run_keys(run_id)), [at_ms, *ids]) for run_id, ids in by_run.items()]
        for run_id, reply in zip(by_run, self._run_each_with("received", calls, beat), strict=True):
            parse.received(reply, run_id)

    def forget_worker(self, worker: str) -> None:
        """A worker that stops cleanly holds nothing: it is not dead, only gone."""
        with storage_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.zrem(self.keys.workers, worker)
            pipe.delete(self.keys.held_prefix + worker)
            pipe.zrem(self.keys.registry, worker)
            pipe.hdel(self.keys.profiles, worker)
            pipe.execute()

    def claim_dead_workers(self, silent_since_ms: int) -> dict[str, DeadWorker]:
        """Workers silent since before ``silent_since_ms``, claimed by this caller
        alone, with the messages each held."""
        return parse.claim_dead_workers(
            self.call("claim_dead_workers", self.keys, [silent_since_ms, self.keys.held_prefix])
        )

    def mark_lost(self, run_id: str, task_ids: Sequence[str]) -> int:
        """The messages ``task_ids`` of the run died with their worker; how many were in flight."""
        return parse.mark_lost(self.call("mark_lost", self.run_keys(run_id), [self.clock(), *task_ids]), run_id)

    def prune_expired(self, now: int, count: int) -> int:
        """Take runs whose retention ran out by ``now`` (at most ``count``) out
        of their namespace's index; a run resumed since (its keys persisted)
        is no longer expiring, and one whose clock was started again is looked
        at again then. Returns how many left an index."""
        with storage_errors():
            due = cast(list[str], self.client.zrangebyscore(self.keys.sweep_expiring, "-inf", now, 0, count))
            if not due:
                return 0
            runs = [member.split(" ", 1) for member in due]
            pipe = self.client.pipeline(transaction=False)
            for _, run_id in runs:
                pipe.pttl(self.run_keys(run_id).run)
            ttls = pipe.execute()
            pipe = self.client.pipeline(transaction=False)
            gone: dict[str, list[str]] = {}
            for member, (namespace, run_id), ttl in zip(due, runs, ttls, strict=True):
                if ttl > 0:
                    pipe.zadd(self.keys.sweep_expiring, {member: now + int(ttl)})
                    continue
                pipe.zrem(self.keys.sweep_expiring, member)
                if ttl == -2:  # the keys are gone
                    gone.setdefault(namespace, []).append(run_id)
            # Out of every index first: a pass that dies here finds them again.
            for namespace, run_ids in gone.items():
                self.indexes.forget(namespace, run_ids)
            pipe.execute()
        return sum(len(run_ids) for run_ids in gone.values())

    def report_empty(self, queues: Sequence[str], at_ms: int) -> None:
        """The broker held no message in ``queues`` at ``at_ms`` (a look at every
        queue of the engine; the others held some: ``CHECKED`` says when)."""
        with storage_errors():
            self.client.hset(self.keys.queues_empty, mapping={**dict.fromkeys(queues, at_ms), CHECKED: at_ms})

    def steps_queue_busy(self) -> bool:
        """The steps queue has held messages for a while (a backlog): at the
        sweeps' last look it had not been empty for ``BUSY_AFTER_MS``. No look
        yet, or a look long ago (a stalled sweeper), says nothing: not busy."""
        with storage_errors():
            seen, checked = cast(
                list[str | None], self.client.hmget(self.keys.queues_empty, [self.settings.steps_queue, CHECKED])
            )
        if not (seen and checked and seen.isdigit() and checked.isdigit()):
            return False
        return int(checked) - int(seen) > BUSY_AFTER_MS

    def queue_room(self) -> str:
        """When each of the engine's queues was last found empty, as liveness takes it."""
        with storage_errors():
            seen = cast(dict[str, str], self.client.hgetall(self.keys.queues_empty))
        s = self.settings
        kinds = {"c": s.coordinator_queue, "s": s.steps_queue, "a": s.agents_queue}
        return ",".join(f"{kind}={seen[queue]}" for kind, queue in kinds.items() if seen.get(queue, "").isdigit())

    # -- what the web view's fleet page reads ---------------------------------------------

    def note_take_over(self, namespace: str, note: TakeOverNote) -> None:
        """Keep ``note`` for the last hour, in its namespace's list (``keys.take_overs``)."""
        key = self.keys.take_overs(namespace)
        with storage_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.zadd(key, {note.encode(): note.at_ms})
            pipe.zremrangebyscore(key, "-inf", note.at_ms - TAKE_OVER_WINDOW_MS)
            pipe.zremrangebyrank(key, 0, -(TAKE_OVERS_KEPT + 1))
            pipe.pexpire(key, TAKE_OVER_WINDOW_MS)
            pipe.execute()

    def take_overs_since(self, namespace: str, since_ms: int, limit: int) -> tuple[int, list[TakeOverNote]]:
        """How many of the namespace's runs were taken over since ``since_ms``, and the newest ``limit``."""
        key = self.keys.take_overs(namespace)
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.zcount(key, since_ms, "+inf")
            pipe.zrevrangebyscore(key, "+inf", since_ms, start=0, num=limit)
            total, members = pipe.execute()
        notes = [note for note in map(TakeOverNote.decode, members) if note is not None]
        return int(total), notes

    def fleet_workers(self) -> dict[str, int]:
        """Every worker that beat and did not stop cleanly: name -> ms of its last beat."""
        with storage_errors():
            pairs = cast(list[tuple[str, float]], self.client.zrange(self.keys.workers, 0, -1, withscores=True))
        return {worker: int(score) for worker, score in pairs}

    def worker_profiles(self, now_ms: int) -> list[tuple[str, int, str | None]]:
        """Every worker that reported what it serves within ``REGISTRY_KEPT_MS``:
        (name, ms of its last beat, its profile as stored), newest beat first.
        Older ones are forgotten here."""
        since = now_ms - REGISTRY_KEPT_MS
        with storage_errors():
            stale = cast(list[str], self.client.zrangebyscore(self.keys.registry, "-inf", f"({since}"))
            if stale:
                pipe = self.client.pipeline(transaction=True)
                pipe.zrem(self.keys.registry, *stale)
                pipe.hdel(self.keys.profiles, *stale)
                pipe.execute()
            pairs = cast(list[tuple[str, float]], self.client.zrevrange(self.keys.registry, 0, -1, withscores=True))
            names = [name for name, _ in pairs]
            raws = cast(list[str | None], self.client.hmget(self.keys.profiles, names)) if names else []
        return [(name, int(score), raw) for (name, score), raw in zip(pairs, raws, strict=True)]

    def held_messages(self, workers: Sequence[str]) -> dict[str, dict[str, str]]:
        """Per worker, the messages it held at its last beat: task id -> run id."""
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            for worker in workers:
                pipe.hgetall(self.keys.held_prefix + worker)
            held = pipe.execute()
        return {
            worker: {task_id: HeldMessage.parse(value).run_id for task_id, value in messages.items()}
            for worker, messages in zip(workers, cast(list[dict[str, str]], held), strict=True)
        }

    def queues_seen_empty(self) -> tuple[dict[str, int], int | None]:
        """When each queue was last found empty, and when the sweeps last looked (None: never)."""
        with storage_errors():
            seen = cast(dict[str, str], self.client.hgetall(self.keys.queues_empty))
        checked = seen.pop(CHECKED, "")
        last_look = int(checked) if checked.isdigit() else None
        return {queue: int(at) for queue, at in seen.items() if at.isdigit()}, last_look
