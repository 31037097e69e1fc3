"""The team's GPU app with an engine mounted on it: a GPU pool that has
celery-durable installed, started with ``-Q <gpu queue>`` only. It runs the
called tasks, and with them their links (``call_result`` is registered
here), but it does not consume the coordinator queue: it must never run a
run's workflow code, and sends each answer on instead.
"""

from __future__ import annotations

import os

from celery_durable import Engine, Settings
from tests.support.apps.gpu import make_app

settings = Settings()
app = make_app(settings.redis_url, os.environ.get("GPU_QUEUE", "gpu"))
engine = Engine([], settings, celery_app=app)
