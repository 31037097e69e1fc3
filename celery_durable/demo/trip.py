"""A trip: book a flight, a hotel and a rental car in parallel, review
the bookings, then confirm.

Every booking passes the provider an
idempotency key derived from the run (``ctx.idempotency_key``). A booking
step that was in flight when its worker died runs again in the next attempt
(steps run at least once) — and the provider, seeing the same key, returns
the reservation it already made instead of booking a second car.

A trip never stays half-booked: it is a saga
(``ctx.saga``): each booking made registers its cancellation, and when one
fails (no car left) the others are cancelled at their providers, each
cancellation a journaled step, before the run says the trip was not booked.

Run it with a worker:  celery-durable run trip --app examples.trip:engine --args '{"destination": "Seattle"}'
Or watch it survive ``kill -9``:  celery-durable demo
"""

from __future__ import annotations

from functools import partial
from typing import Any

from celery_durable import Engine, WorkflowContext, workflow
from celery_durable.demo import providers

SERVICES = ("flight", "hotel", "car")


@workflow(
    name="trip",
    description="Books a flight, a hotel and a rental car, reviews the bookings, confirms the trip",
    phases=[
        {"title": "Book", "detail": "Flight, hotel and car in parallel"},
        {"title": "Review", "detail": "Every booking confirmed by its provider"},
        {"title": "Confirm"},
    ],
    args_schema={
        "type": "object",
        "properties": {"destination": {"type": "string", "minLength": 1}},
        "required": ["destination"],
    },
)
def trip(ctx: WorkflowContext) -> dict[str, Any]:
    destination = ctx.args["destination"]
    ctx.phase("Book")
    ctx.log(f"Booking a flight, a hotel and a rental car for {destination}")

    def booking(service: str) -> Any:
        key = ctx.idempotency_key(f"book-{service}")

        def book() -> dict[str, Any]:
            return providers.book(service, key, {"destination": destination})

        reservation = ctx.step(f"book-{service}", book)
        ctx.log(f"{service} booked: {reservation['confirmation']}")
        return reservation

    try:
        with ctx.saga() as saga:
            bookings = ctx.parallel([partial(booking, service) for service in SERVICES])
            # What was booked is cancelled again should the trip not go ahead:
            # at its provider, under the booking's own idempotency key.
            for service, reservation in zip(SERVICES, bookings, strict=True):
                if reservation is not None:
                    key = ctx.idempotency_key(f"book-{service}")
                    saga.compensate(f"cancel-{service}", partial(providers.cancel, service, key))

            ctx.phase("Review")
            review = ctx.step("review", lambda: review_bookings(bookings))
            if not review["approved"]:
                raise TripNotBooked(review["issues"])
            ctx.log("Every booking confirmed")

            ctx.phase("Confirm")
            confirmed: dict[str, Any] = ctx.step(
                "confirm-trip",
                lambda: {"status": "confirmed", "destination": destination, "bookings": bookings},
            )
            return confirmed
    except TripNotBooked as exc:
        ctx.log(f"Not booked: {', '.join(exc.issues)}; what was booked is cancelled")
        return {"status": "not_booked", "destination": destination, "issues": exc.issues}


class TripNotBooked(Exception):
    """A booking failed: the saga cancels the others before this goes on."""

    def __init__(self, issues: list[str]) -> None:
        super().__init__("; ".join(issues))
        self.issues = issues


def review_bookings(bookings: list[Any]) -> dict[str, Any]:
    """Approve only bookings that came back with a confirmation number: never invent one."""
    issues = [
        f"{service} has no confirmation"
        for service, booking in zip(SERVICES, bookings, strict=True)
        if not (isinstance(booking, dict) and booking.get("confirmation"))
    ]
    return {"approved": not issues, "issues": issues}


engine = Engine(workflows=[trip])
