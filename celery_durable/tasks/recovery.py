"""The recovery sweep: every worker looks for runs whose attempt died.

An attempt's liveness is its lease in the run hash, kept fresh by heartbeats
of whatever is working for it (a coordinator pass, a branch task). When a
lease has run out, the sweep takes the run over with a new attempt (epoch +
1) and sends it a coordinator message: completed steps replay from the
journal, and whatever the dead attempt left in flight is fenced out. With
``auto_recover`` off it halts the run instead (``halted``/``interrupted``,
resumable).

It runs in a thread of every worker, started by a worker bootstep of the
engine's Celery app, so it works however the worker was started (the CLI,
plain ``celery -A``, or ``start_worker`` in tests). Many sweepers at once are
safe: the take-over is a compare-and-set in Lua, and one of them wins.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import bootsteps

from celery_durable.broker import now_ms
from celery_durable.errors import StorageCorruptError, StorageUnavailableError
from celery_durable.workflows import jsonvalue

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

BATCH = 100
ACTIVE = ("pending", "running")


class RecoverySweep:
    """Finds runs with an expired lease and recovers (or halts) them."""

    def __init__(self, engine: Engine, worker_running: Callable[[], bool] = lambda: True) -> None:
        self.engine = engine
        self._worker_running = worker_running
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._random = random.Random()  # never the global one: user code may seed or rely on it

    @property
    def interval(self) -> float:
        return min(self.engine.settings.lease_seconds / 4, 2.0)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="celery-durable-recovery", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _loop(self) -> None:
        # Jitter spreads the sweeps of a fleet that started together.
        while not self._stop.wait(self.interval * self._random.uniform(0.5, 1.0)):
            if not self._worker_running():
                return  # a worker that stopped without stopping its steps
            try:
                self.sweep_once()
            except (StorageUnavailableError, StorageCorruptError) as exc:
                logger.warning("recovery sweep skipped: %s", exc)
            except Exception:
                logger.exception("recovery sweep failed")

    def sweep_once(self) -> int:
        """One look at every run that is due; returns how many were taken over or halted."""
        store = self.engine.store
        settings = self.engine.settings
        acted = 0
        now = now_ms()
        for run_id in store.due_runs(now, BATCH):
            try:
                acted += self._look_at(run_id, now)
            except StorageCorruptError as exc:
                # One damaged run must not stop the recovery of every other:
                # look at it again a lease later, once someone may have repaired it.
                logger.error("recovery of run %s skipped, its record is corrupt: %s", run_id, exc)
                store.schedule_check(run_id, now + int(settings.lease_seconds * 1000))
        return acted

    def _look_at(self, run_id: str, now: int) -> int:
        store = self.engine.store
        record = store.load_run(run_id)
        if record is None or record.status not in ACTIVE:
            store.unschedule(run_id)
            return 0
        if record.lease_until > now:
            store.schedule_check(run_id, record.lease_until)
            return 0
        if not self.engine.settings.auto_recover:
            return int(store.halt(record))
        epoch = store.resume(
            record,
            limits_json=jsonvalue.dumps(record.limits),
            message="Run recovered after its attempt died",
            code_hash="",
            require_expired=True,
        )
        if epoch is None:
            return 0
        logger.warning("run %s: attempt died; recovering as epoch %s", run_id, epoch)
        self.engine.send_coordinator(run_id, epoch, record.workflow)
        return 1


def install(engine: Engine) -> None:
    """Run a recovery sweep in every worker of ``engine``'s Celery app."""

    class RecoveryStep(bootsteps.StartStopStep):  # type: ignore[misc]
        """Starts the sweep with the worker and stops it at shutdown."""

        def __init__(self, worker: Any, **kwargs: Any) -> None:
            super().__init__(worker, **kwargs)
            # Celery skips the steps' stop() when a worker is stopped before
            # its blueprint counts as fully started, as test workers are.
            self.sweep = RecoverySweep(engine, lambda: worker.blueprint.state == bootsteps.RUN)

        def start(self, worker: Any) -> None:
            self.sweep.start()

        def stop(self, worker: Any) -> None:
            self.sweep.stop()

        def shutdown(self, worker: Any) -> None:
            self.sweep.stop()

    engine.celery.steps["worker"].add(RecoveryStep)
