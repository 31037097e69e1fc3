"""The seed's trip: book a flight, a hotel and a rental car in parallel,
review the bookings, then confirm. Every booking carries an idempotency key
derived from the run, so a booking step that runs again books nothing twice.

Run it:  python -m examples.trip
(It starts a private Redis unless CELERY_DURABLE_REDIS_URL is set, and a
worker process, runs one trip, and prints the result.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from celery_durable import Engine, WorkflowContext, workflow
from examples import providers

SERVICES = ("flight", "hotel", "car")


@workflow(
    name="trip",
    description="Books a flight, a hotel and a rental car, reviews them, confirms the trip",
    phases=[
        {"title": "Book", "detail": "Flight, hotel and car in parallel"},
        {"title": "Review"},
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
    ctx.log(f"Booking a trip to {destination}")

    def booking(service: str) -> Any:
        key = ctx.idempotency_key(f"book-{service}")
        return ctx.step(f"book-{service}", lambda: providers.book(service, key, {"destination": destination}))

    bookings = ctx.parallel([lambda service=service: booking(service) for service in SERVICES])
    ctx.phase("Review")
    missing = [service for service, booked in zip(SERVICES, bookings, strict=True) if booked is None]
    review = ctx.step("review", lambda: {"approved": not missing, "missing": missing})
    ctx.phase("Confirm")
    if not review["approved"]:
        return {"status": "not_confirmed", "destination": destination, "missing": missing}
    return ctx.step(
        "confirm-trip",
        lambda: {"status": "confirmed", "destination": destination, "bookings": bookings},
    )


engine = Engine(workflows=[trip])


def main() -> int:
    """Run one trip end to end on a private Redis and a real worker process."""
    from celery_durable.redis_server import RedisServer

    server = None
    if "CELERY_DURABLE_REDIS_URL" not in os.environ:
        server = RedisServer().start()
        os.environ["CELERY_DURABLE_REDIS_URL"] = server.url
    env = dict(os.environ)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery_durable", "worker", "--app", "examples.trip:engine", "-c", "4",
         "-P", "threads", "--loglevel", "WARNING", "--quiet"],
        env=env,
    )
    try:
        local = Engine(workflows=[trip])  # reads the Redis URL just set
        envelope = local.client().run_workflow("trip", args={"destination": "Seattle"}, timeout=60)
        print(f"run {envelope.run_id}: {envelope.status}")
        print(envelope.result)
        for service in SERVICES:
            calls, reservations = providers.receipts(service)
            print(f"  {service:<7} raw calls: {calls}  reservations: {reservations}")
        return 0 if envelope.status == "completed" else 1
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    sys.exit(main())
