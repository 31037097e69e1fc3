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

A home queue is an optimisation, never the truth. A wake sent to the home
of a process that has since died is counted in flight as a coordinator
message, like any other: once the coordinator queue is found empty, a
message still not started a few seconds later is judged lost, and the run
is taken over (liveness in ``_prelude.lua``), as when a worker dies holding
a message. On RabbitMQ the queue of a node gone for an hour is deleted with
what it held (``x-expires``); on Redis, a restarted node of the same name
consumes what was left for it, which the fence then refuses as stale.

Only a pool whose node is one process has a home: a prefork pool's node
hands a message to any of its children, not to the one keeping the body.

Off unless ``settings.home_queues``: liveness judges a wake sent home by
the coordinator queue, so a home worker that takes nothing for a few
seconds (stopped, or every thread busy) has the run taken over, where a
wake in the coordinator queue would have waited for any worker. The fix is
Temporal's: a wake not started at home within a few seconds is sent again
to the coordinator queue, as the same message, rather than judged lost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import Celery, bootsteps
from celery.signals import worker_shutdown
from kombu import Exchange, Queue  # type: ignore[attr-defined]

if TYPE_CHECKING:
    from celery_durable.config import Settings
    from celery_durable.engine import Engine

EXPIRES_SECONDS = 3600.0
"""An unused home queue is deleted after this on RabbitMQ: far past any
lease, so liveness has long taken over what waited in it."""
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
    """Whether a message's ``home`` field names a home queue of this engine."""
    prefix = f"{settings.coordinator_queue}."
    return isinstance(name, str) and len(prefix) < len(name) <= MAX_NAME and name.startswith(prefix)


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
            if (
                not engine.settings.home_queues
                or not engine.parked.enabled
                or "prefork" in str(getattr(pool, "__module__", pool))
                or engine.settings.coordinator_queue not in queues.consume_from  # it keeps no bodies
            ):
                return
            name = home_name(engine.settings, worker.hostname)
            engine.home = queues.select_add(home_queue(worker.app, engine.settings, name))

            def forget(sender: Any = None, **_: Any) -> None:
                if sender is worker:
                    engine.home = None
                    worker_shutdown.disconnect(forget)

            worker_shutdown.connect(forget, weak=False)

    engine.celery.steps["worker"].add(HomeQueueStep)
