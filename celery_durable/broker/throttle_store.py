"""Throttles in Redis (SPEC §5e): a throttle's settings, holders and queue
in its own slot (``{throttle:<namespace>:<name>}``), and each run's slot
intents and throttle waits in the run's. No script touches both: the
callers order them (``tasks/throttling.py``) so that a crash between two
leaves nothing lost for good, and the sweep's look at a throttle
(``{sweep}:throttles``) repairs what a caller that died left.

Part of ``RunStore`` (a base class of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.cluster import RedisCluster

from celery_durable.broker.connection import storage_errors
from celery_durable.broker.keys import ThrottleKeys
from celery_durable.broker.replies import fleet as parse_fleet
from celery_durable.broker.replies import throttles as parse
from celery_durable.broker.replies.fleet import DueRuns
from celery_durable.broker.replies.throttles import Admitted, Granted
from celery_durable.broker.store_core import StoreCore


@dataclass(frozen=True, slots=True)
class ThrottleState:
    """What the store holds of one throttle, raw: its conf hash, counts, and
    (``detail``) its holders, waiters and per-key counts."""

    conf: dict[str, str]
    holding: int
    waiting: int
    holders: dict[str, str]
    waiters: dict[str, str]
    keys: dict[str, str]


@dataclass(frozen=True, slots=True)
class RunHolds:
    """A run's throttle facts as read for a give-back: its status and epoch,
    its own slot's throttle (None: none) and the epoch granted it, and its
    ops' intents (op -> "<epoch>|<state>|<throttle>|<key>")."""

    status: str | None
    epoch: int
    namespace: str
    throttle: str | None
    slot: int | None
    intents: dict[str, str]


def look_member(namespace: str, name: str) -> str:
    return f"{namespace} {name}"


def split_member(member: str) -> tuple[str, str]:
    namespace, _, name = member.partition(" ")
    return namespace, name


