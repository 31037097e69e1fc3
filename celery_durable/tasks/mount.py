"""Mounting the durable tasks on a Celery app, the engine's own or the user's.

An engine either builds its own app (``app.build_celery_app``) or is mounted
on one the user already has (``Engine(..., celery_app=app)``). Either way
``mount`` adds the durable tasks, their queues and their per-task options —
JSON only, acknowledged late, rejected and redelivered when their worker is
lost — and changes nothing that affects the app's other tasks: no global
serializer, result backend, ``ignore_result``, ack mode or route. Apart from
``app`` because the task bodies it registers import the task names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import Celery, Task
from celery.exceptions import InvalidTaskError
from celery.worker.request import Request
from celery.worker.strategy import default as default_strategy
from kombu import Exchange, Queue  # type: ignore[attr-defined]
from kombu.exceptions import ContentDisallowed, DecodeError

from celery_durable import telemetry
from celery_durable.errors import StorageUnavailableError
from celery_durable.tasks.app import (
    AGENT_TASK,
    BRANCH_TASK,
    CALL_FAILED_TASK,
    CALL_RESULT_TASK,
    COORDINATOR_TASK,
    JSON,
    durable_queues,
)
from celery_durable.tasks.calls import CALLED_HEADER, HOME_HEADER, CallAnswerTask
from celery_durable.tasks.entry import run_durable_task
from celery_durable.tasks.redelivery import recovered_on_redelivery
from celery_durable.tasks.retrying import PassDied, as_task_failure
from celery_durable.workflows.jsonvalue import short_repr

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)


def _default_queue(app: Celery) -> Queue:
    """The queue Celery consumes by default when ``task_queues`` is unset, as
    Celery builds it (``AMQP.Queues``): a quorum queue when
    ``task_default_queue_type`` says so, else RabbitMQ refuses its declare as
    a classic one and the app's own tasks can no longer be sent."""
    conf = app.conf
    name = conf.task_default_queue
    exchange = Exchange(conf.task_default_exchange or name, type=conf.task_default_exchange_type)
    arguments = {"x-queue-type": "quorum"} if conf.task_default_queue_type == "quorum" else None
    return Queue(name, exchange, routing_key=conf.task_default_routing_key or name, queue_arguments=arguments)


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


def json_only_strategy(task: Task, app: Celery, consumer: Any, **options: Any) -> Callable[..., None]:
    """Celery's strategy for a durable task's messages, refusing first what is
    not one: a content type other than JSON, before anything decodes the
    body (Celery's own strategy decodes it in the consumer, so an app that
    accepts pickle would unpickle it there, before ``JsonOnlyRequest`` could
    refuse it), and a JSON body that is not ``[args, kwargs, options]``,
    or a message Celery cannot otherwise make a request of. Such a message
    is logged and rejected; left to Celery's own strategy, its error went
    past the consumer, which never acknowledged the message: each one held
    a prefetch slot for good, and a handful stopped the worker taking any."""
    handle = default_strategy(task, app, consumer, **options)
    errors = consumer.connection_errors

    def refuse(message: Any, reject: Any, problem: str) -> None:
        logger.error("rejected %s message %s: %s", task.name, (message.headers or {}).get("id"), problem)
        if not message.acknowledged:
            reject(logger, errors, False)

    def checked(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **more: Any) -> None:
        if message.content_type != JSON:
            refuse(message, reject, f"content type {message.content_type!r}, not JSON")
            return
        problem = _body_problem(message.payload if body is None else body)  # a DecodeError is Celery's to log
        if problem is not None:
            refuse(message, reject, problem)
            return
        try:
            handle(message, body, ack, reject, callbacks, **more)
        except (InvalidTaskError, ContentDisallowed, DecodeError):
            raise  # Celery's consumer refuses these itself, naming them
        except Exception as exc:
            refuse(message, reject, f"not a task message Celery can read: {type(exc).__name__}: {exc!s:.200}")

    return checked


def _body_problem(body: Any) -> str | None:
    if not isinstance(body, list | tuple) or len(body) != 3:
        return f"the body is not [args, kwargs, options]: {short_repr(body)}"
    args, kwargs, embed = body
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict) or not isinstance(embed, dict | None):
        return f"the body is not [args, kwargs, options]: {short_repr(body)}"
    return None


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
    "Strategy": f"{__name__}:json_only_strategy",  # a name: a function set on the class would bind as a method
    # Only a worker that is shutting down hands a task back to the broker
    # (tasks/retrying.py); a running one retries in place.
    "autoretry_for": (StorageUnavailableError,),
    "throws": (PassDied,),  # logged at ERROR with its traceback already (retrying.py)
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
    def durable_task(name: str) -> None:
        @app.task(name=name, **DURABLE_OPTIONS)
        def body(task: Task, *args: Any, **kwargs: Any) -> None:
            if _positional(name.rpartition(".")[2], args):
                return
            if _redelivered(task) and recovered_on_redelivery(engine, _task_id(task), kwargs):
                return
            telemetry.received(name, task.request)  # its time in the queue; tracing looked at again
            as_task_failure(lambda: run_durable_task(engine, name, _task_id(task), kwargs))

    for name in (COORDINATOR_TASK, BRANCH_TASK, AGENT_TASK):
        durable_task(name)

    @app.task(name=CALL_RESULT_TASK, base=CallAnswerTask, engine=engine, **DURABLE_OPTIONS)
    def call_result(this: Task, *args: Any, **fields: Any) -> None:
        request = this.request
        home, called = getattr(request, HOME_HEADER, None), getattr(request, CALLED_HEADER, None)
        as_task_failure(
            lambda: run_durable_task(engine, CALL_RESULT_TASK, _task_id(this), fields, args, home=home, called=called)
        )

    # Not bound: Celery calls an errback in place, with the exception, only
    # when its task is not bound (``_call_task_errbacks``).
    @app.task(name=CALL_FAILED_TASK, **{**DURABLE_OPTIONS, "bind": False})
    def call_error(*args: Any, **fields: Any) -> None:
        home, task_id = getattr(call_error.request, HOME_HEADER, None), str(call_error.request.id or "")
        as_task_failure(lambda: run_durable_task(engine, CALL_FAILED_TASK, task_id, fields, args, home=home))


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
