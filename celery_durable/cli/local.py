"""The embedded Redis for ``run`` and ``worker``.

``run`` with no Redis configured and none on localhost:6379 starts a private
one (``celery_durable.local.embedded``) and a worker process for the command's
``--app``, so an example runs on a fresh machine; both stop when the command
ends, and the run's journal stays in ``./.celery-durable/redis`` — a run left
unfinished there is recovered the next time one starts. ``worker`` never
starts a private Redis: a worker is one member of a fleet, and a Redis on a
random port that no client can find would give it nothing to do; it says so
in one line instead of retrying its connection forever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from celery_durable.cli.common import EXIT_USAGE, err, fail
from celery_durable.local.embedded import EmbeddedRedisError, exit_on_sigterm, needs_embedded, redis_for_cli
from celery_durable.local.fleet import LocalWorker

LOG_DIR = Path(".celery-durable") / "logs"


@contextlib.contextmanager
def standalone(app_path: str) -> Iterator[bool]:
    """For ``run``: with nothing configured, a private Redis and a worker for
    ``app_path``; whether it made them (the run then goes on only when a worker runs again)."""
    if not needs_embedded():
        yield False
        return
    try:
        with redis_for_cli() as choice:
            worker = LocalWorker(app_path, name="run", cwd=Path.cwd(), log_path=LOG_DIR / "run-worker.log").start()
            err.print(
                f"• no Redis configured and none on localhost:6379: started a private redis-server "
                f"(append-only file in {choice.data_dir}) and a worker process for {app_path}; both stop "
                f"when this command ends (worker log: {LOG_DIR}/run-worker.log)",
                style="dim", markup=False,
            )
            try:
                with exit_on_sigterm():
                    yield True
            finally:
                worker.stop()
    except EmbeddedRedisError as exc:
        raise fail(str(exc)) from None


def require_reachable_redis() -> None:
    """For ``worker``: one clear line instead of Celery's endless reconnects."""
    if needs_embedded():
        raise fail(
            "no CELERY_DURABLE_REDIS_URL and nothing on localhost:6379: start Redis or set the variable "
            "(a worker never starts a private Redis; `celery-durable run` and `celery-durable demo` do)",
            exit_code=EXIT_USAGE,
        )
