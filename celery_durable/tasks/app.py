"""The Celery app the engine builds, configured for durability, and its tasks.

Task names say what a task is, and arguments are keyword arguments naming
the run, so a person can follow a run in Flower.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from celery import Celery, Task
from kombu import Exchange, Queue  # type: ignore[attr-defined]

from celery_durable.config import Settings
from celery_durable.errors import StorageUnavailableError
from celery_durable.tasks.transport import TRANSPORT

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

COORDINATOR_TASK = "celery_durable.coordinator"
BRANCH_TASK = "celery_durable.branch"
AGENT_TASK = "celery_durable.agent"


def build_celery_app(settings: Settings, main: str = "celery_durable") -> Celery:
    """A Celery app that accepts JSON only and never loses a task to a dying worker."""
    app = Celery(main, broker=settings.effective_broker_url, set_as_current=False)
    app.conf.update(
        # JSON only: a worker never unpickles what a message says.
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        # The journal is the result store; Celery's results are not used.
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        # A task is acknowledged after it ran, and re-queued if its worker died.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.coordinator_queue,
        # Each queue its own direct exchange and routing key: left to Celery's
        # defaults, all three would bind the default key and every message
        # would be delivered to every queue.
        task_queues=[_queue(settings.coordinator_queue), _queue(settings.steps_queue), _queue(settings.agents_queue)],
        task_default_exchange=settings.coordinator_queue,
        task_default_routing_key=settings.coordinator_queue,
        task_routes={
            COORDINATOR_TASK: {"queue": settings.coordinator_queue},
            BRANCH_TASK: {"queue": settings.steps_queue},
            AGENT_TASK: {"queue": settings.agents_queue},
        },
        # Redelivery of an unacknowledged message after this long; keep it
        # above the longest step. Leases, not this, decide crash recovery.
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_seconds},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_send_sent_event=True,
    )
    if urlsplit(settings.effective_broker_url).scheme in ("redis", "rediss"):
        # Kombu's Redis transport, except that a frame that is not a message
        # is dropped instead of stopping the worker (tasks/transport.py).
        app.conf.broker_transport = TRANSPORT
    return app


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def register_tasks(app: Celery, engine: Engine) -> None:
    """Bind the coordinator and branch tasks to ``engine``'s workflows and store.

    ``shared=False``: Celery's default registers a decorated task on *every*
    app in the process when it finalizes, so a second engine's tasks (bound
    to the second engine's store and workflows) would leak into the first
    engine's app and run its messages against the wrong key prefix.
    """
    from celery_durable.tasks.agent import run_agent_task
    from celery_durable.tasks.branch import run_branch_task
    from celery_durable.tasks.coordinator import run_coordinator_task

    retry_storage = {
        "autoretry_for": (StorageUnavailableError,),
        "retry_backoff": 1,
        "retry_backoff_max": 30,
        "retry_jitter": True,
        "max_retries": None,
    }

    # Every field is keyword-only: celery-durable sends keyword arguments, so
    # a message with positional ones was not sent by it (see _positional).
    @app.task(name=COORDINATOR_TASK, ignore_result=True, shared=False, bind=True, **retry_storage)
    def coordinator(
        task: Task, *args: Any, run_id: Any = None, epoch: Any = None, workflow: Any = None, **extra: Any
    ) -> None:
        if _positional("coordinator", args):
            return
        task_id = str(task.request.id or "")
        run_coordinator_task(engine, task_id=task_id, run_id=run_id, epoch=epoch, workflow=workflow, extra=extra)

    @app.task(name=AGENT_TASK, ignore_result=True, shared=False, bind=True, **retry_storage)
    def agent(
        task: Task,
        *args: Any,
        run_id: Any = None,
        epoch: Any = None,
        workflow: Any = None,
        agent: Any = None,
        owner: Any = None,
        **extra: Any,
    ) -> None:
        if _positional("agent", args):
            return
        run_agent_task(
            engine,
            task_id=str(task.request.id or ""),
            run_id=run_id,
            epoch=epoch,
            workflow=workflow,
            agent=agent,
            owner=owner,
            extra=extra,
        )

    @app.task(name=BRANCH_TASK, ignore_result=True, shared=False, bind=True, **retry_storage)
    def branch(
        task: Task,
        *args: Any,
        run_id: Any = None,
        epoch: Any = None,
        workflow: Any = None,
        call: Any = None,
        branches: Any = None,
        **extra: Any,
    ) -> None:
        if _positional("branch", args):
            return
        run_branch_task(
            engine,
            task_id=str(task.request.id or ""),
            run_id=run_id,
            epoch=epoch,
            workflow=workflow,
            call=call,
            branches=branches,
            extra=extra,
        )


def _positional(kind: str, args: tuple[Any, ...]) -> bool:
    """True (and logged) for a message with positional arguments: not one of ours."""
    if args:
        logger.error("rejected %s message: positional arguments %.80r", kind, args)
    return bool(args)


def new_task_id() -> str:
    """A task id chosen before the message is sent, so the run can count the
    message as in flight in the same script that decides to send it."""
    return uuid.uuid4().hex


def send_agent(
    app: Celery,
    settings: Settings,
    run_id: str,
    epoch: int,
    workflow: str,
    agent: str,
    owner: str,
    countdown: float | None = None,
    task_id: str | None = None,
) -> str:
    task_id = task_id or new_task_id()
    app.send_task(
        AGENT_TASK,
        kwargs={"run_id": run_id, "epoch": epoch, "workflow": workflow, "agent": agent, "owner": owner},
        queue=settings.agents_queue,
        countdown=countdown,
        task_id=task_id,
    )
    return task_id


def send_coordinator(
    app: Celery,
    settings: Settings,
    run_id: str,
    epoch: int,
    workflow: str,
    countdown: float | None = None,
    task_id: str | None = None,
) -> str:
    task_id = task_id or new_task_id()
    app.send_task(
        COORDINATOR_TASK,
        kwargs={"run_id": run_id, "epoch": epoch, "workflow": workflow},
        queue=settings.coordinator_queue,
        countdown=countdown,
        task_id=task_id,
    )
    return task_id


def send_branch(
    app: Celery, settings: Settings, run_id: str, epoch: int, workflow: str, call: str, branch: int, task_id: str
) -> None:
    """Send one branch again: a branch that waited (for an agent turn, a timer...) continues."""
    app.send_task(
        BRANCH_TASK,
        kwargs={"run_id": run_id, "epoch": epoch, "workflow": workflow, "call": call, "branches": [branch]},
        queue=settings.steps_queue,
        task_id=task_id,
    )


def send_branches(
    app: Celery, settings: Settings, run_id: str, epoch: int, workflow: str, call: str, indices: Sequence[int]
) -> list[str]:
    """Publish the branches as at most ``settings.fanout_tasks`` tasks, on one
    connection; returns their task ids.

    A branch task replays the main body before it runs its thunks, and that
    replay rebuilds the whole list of thunks: one task per branch would make
    a fan-out of n cost n replays of size n. Chunks keep the total linear,
    and up to ``fanout_tasks`` branches still run at once across the fleet.
    """
    chunks = min(len(indices), settings.fanout_tasks)
    sent: list[str] = []
    with app.producer_or_acquire() as producer:
        for chunk in range(chunks):
            task_id = new_task_id()
            app.send_task(
                BRANCH_TASK,
                kwargs={
                    "run_id": run_id,
                    "epoch": epoch,
                    "workflow": workflow,
                    "call": call,
                    "branches": list(indices[chunk::chunks]),
                },
                queue=settings.steps_queue,
                producer=producer,
                task_id=task_id,
            )
            sent.append(task_id)
    return sent
