"""Riding out a store that does not answer, without giving the work away.

A task that meets ``StorageUnavailableError`` waits and runs again in place,
holding its message: its heartbeat goes on trying meanwhile, and once Redis
answers its lease is renewed before anyone can take the run over (the
sweep gives the fleet a lease of grace after it saw Redis fail). Sending the
task back to the broker instead (Celery's retry) would leave its run with a
message nobody holds, and a backoff longer than that grace would look like
death. Only a worker that is shutting down hands the task back to Celery,
so a warm shutdown is never held up by an outage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from celery.worker import state as worker_state

from celery_durable.errors import DurableError, StorageUnavailableError

logger = logging.getLogger(__name__)

T = TypeVar("T")
FIRST_DELAY = 0.25
MAX_DELAY = 2.0


class PassDied(RuntimeError):
    """What a durable task raises to Celery when something escaped the engine
    (logged already, with its traceback, by ``retry_storage``).

    Always an ``Exception``: a ``BaseException`` that is not one (a body's own
    subclass) reaching Celery's threads or solo pool is handed to the task's
    callback as an ``ExceptionInfo`` it cannot unpack (Celery 5's
    ``apply_target``), and that pool slot never serves again; the Celery
    task's body (``mount.py``) turns one into this. Declared in the durable
    tasks' ``throws``: Celery logs it at INFO, without a second traceback, and
    still shows the task failed."""


def as_task_failure(run: Callable[[], None]) -> None:
    """``run()``, the body of a durable Celery task: what escapes it that is not
    an ``Exception`` (but for the worker stopping) leaves as ``PassDied``."""
    try:
        run()
    except (Exception, SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        raise PassDied(f"{type(exc).__name__}: {exc}") from exc


def retry_storage(what: str, work: Callable[[], T]) -> T:
    """``work()``, again and again while the store is unavailable.

    Anything else that escapes the engine's own handling is a bug, or a
    worker killed by what it ran: it is logged here, once, at ERROR with its
    traceback, by this package's logger, so that it is seen whether or not
    Celery's task logging is configured (SPEC §8: one ERROR line a failed
    pass); the task then fails as ``PassDied``."""
    delay = FIRST_DELAY
    while True:
        try:
            return work()
        except StorageUnavailableError as exc:
            if shutting_down():
                raise  # the task's autoretry hands it back to the broker
            logger.warning("%s: storage unavailable, trying again in %.2fs: %s", what, delay, exc)
        except (DurableError, SystemExit, KeyboardInterrupt):
            raise  # the engine's own verdicts (each caller handles and logs its own), or the worker stopping
        except BaseException as exc:
            logger.exception("%s died of an unexpected error", what)
            if not isinstance(exc, Exception):
                raise  # as a process dies: the Celery task's body makes it a PassDied (mount.py)
            raise PassDied(f"{what} died of an unexpected error: {type(exc).__name__}: {exc}") from exc
        time.sleep(delay)  # a backoff, not a synchronisation: nothing to wait on but time
        delay = min(delay * 2, MAX_DELAY)


def shutting_down() -> bool:
    """The worker was asked to stop (as ``celery.worker.state.maybe_shutdown`` reads it)."""
    return any(flag not in (None, False) for flag in (worker_state.should_stop, worker_state.should_terminate))
