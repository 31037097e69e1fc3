"""A trip: a flight, a hotel and a rental car booked in parallel
against fake providers that honour idempotency keys, a review, a confirmation.

The workflow's code is in ``celery_durable/demo/trip.py`` — read it there. It
ships inside the package so that ``celery-durable demo`` runs wherever
celery-durable is installed; this module makes it one of the examples:

    celery-durable run trip --app examples.trip:engine --args '{"destination": "Seattle"}' --follow

(With no Redis configured and none on localhost:6379, ``run`` starts a
private Redis and a worker for the run; see the README.)
"""

from celery_durable.demo.trip import engine, trip

__all__ = ["engine", "trip"]
