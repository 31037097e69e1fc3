"""The seed's trip, for crash tests: bookings against fake providers that
honour idempotency keys, with gates a test can hold a booking at.

Providers and gates live in Redis under ``<key_prefix>:provider`` and
``<key_prefix>:gate``, apart from the journal. A booking step calls its
provider first and then, if the run's args name its service in ``hold``,
waits at the gate until the test opens it: the crash point of the seed,
"flight and hotel done, car in flight".
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from celery_durable import Engine, Settings, WorkflowContext, workflow
from tests.support.apps import side_redis

SERVICES = ("flight", "hotel", "car")
settings = Settings()
_redis = side_redis(settings)


def provider_key(prefix: str, service: str, what: str) -> str:
    return f"{prefix}:provider:{service}:{what}"


def book(prefix: str, service: str, idempotency_key: str) -> dict[str, Any]:
    """A provider: counts every raw call, reserves once per idempotency key."""
    _redis.hincrby(provider_key(prefix, service, "calls"), idempotency_key, 1)
    reservation = {"service": service, "confirmation": f"{service[:3].upper()}-{uuid.uuid4().hex[:8]}"}
    _redis.hsetnx(provider_key(prefix, service, "reservations"), idempotency_key, json.dumps(reservation))
    return dict(json.loads(_redis.hget(provider_key(prefix, service, "reservations"), idempotency_key) or "{}"))


def gate(prefix: str, run_id: str, service: str) -> None:
    """Say we reached the gate, then wait until the test opens it."""
    _redis.sadd(f"{prefix}:gate:{run_id}:reached", service)
    while not _redis.sismember(f"{prefix}:gate:{run_id}:open", service):
        time.sleep(0.02)


@workflow(
    name="trip",
    description="Books a flight, a hotel and a car in parallel, reviews, confirms",
    phases=[{"title": "Book"}, {"title": "Review"}, {"title": "Confirm"}],
)
def trip(ctx: WorkflowContext) -> Any:
    prefix = settings.key_prefix
    hold = set(ctx.args.get("hold", []))
    ctx.phase("Book")

    def booking(service: str) -> Any:
        def produce() -> dict[str, Any]:
            receipt = book(prefix, service, ctx.idempotency_key(f"book-{service}"))
            if service in hold:
                gate(prefix, ctx.run_id, service)
            return receipt

        return ctx.step(f"book-{service}", produce)

    bookings = ctx.parallel([lambda service=service: booking(service) for service in SERVICES])
    ctx.phase("Review")
    review = ctx.step("review", lambda: {"approved": all(b is not None for b in bookings)})
    ctx.phase("Confirm")
    return ctx.step("confirm", lambda: {"confirmed": review["approved"], "bookings": bookings})


@workflow(name="trip-in-line", description="Books a hotel, thinks in plain code, then books a car", phases=[])
def trip_in_line(ctx: WorkflowContext) -> Any:
    """The seed's crash between "hotel booked" and "car booked", where the body
    itself is busy between the two (no step runs): held at a gate in its own code."""
    prefix = settings.key_prefix
    hotel = ctx.step("book-hotel", lambda: book(prefix, "hotel", ctx.idempotency_key("book-hotel")))
    gate(prefix, ctx.run_id, "between")  # workflow code, replayed as such: the test opens it before any replay
    car = ctx.step("book-car", lambda: book(prefix, "car", ctx.idempotency_key("book-car")))
    return {"hotel": hotel, "car": car}


engine = Engine(workflows=[trip, trip_in_line], settings=settings)
