"""The Celery app the engine runs on when it builds its own, its queues, and
the names of its tasks (``mount`` adds the tasks themselves).

Task names say what a task is, and arguments are keyword arguments naming
the run, so a person can follow a run in Flower. Every task module imports
these names; this module imports none of them, so they form no import circle.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlsplit

from celery import Celery
from kombu import Exchange, Queue  # type: ignore[attr-defined]

from celery_durable.config import Settings
from celery_durable.tasks.transport import TRANSPORT

DURABLE_TASK_PREFIX = "celery_durable."
COORDINATOR_TASK = "celery_durable.coordinator"
BRANCH_TASK = "celery_durable.branch"
AGENT_TASK = "celery_durable.agent"
CALL_RESULT_TASK = "celery_durable.call_result"
CALL_FAILED_TASK = "celery_durable.call_failed"
JSON = "application/json"
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")


def build_celery_app(settings: Settings, main: str = "celery_durable") -> Celery:
    """The engine's own app: Celery's defaults (JSON, results as configured),
    plus what a worker of durable tasks needs of its consumer."""
    app = Celery(main, broker=settings.effective_broker_url, set_as_current=False)
    app.conf.update(
        # A worker takes a message only when it has a slot for it: a message
        # it holds without running is one a crash can lose (see liveness).
        worker_prefetch_multiplier=1,
        # Redelivery of an unacknowledged message after this long; keep it
        # above the longest step. Liveness, not this, decides crash recovery.
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_seconds},
        broker_connection_retry_on_startup=True,
        # A task running when the broker drops goes on and journals what it
        # did (its writes are fenced and idempotent); its message, never
        # acknowledged, comes back after the visibility timeout and finds that.
        # Said here rather than left to Celery's default, which Celery 6
        # turns the other way (Celery 5 warns of that at each reconnect).
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_hijack_root_logger=False,
        # No task-sent events (Celery's default): each is a second publish,
        # on the path of every wake and call, and Flower follows a task from
        # its task-received event on. An app that wants the "sent" state sets
        # task_send_sent_event itself.
    )
    scheme = urlsplit(settings.effective_broker_url).scheme
    if scheme in ("redis", "rediss"):
        # Kombu's Redis transport, except that a frame that is not a message
        # is dropped instead of stopping the worker (tasks/transport.py).
        app.conf.broker_transport = TRANSPORT
    elif scheme in AMQP_SCHEMES:
        # After a reconnect Celery 5.7 lowers the prefetch count and raises it
        # again from the callback of each task that ends; under the threads
        # pool that runs in a pool thread, whose basic.qos then reads the
        # socket the consumer's own loop reads, and the worker never takes a
        # message again (tests/test_broker_restart.py). Without the reduction
        # a reconnected worker takes its full count at once; what it holds
        # beyond its free slots waits in it, as its prefetch always may.
        app.conf.worker_enable_prefetch_count_reduction = False
    return app


def durable_queues(settings: Settings) -> list[Queue]:
    """Each queue its own direct exchange and routing key: on one shared
    exchange with the default key, every message would reach every queue."""
    return [_queue(name) for name in (settings.coordinator_queue, settings.steps_queue, settings.agents_queue)]


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def destination(app: Celery, queue: str | Queue) -> dict[str, Any]:
    """A message's ``send_task`` options for where it goes, said whole: the
    queue, and the exchange and routing key that reach it (a queue named is
    looked up as Celery would, and left to Celery's own error where it knows
    none). Celery merges a matching route of the app's into the options a
    message leaves unset (``Router.route``): a route for every task that names
    an exchange carried a message that named only its queue off to that
    exchange, a durable one off the durable queues for good."""
    try:
        found = app.amqp.queues[queue] if isinstance(queue, str) else queue
    except KeyError:
        return {"queue": queue}
    return {"queue": queue, "exchange": found.exchange.name, "routing_key": found.routing_key}


def new_task_id() -> str:
    """A task id chosen before the message is sent, so the run can count the
    message as in flight in the same script that decides to send it."""
    return uuid.uuid4().hex
