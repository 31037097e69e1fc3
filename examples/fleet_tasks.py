"""A team's existing Celery app: tasks it already runs, on a GPU-like queue.

Nothing here knows celery-durable. Its worker runs only this module::

    celery -A examples.fleet_tasks worker -Q gpu -c 2

and ``examples/render.py`` mounts an engine on this same app and calls
``thumbnail`` from a workflow. The app has a result backend, as a team's
usually does: a call that fails on this worker reports its exception through
it (the worker has no celery-durable task to tell it to).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from celery import Celery

BROKER = os.environ.get("CELERY_DURABLE_BROKER_URL") or os.environ.get(
    "CELERY_DURABLE_REDIS_URL", "redis://localhost:6379/0"
)

app = Celery("fleet", broker=BROKER, backend=BROKER)
app.conf.update(
    task_routes={"fleet.thumbnail": {"queue": "gpu"}, "fleet.inspect": {"queue": "gpu"}},
    # The team's own choices for its tasks, which celery-durable leaves alone.
    task_acks_late=True,
    result_expires=3600,
)


@app.task(name="fleet.thumbnail", bind=True)
def thumbnail(self: Any, url: str, size: int = 128) -> dict[str, Any]:
    """Stands in for a GPU job; idempotent on its task id, which a call keeps stable."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an image URL: {url}")
    time.sleep(float(os.environ.get("FLEET_THUMBNAIL_SECONDS", "0")))
    digest = hashlib.sha256(f"{url}:{size}".encode()).hexdigest()[:10]
    return {"url": url, "thumbnail": f"thumb-{digest}-{size}.png", "task_id": self.request.id}


@app.task(name="fleet.inspect")
def inspect(url: str) -> dict[str, Any]:
    return {"url": url, "bytes": len(url) * 1024}
