"""A trip booking that survives ``kill -9``: what ``celery-durable demo`` runs.

``providers`` are fake booking services that honour idempotency keys, as real
ones do; ``trip`` is the workflow (flight, hotel and car booked in parallel,
a review, a confirmation); ``script`` starts worker processes, kills them all
with SIGKILL while the car booking is in flight, starts new ones, and shows
the run finish by itself; ``view`` prints what happens. They live in the
package, not in ``examples/``, so that the demo runs wherever celery-durable
is installed.
"""
