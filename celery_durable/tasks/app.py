"""The Celery app the engine runs on, its own or the user's, and its tasks.

An engine either builds its own app (``build_celery_app``) or is mounted on
one the user already has (``Engine(..., celery_app=app)``). Either way
``mount`` adds the durable tasks, their queues and their per-task options —
JSON only, acknowledged late, rejected and redelivered when their worker is
lost — and changes nothing that affects the app's other tasks: no global
serializer, result backend, ``ignore_result``, ack mode or route.

Task names say what a task is, and arguments are keyword arguments naming
the run, so a person can follow a run in Flower.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from celery import Celery, Task
from celery.worker.request import Request
from kombu import Exchange, Queue  # type: ignore[attr-defined]

from celery_durable import telemetry
from celery_durable.config import Settings
from celery_durable.errors import StorageUnavailableError
from celery_durable.tasks.transport import TRANSPORT

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

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


def _default_queue(app: Celery) -> Queue:
    """The queue Celery consumes by default when ``task_queues`` is unset, as Celery builds it."""
    conf = app.conf
    name = conf.task_default_queue
    exchange = Exchange(conf.task_default_exchange or name, type=conf.task_default_exchange_type)
    return Queue(name, exchange, routing_key=conf.task_default_routing_key or name)


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def mount(app: Celery, engine: Engine) -> None:
    """Add the durable tasks and queues to ``app`` (see the module docstring).

    The queues join ``task_queues``, beside the app's own: a worker started
    without ``-Q`` consumes them all, as before plus ours. An app that had no
    ``task_queues`` consumed its default queue: that one is kept.
    """
    existing = list(app.conf.task_queues or [_default_queue(app)])
    names = {queue.name for queue in existing}
    app.conf.task_queues = existing + [q for q in durable_queues(engine.settings) if q.name not in names]
    if "pickle" in (app.conf.accept_content or ()):
        logger.warning(
            "the Celery app accepts pickle: its workers unpickle what a message says before any task sees it. "
            "celery-durable's own tasks refuse every message that is not JSON, but yours are exposed"
        )
    _register(app, engine)


class JsonOnlyRequest(Request):  # type: ignore[misc]
    """A durable task's request refuses a message that is not JSON before
    the pool decodes its body, whatever ``accept_content`` the app allows.

    ``revoked()`` is where: Celery asks it before handing the request to the
    pool (the request class Celery derives per task overrides
    ``execute_using_pool`` itself), and a revoked request is dropped.
    """

    _already_revoked: bool

    def revoked(self) -> bool:
        if self.content_type != JSON and not self._already_revoked:
            logger.error("rejected %s message %s: content type %r, not JSON", self.name, self.id, self.content_type)
            self._already_revoked = True
            self.reject(requeue=False)
        return self._already_revoked or bool(super().revoked())


DURABLE_OPTIONS: dict[str, Any] = {
    "ignore_result": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "serializer": "json",
    "shared": False,
    "bind": True,
    "Request": JsonOnlyRequest,
    # Only a worker that is shutting down hands a task back to the broker
    # (tasks/retrying.py); a running one retries in place.
    "autoretry_for": (StorageUnavailableError,),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": None,
}
"""Every durable task's options. ``shared=False``: Celery's default registers a
decorated task on *every* app in the process when it finalizes, so a second
engine's tasks (bound to its own store and workflows) would leak into the
first engine's app and run its messages against the wrong key prefix."""


def _register(app: Celery, engine: Engine) -> None:
    from celery_durable.tasks.calls import CALLED_HEADER, HOME_HEADER, CallAnswerTask
    from celery_durable.tasks.entry import run_durable_task
    from celery_durable.tasks.redelivery import recovered_on_redelivery

    def durable_task(name: str) -> None:
        @app.task(name=name, **DURABLE_OPTIONS)
        def body(task: Task, *args: Any, **kwargs: Any) -> None:
            if _positional(name.rpartition(".")[2], args):
                return
            if _redelivered(task) and recovered_on_redelivery(engine, _task_id(task), kwargs):
                return
            telemetry.received(name, task.request)  # its time in the queue; tracing looked at again
            run_durable_task(engine, name, _task_id(task), kwargs)

    for name in (COORDINATOR_TASK, BRANCH_TASK, AGENT_TASK):
        durable_task(name)

    @app.task(name=CALL_RESULT_TASK, base=CallAnswerTask, engine=engine, **DURABLE_OPTIONS)
    def call_result(this: Task, *args: Any, **fields: Any) -> None:
        request = this.request
        home, called = getattr(request, HOME_HEADER, None), getattr(request, CALLED_HEADER, None)
        run_durable_task(engine, CALL_RESULT_TASK, _task_id(this), fields, args, home=home, called=called)

    # Not bound: Celery calls an errback in place, with the exception, only
    # when its task is not bound (``_call_task_errbacks``).
    @app.task(name=CALL_FAILED_TASK, **{**DURABLE_OPTIONS, "bind": False})
    def call_error(*args: Any, **fields: Any) -> None:
        home = getattr(call_error.request, HOME_HEADER, None)
        run_durable_task(engine, CALL_FAILED_TASK, str(call_error.request.id or ""), fields, args, home=home)


def _redelivered(task: Task) -> bool:
    """The broker delivered this message before (AMQP's flag; kombu's Redis
    transport sets it on a message it restores)."""
    return bool((task.request.delivery_info or {}).get("redelivered"))


def _task_id(task: Task) -> str:
    return str(task.request.id or "")


def _positional(kind: str, args: tuple[Any, ...]) -> bool:
    """True (and logged) for a message with positional arguments: not one of ours."""
    if args:
        logger.error("rejected %s message: positional arguments %.80r", kind, args)
    return bool(args)


def new_task_id() -> str:
    """A task id chosen before the message is sent, so the run can count the
    message as in flight in the same script that decides to send it."""
    return uuid.uuid4().hex
