"""Fake booking providers that honour idempotency keys, as real ones do.

A provider keeps its state in Redis under ``<key_prefix>:provider:<service>``,
apart from the journal: every raw call is counted per idempotency key, and the
first call with a key makes the reservation; a later call with the same key
returns that reservation again instead of booking twice. That is what makes a
step that runs twice (steps run at least once) book once.

A provider cancels a reservation once per idempotency key, however often it
is asked, and can be *sold out*: it then refuses every booking.

A provider can be told to *hold* its reply: the reservation is made, but the
answer does not come back until the hold is released. ``celery-durable demo``
uses it to kill the workers at the worst moment — the car is booked at the
provider, the workflow has not heard back, nothing is journaled yet. It is a
slow provider, not a change to the workflow or to the engine.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import redis

from celery_durable import Settings

HOLD_POLL_SECONDS = 0.02


@dataclass(frozen=True, slots=True)
class Receipt:
    """What one provider saw of one run: raw calls and reservations made."""

    service: str
    calls: int
    reservations: int
    confirmation: str | None
    cancellations: int = 0


class Providers:
    """The fake providers behind one Redis and one key prefix."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix

    def key(self, service: str, what: str) -> str:
        return f"{self.prefix}:provider:{service}:{what}"

    def book(self, service: str, idempotency_key: str, details: dict[str, Any]) -> dict[str, Any]:
        """Reserve ``service`` once per ``idempotency_key``; the reservation.
        A service sold out (``sell_out``) refuses, reserving nothing."""
        self.redis.hincrby(self.key(service, "calls"), idempotency_key, 1)
        if self.redis.exists(self.key(service, "sold-out")):
            raise SoldOut(f"No {service} left for {details.get('destination', 'this trip')}")
        confirmation = f"{service[:3].upper()}-{uuid.uuid4().hex[:6].upper()}"
        reservation = {"service": service, "confirmation": confirmation, **details}
        self.redis.hsetnx(self.key(service, "reservations"), idempotency_key, json.dumps(reservation))
        if self.redis.exists(self.key(service, "hold")):
            self.redis.sadd(self.key(service, "held"), idempotency_key)
            while self.redis.exists(self.key(service, "hold")):
                time.sleep(HOLD_POLL_SECONDS)
        stored = self.redis.hget(self.key(service, "reservations"), idempotency_key)
        return dict(json.loads(str(stored)))

    def cancel(self, service: str, idempotency_key: str) -> dict[str, Any]:
        """Cancel the reservation made under ``idempotency_key`` (once, however
        often it is asked); what the provider says."""
        self.redis.hincrby(self.key(service, "cancel-calls"), idempotency_key, 1)
        if not self.redis.hexists(self.key(service, "reservations"), idempotency_key):
            return {"service": service, "cancelled": False, "reason": "no such reservation"}
        self.redis.hsetnx(self.key(service, "cancellations"), idempotency_key, "1")
        return {"service": service, "cancelled": True}

    def sell_out(self, service: str) -> None:
        """From now on, ``service`` has nothing left to book."""
        self.redis.set(self.key(service, "sold-out"), "1")

    def restock(self, service: str) -> None:
        self.redis.delete(self.key(service, "sold-out"))

    def hold(self, service: str) -> None:
        """From now on, ``service`` makes reservations but holds its replies."""
        self.redis.set(self.key(service, "hold"), "1")

    def release(self, service: str) -> None:
        self.redis.delete(self.key(service, "hold"))

    def is_holding(self, service: str, idempotency_key: str) -> bool:
        """True once a call with this key has made its reservation and is held."""
        return bool(self.redis.sismember(self.key(service, "held"), idempotency_key))

    def receipt(self, service: str, run_id: str) -> Receipt:
        """Calls and reservations of ``service`` under the run's idempotency keys."""
        mine = f"{run_id}:*"
        calls = sum(int(n) for _, n in self.redis.hscan_iter(self.key(service, "calls"), match=mine))
        reservations = [json.loads(v) for _, v in self.redis.hscan_iter(self.key(service, "reservations"), match=mine)]
        confirmation = reservations[0].get("confirmation") if len(reservations) == 1 else None
        cancellations = sum(1 for _ in self.redis.hscan_iter(self.key(service, "cancellations"), match=mine))
        return Receipt(service, calls, len(reservations), confirmation, cancellations)


@lru_cache(maxsize=1)
def default() -> Providers:
    """The providers of this process's settings (a worker's environment)."""
    settings = Settings()
    return Providers(redis.Redis.from_url(settings.redis_url, decode_responses=True), settings.key_prefix)


def book(service: str, idempotency_key: str, details: dict[str, Any]) -> dict[str, Any]:
    """What a booking step calls: the provider of ``service``."""
    return default().book(service, idempotency_key, details)


def cancel(service: str, idempotency_key: str) -> dict[str, Any]:
    """What a cancellation (the saga's compensation) calls: the provider of ``service``."""
    return default().cancel(service, idempotency_key)


class SoldOut(Exception):
    """The provider has nothing left to book."""
