"""A worker's home queue: where the wakes of the bodies it keeps are sent.

A main body kept parked at a call (``tasks/parked.py``) lives in one worker
process. Its call's task runs wherever Celery sends it, and on a fleet of
more than one process its answer is often journaled in another one, which
would then replay the whole run to go on — a cost that grows with the run,
so a long run of calls in a row on two workers costs quadratic time. The
call's answer fields therefore name the home queue of the process that sent
it, and an answer journaled elsewhere sends the main body's wake there:
the kept body goes on where it waits, for one message. Temporal's sticky
task queues do the same for a worker's cached workflows.

A home queue is an optimisation, never the truth. The home worker may have
died, be stopping, or have every thread busy with long steps; so a wake sent
home and not started within ``REDIRECT_SECONDS`` is sent again to the
coordinator queue, under a new id (``HomeWakes``, ``requeue.lua``), as
Temporal's sticky queues fall back to the normal one: any worker goes on
with the run, by a replay, in the same attempt. Until then the wake is
counted in flight as a coordinator message like any other, and the fallback
comes well inside liveness's own margin for a message that left an empty
queue (``_prelude.lua``), so the run is not taken over for it; only when the
process that sent the wake dies within that time too does liveness find it,
and take the run over. A wake left behind in a home queue is one more pass
if its node comes back under the same name (fenced, as any pass); a home
queue unused for an hour is deleted with what it held (``x-expires``: on
RabbitMQ, and on Redis since kombu 5.7).

Only a pool whose node is one process has a home: a prefork pool's node
hands a message to any of its children, not to the one keeping the body.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from celery import Celery, bootsteps
from celery.signals import worker_shutdown
from kombu import Exchange, Queue  # type: ignore[attr-defined]

from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.wake_route import Home

if TYPE_CHECKING:
    from celery_durable.config import Settings
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

REDIRECT_SECONDS = 2.0
"""A wake sent home and not started after this goes to the coordinator queue;
well below liveness's 5 s for a message that left an empty queue."""
EXPIRES_SECONDS = 3600.0
"""An unused home queue is deleted after this (RabbitMQ, and Redis since
kombu 5.7): far past any lease, so liveness has long taken over what
waited in it."""
MAX_NAME = 400


def home_queue(app: Celery, settings: Settings, name: str) -> Queue:
    """The home queue called ``name``, declared alike by its worker and by
    senders: RabbitMQ refuses a declaration whose arguments differ, and the
    worker's copy gets the app's ``task_queue_max_priority`` when it joins
    the app's queues. It is bound to the coordinator queue's exchange, so a
    node leaves no exchange of its own behind."""
    priority = app.amqp.queues.max_priority
    arguments = {"x-max-priority": priority} if priority is not None else None
    exchange = Exchange(settings.coordinator_queue, type="direct")  # type: ignore[no-untyped-call]
    return Queue(  # type: ignore[no-untyped-call]
        name, exchange, routing_key=name, expires=EXPIRES_SECONDS, queue_arguments=arguments
    )


def home_name(settings: Settings, hostname: str) -> str:
    return f"{settings.coordinator_queue}.{hostname}"


def is_home_name(settings: Settings, name: Any) -> bool:
    """Whether a message's ``home`` field names a home queue of this engine:
    the coordinator queue's name, a dot, and a Celery node name (``name@host``)."""
    prefix = f"{settings.coordinator_queue}."
    if not isinstance(name, str) or not len(prefix) < len(name) <= MAX_NAME or not name.startswith(prefix):
        return False
    node, at, host = name[len(prefix):].partition("@")
    return bool(node and at and host)


def home_of(engine: Engine, name: str | None) -> tuple[Home, Queue | None]:
    """Whose home an answer names (``wake_route.Home``), and its queue."""
    if name is None:
        return Home.NONE, None
    if engine.home is not None and name == engine.home.name:
        return Home.HERE, engine.home
    return Home.ELSEWHERE, home_queue(engine.celery, engine.settings, name)


def has_home(engine: Engine, *, prefork: bool, consumed: Collection[str]) -> bool:
    """Whether a worker process of ``engine`` gets a home queue: home queues
    on, bodies kept, one process per node (not a prefork pool's child), and
    the coordinator queue consumed (else it keeps no bodies). A Celery
    worker asks at its start (``install``), the in-process test fleet for
    each of its processes."""
    return (
        engine.settings.home_queues
        and engine.parked.enabled
        and not prefork
        and engine.settings.coordinator_queue in consumed
    )


def install(engine: Engine) -> None:
    """Give each worker of ``engine``'s app a home queue it consumes."""

    class HomeQueueStep(bootsteps.Step):  # type: ignore[misc]
        """Adds the worker's home queue before its consumer starts, and
        forgets it at the worker's warm shutdown (Celery's ``worker_shutdown``,
        sent whether or not the worker had fully started, when it skips the
        steps' ``stop``): its bodies are unwound then, and nothing the process
        sends afterwards may name a queue no one consumes. A cold shutdown
        ends the process."""

        def __init__(self, worker: Any, **kwargs: Any) -> None:
            super().__init__(worker, **kwargs)
            pool = getattr(worker, "pool_cls", None)
            queues = worker.app.amqp.queues
            prefork = "prefork" in str(getattr(pool, "__module__", pool))
            if not has_home(engine, prefork=prefork, consumed=queues.consume_from):
                return
            name = home_name(engine.settings, worker.hostname)
            engine.home = queues.select_add(home_queue(worker.app, engine.settings, name))

            def forget(sender: Any = None, **_: Any) -> None:
                if sender is worker:
                    engine.home = None
                    worker_shutdown.disconnect(forget)

            worker_shutdown.connect(forget, weak=False)

    engine.celery.steps["worker"].add(HomeQueueStep)


class HomeWakes:
    """The wakes this process sent home, each sent again to the coordinator
    queue should it not have started in time (module docstring).

    One thread, started at the first wake, sleeps until the next one is due;
    a check costs a script, off every wake's path."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._due: list[tuple[float, str, int, str, str]] = []
        self._thread: threading.Thread | None = None
        self._changed = threading.Condition()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._due = []
        self._thread = None
        self._changed = threading.Condition()

    def watch(self, run_id: str, epoch: int, workflow: str, task_id: str) -> None:
        with self._changed:
            heapq.heappush(self._due, (time.monotonic() + REDIRECT_SECONDS, run_id, epoch, workflow, task_id))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="celery-durable-home-wakes", daemon=True)
                self._thread.start()
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._changed.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, run_id, epoch, workflow, task_id = heapq.heappop(self._due)
            self._check(run_id, epoch, workflow, task_id)

    def _check(self, run_id: str, epoch: int, workflow: str, task_id: str) -> None:
        again = new_task_id()
        try:
            if self._engine.store.requeue(run_id, epoch, task_id, again).sent:
                logger.info("run %s: its wake was not started at home in time; sent to the coordinator queue", run_id)
                self._engine.send_coordinator(run_id, epoch, workflow, task_id=again)
        except Exception:
            # Counted in flight and never sent: liveness finds it, as any lost message.
            logger.warning("run %s: a wake sent home could not be sent again", run_id, exc_info=True)