class ThrottleStore(StoreCore):
    """``RunStore``'s throttle calls."""

    def throttle_keys(self, namespace: str, name: str) -> ThrottleKeys:
        return self.keys.throttle(namespace, name)

    # -- a throttle's own slot -------------------------------------------------

    def throttle_set(self, namespace: str, name: str, settings: Sequence[str]) -> Admitted:
        """Create or replace a throttle (listed in its namespace first, so a
        crash between leaves a name the listing skips, never a throttle unlisted)."""
        with storage_errors():
            self.client.zadd(self.keys.namespace(namespace).throttles, {name: 0})
        reply = self.call("throttle_set", self.throttle_keys(namespace, name), [self.clock(), *settings])
        return parse.throttle_set(reply)

    def throttle_names(self, namespace: str) -> list[str]:
        with storage_errors():
            return cast(list[str], self.client.zrange(self.keys.namespace(namespace).throttles, 0, -1))

    def throttle_read(self, namespace: str, name: str, *, detail: bool = False) -> ThrottleState | None:
        """One throttle as stored, in one round trip; None when it does not exist."""
        t = self.throttle_keys(namespace, name)
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(t.conf)
            pipe.hlen(t.holders)
            pipe.hlen(t.waiters)
            if detail:
                pipe.hgetall(t.holders)
                pipe.hgetall(t.waiters)
                pipe.hgetall(t.keys)
            replies = pipe.execute()
        if not replies[0]:
            return None
        holders, waiters, keys = replies[3:] if detail else ({}, {}, {})
        return ThrottleState(replies[0], int(replies[1]), int(replies[2]), holders, waiters, keys)

    def throttle_delete(self, namespace: str, name: str) -> list[tuple[str, int]] | None:
        """Delete a throttle: its waiters (holder, epoch), or None when it did not exist."""
        waiters = parse.throttle_delete(self.call("throttle_delete", self.throttle_keys(namespace, name), []))
        with storage_errors():
            self.client.zrem(self.keys.namespace(namespace).throttles, name)
        return waiters

    def throttle_acquire(self, namespace: str, name: str, holder: str, epoch: int, key: str, priority: int) -> Admitted:
        """Ask for a slot. The throttle's look is scheduled a lease from now
        first (one round trip on one Redis): a holder whose run never hears
        of its slot, or is gone, is found by the sweep."""
        args = [self.clock(), holder, epoch, key, priority]
        self._look_at_throttles([look_member(namespace, name)], self.clock() + self.lease_ms)
        return parse.throttle_acquire(self.call("throttle_acquire", self.throttle_keys(namespace, name), args))

    def throttle_release(self, namespace: str, name: str, pairs: Sequence[tuple[str, str]]) -> Admitted:
        """Give back the slots and places of ``(holder, which)`` pairs, ``which``
        being ``=E`` (attempt E's only), ``!E`` (any but attempt E's) or ''
        (any), and admit whoever may go now."""
        args: list[Any] = [self.clock(), *(item for pair in pairs for item in pair)]
        return parse.throttle_release(self.call("throttle_release", self.throttle_keys(namespace, name), args))

    # -- the sweep's looks at throttles ----------------------------------------

    def _look_at_throttles(self, members: Sequence[str], at_ms: int) -> None:
        if members:
            parse_fleet.look(self._run_alone("look", [self.keys.sweep_throttles], [at_ms, *members]))

    def look_at_throttle(self, namespace: str, name: str, at_ms: int) -> None:
        """Have the sweep look at the throttle by ``at_ms`` (a rate's next admission)."""
        self._look_at_throttles([look_member(namespace, name)], at_ms)

    def claim_throttles(self, limit: int, claim_ms: int) -> DueRuns:
        """The throttles due for a look, claimed by this sweeper (``claim_due.lua``)."""
        reply = self._run_alone("claim_due", [self.keys.sweep_throttles], [self.clock(), limit, claim_ms])
        return parse_fleet.claim_due(reply)

    def throttles_looked(self, claim: str, looks: dict[str, int | None]) -> None:
        """Each claimed throttle's next look, or none (``looked.lua``)."""
        pairs: list[Any] = [item for member, at in looks.items() for item in (member, "" if at is None else at)]
        if pairs:
            parse_fleet.looked(self._run_alone("looked", [self.keys.sweep_throttles], [claim, *pairs]))

    # -- a run's side ----------------------------------------------------------

    def throttle_enter(self, run_id: str, epoch: int, op: str, name: str, key: str) -> bool:
        """Write op's slot intent (fenced); True when the slot is this attempt's already."""
        return parse.throttle_enter(self.call("throttle_enter", self.run_keys(run_id), [epoch, op, name, key]), run_id)

    def throttle_wait(self, run_id: str, epoch: int, op: str, owner: str, name: str, token: str = "") -> bool:
        """The owner waits for op's slot (fenced); True when it was given meanwhile."""
        args = [epoch, op, owner, name, token, self.clock()]
        return parse.throttle_wait(self.call("throttle_wait", self.run_keys(run_id), args), run_id)

    def throttle_granted(self, run_id: str, op: str, epoch: int, prefix: str) -> Granted:
        """Tell the run its holder was given a slot; the owner woken, if it waited."""
        args = [op, epoch, prefix, self.clock()]
        reply = self.call("throttle_granted", self.run_keys(run_id), args)
        return parse.throttle_granted(reply, run_id)

    def throttle_holds(self, run_id: str) -> RunHolds:
        """What the run may hold or wait for, in one round trip."""
        k = self.run_keys(run_id)
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(k.run, ["status", "epoch", "namespace", "throttle", "slot", "throttled"])
            pipe.hgetall(k.throttles)
            (status, epoch, namespace, throttle, slot, _), intents = pipe.execute()
        return RunHolds(
            status=status,
            epoch=int(epoch or 0),
            namespace=namespace or "",
            throttle=throttle or None,
            slot=int(slot) if slot else None,
            intents=intents or {},
        )

    def runs_holding(self, holders: Sequence[tuple[str, str]]) -> list[tuple[RunHolds, bool]]:
        """For each ``(run id, op)``: the run's facts, and whether its throttle
        wait for that op is still there (a grant it never heard of). One round
        trip on one Redis."""
        if not holders:
            return []
        if isinstance(self.client, RedisCluster):
            out = []
            for run_id, op in holders:
                with storage_errors():
                    waits = bool(self.client.hexists(self.run_keys(run_id).waits, f"t:{op}"))
                out.append((self.throttle_holds(run_id), waits))
            return out
        with storage_errors():
            pipe = self.client.pipeline(transaction=False)
            for run_id, op in holders:
                k = self.run_keys(run_id)
                pipe.hmget(k.run, ["status", "epoch", "namespace", "throttle", "slot", "throttled"])
                pipe.hgetall(k.throttles)
                pipe.hexists(k.waits, f"t:{op}")
            replies = pipe.execute()
        out = []
        for i in range(len(holders)):
            (status, epoch, namespace, throttle, slot, _), intents, waits = replies[3 * i : 3 * i + 3]
            holds = RunHolds(
                status, int(epoch or 0), namespace or "", throttle or None, int(slot) if slot else None, intents or {}
            )
            out.append((holds, bool(waits)))
        return out

    def throttle_forget(self, run_id: str, intents: dict[str, str]) -> None:
        """Forget intents whose slots were given back (each only as read)."""
        if intents:
            pairs = [item for op, value in intents.items() for item in (op, value)]
            parse.throttle_forget(self.call("throttle_forget", self.run_keys(run_id), pairs), run_id)
