"""A plain Celery app, as a team already has one: nothing of celery-durable.

Its worker process runs only this module (``celery -A tests.support.apps.gpu worker
-Q <queue>``), configured from the environment the tests give it. The tests
read what it did from Redis: ``gpu:runs:<task id>`` counts how many times a
task id ran. ``make_app`` builds the same app in the test process, on the
test's Redis, for an engine to mount.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery


def make_app(broker: str, queue: str, *, accept_pickle: bool = False, results: str | None = None) -> Celery:
    """The app on ``broker``; its results and counts on the Redis ``results`` (default: the broker)."""
    store = redis.Redis.from_url(results or broker, decode_responses=True)
    app = Celery("gpu", broker=broker, backend=results or broker, set_as_current=False)
    app.conf.update(
        task_routes={"gpu.*": {"queue": queue}},
        # The team's own settings, none of them celery-durable's: results
        # kept, early acks for its other tasks, pickle accepted if asked (a
        # worker process refuses to start as root with it).
        task_serializer="json",
        accept_content=["json", "pickle"] if accept_pickle else ["json"],
        task_acks_late=False,
        worker_prefetch_multiplier=4,
        broker_connection_retry_on_startup=True,
        # A killed worker's message comes back within seconds, not hours.
        broker_transport_options={
            "visibility_timeout": 4,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
    )

    @app.task(name="gpu.render", bind=True, acks_late=True, reject_on_worker_lost=True, shared=False)
    def render(self: Any, item: str, seconds: float = 0.0) -> dict[str, Any]:
        runs = store.incr(f"gpu:runs:{self.request.id}")
        time.sleep(seconds)
        return {"item": item, "rendered": f"{item}.png", "runs": runs}

    @app.task(name="gpu.broken", shared=False)
    def broken(why: str) -> None:
        raise KeyError(why)

    @app.task(name="gpu.not_json", shared=False)
    def not_json() -> Any:
        return float("nan")

    @app.task(name="gpu.add", shared=False)
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="gpu.add_quietly", shared=False, ignore_result=True)
    def add_quietly(a: int, b: int) -> int:
        return a + b

    @app.task(name="gpu.add_limited", shared=False, soft_time_limit=60, time_limit=90)
    def add_limited(a: int, b: int) -> int:
        return a + b

    @app.task(name="gpu.pair", shared=False)
    def pair(a: int) -> Any:
        return (a, {a: "keyed by an int"})  # what JSON makes a list and a string key

    return app


app = make_app(
    os.environ.get("CELERY_DURABLE_REDIS_URL", "redis://localhost:6379/0"), os.environ.get("GPU_QUEUE", "gpu")
)
