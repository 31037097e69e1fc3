"""The engine: registered workflows, the Celery app that runs them, the store."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Concatenate, ParamSpec

from celery import Celery
from kombu import Queue  # type: ignore[attr-defined]

from celery_durable.agents import AgentRunner, load_runner
from celery_durable.broker import RunRecord, RunStore
from celery_durable.broker.schema import MAIN, branch_of
from celery_durable.client.async_client import AsyncClient
from celery_durable.client.client import Client
from celery_durable.client.fleet_registry import ServedWatch
from celery_durable.config import Settings
from celery_durable.errors import DurableError
from celery_durable.tasks import throttling
from celery_durable.tasks.app import COORDINATOR_TASK, build_celery_app, new_task_id
from celery_durable.tasks.entry import run_durable_task
from celery_durable.tasks.home import HomeWakes
from celery_durable.tasks.home import install as install_home
from celery_durable.tasks.mount import mount
from celery_durable.tasks.parked import KeptFanouts, ParkedRuns
from celery_durable.tasks.recovery import install as install_recovery
from celery_durable.tasks.sending import (
    CelerySender,
    Outgoing,
    Sender,
    agent_message,
    branch_messages,
    coordinator_message,
    first_chunks,
)
from celery_durable.tasks.wakes import Wake
from celery_durable.workflows.calls import CallRequest
from celery_durable.workflows.definition import Workflow, check_unique_names, in_modules

logger = logging.getLogger(__name__)
P = ParamSpec("P")


def _publishes(build: Callable[Concatenate[Settings, P], Outgoing]) -> Callable[Concatenate[Engine, P], str]:
    """An engine method that publishes the message ``build`` makes and
    answers its task id: what the message takes is said once, where it is built."""

    def send(engine: Engine, /, *args: P.args, **kwargs: P.kwargs) -> str:
        message = build(engine.settings, *args, **kwargs)
        engine._publish([message])
        return message.task_id

    return send


HELD_STEP_SECONDS = 0.2
"""How long a pass's main body may hold a step's write back waiting for its
next call before the step is journaled by itself (``workflows/held.py``,
which looks every 0.1 s): well above the gap between two calls, well below
a worker's death and restart, so a body busy with its own code after a step
does not leave it to run again."""


class Engine:
    """Workflows, settings and the Celery app that runs them.

    Workers run ``engine.celery``; clients come from ``engine.client()``.
    ``celery_app`` mounts the engine on an app the user already has (SPEC
    §5a): its tasks, queues and their per-task options are added, and
    nothing that affects the app's other tasks changes; the app's broker is
    the one used. Without it the engine builds its own app. The Redis client
    is made per process, after a prefork worker forks.
    """

    def __init__(
        self,
        workflows: Iterable[Workflow],
        settings: Settings | None = None,
        agent_runner: AgentRunner | None = None,
        celery_app: Celery | None = None,
    ) -> None:
        self.settings = settings or Settings()
        if agent_runner is not None and not isinstance(agent_runner, AgentRunner):
            raise ValueError(f"agent_runner must have a run(request) method, got {type(agent_runner).__name__}")
        if celery_app is not None and not isinstance(celery_app, Celery):
            raise ValueError(f"celery_app must be a Celery app, got {type(celery_app).__name__}")
        self._agent_runner = agent_runner
        self.workflows: Mapping[str, Workflow] = check_unique_names(in_modules(workflows, self.settings.workflows))
        self.celery: Celery = celery_app if celery_app is not None else build_celery_app(self.settings)
        mount(self.celery, self)
        self.sender: Sender = CelerySender(self.celery)
        """How this engine's messages travel: through its Celery app, or the
        in-process test fleet's queue (``celery_durable.testing``)."""
        self._store: RunStore | None = None
        self._store_pid = 0
        self._lock = threading.Lock()
        self.refused_messages = 0
        self.held_step_seconds: float | None = HELD_STEP_SECONDS
        # A prefork pool forks its children while the worker's sweep thread
        # runs: a child that inherited this lock held (the sweep creating the
        # store at that moment) would wait for it for ever, at its first task.
        os.register_at_fork(after_in_child=self._new_lock)
        self.parked = ParkedRuns(self.settings.parked_executions, idle_seconds=self.settings.lease_seconds)
        self.kept_fanouts = KeptFanouts(self.settings.parked_executions, idle_seconds=self.settings.lease_seconds)
        self.home: Queue | None = None
        """This worker process's home queue (``tasks/home.py``), set when its worker starts."""
        self.home_wakes = HomeWakes(self)
        self.served = ServedWatch()
        """Whether a live worker serves a workflow, as start_workflow asks (fleet_registry)."""
        install_recovery(self)
        install_home(self)

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    @property
    def store(self) -> RunStore:
        pid = os.getpid()
        if self._store is None or self._store_pid != pid:
            with self._lock:
                if self._store is None or self._store_pid != pid:
                    self._store = self.gives_back(RunStore(self.settings))
                    self._store_pid = pid
        return self._store

    def gives_back(self, store: RunStore, *, through: Engine | None = None) -> RunStore:
        """``store``, its settles, pauses and take-overs giving back the
        throttle slots of the run's old attempts through this engine, or
        ``through`` (the async client's, on its loop's store)
        (``tasks/throttling.give_back``)."""
        store.after_settle = functools.partial(throttling.give_back_quietly, through or self)
        return store

    @property
    def agent_runner(self) -> AgentRunner | None:
        """The engine's runner, else the one named by ``settings.agent_runner`` (loaded once)."""
        if self._agent_runner is None and self.settings.agent_runner:
            self._agent_runner = load_runner(self.settings.agent_runner)
        return self._agent_runner

    @property
    def heartbeat_interval(self) -> float:
        """Beat often enough that a lease never lapses and a cancel is seen within a second."""
        return min(self.settings.lease_seconds / 3, 1.0)

    def client(self, namespace: str | None = None) -> Client:
        return Client(self, namespace or self.settings.namespace)

    def async_client(self, namespace: str | None = None) -> AsyncClient:
        """``client``'s methods as coroutines, for asyncio applications (SPEC §3)."""
        return AsyncClient(self, namespace or self.settings.namespace)

    send_coordinator = _publishes(coordinator_message)
    send_agent = _publishes(agent_message)

    def wake_main(self, record: RunRecord, task_id: str) -> None:
        """Send the run's main body the wake a script counted in flight as ``task_id``."""
        self.send_coordinator(record.run_id, record.epoch, record.workflow, task_id=task_id, namespace=record.namespace)

    def send_branches(
        self,
        run_id: str,
        epoch: int,
        workflow: str,
        call: str,
        indices: Sequence[int],
        tasks: int | None = None,
        task_ids: Sequence[str] | None = None,
        before: Callable[[Sequence[str]], None] | None = None,
        countdown: float | None = None,
    ) -> list[str]:
        """Publish a fan-out's branches: as its dispatch does (``tasks`` None), or as a hand-off asks.
        ``before`` is called with the task ids before any is published."""
        count = first_chunks(indices, self.settings) if tasks is None else tasks
        ids = list(task_ids) if task_ids is not None else [new_task_id() for _ in range(min(len(indices), count))]
        if before is not None:
            before(ids)
        self._publish(branch_messages(self.settings, run_id, epoch, workflow, call, indices, ids, countdown))
        return ids

    def _publish(self, messages: Sequence[Outgoing]) -> None:
        """Send messages of runs' attempts, each counted in flight before.

        Should the broker refuse them, they are forgotten (``unsent``), run
        by run, before the error goes on, and the sweep is told to look at
        each run now: a message counted and never sent would keep the run
        looking alive, or get it taken over while healthy; forgotten, a run
        left with nothing to move it is taken over, and its new attempt finds
        in the journal whatever the lost message was to wake it for. With
        ``auto_recover`` off no attempt would take it over: a coordinator
        message stays counted, as a caller that died before its publish
        leaves it, and the sweep sends it again at the same epoch once its
        queue is found empty (``examine.lua``).
        """
        try:
            self.sender.send(messages)
        except Exception:
            by_run: dict[tuple[str, int], list[str]] = {}
            for m in messages:
                kept = not self.settings.auto_recover and m.task == COORDINATOR_TASK
                by_run.setdefault((m.kwargs["run_id"], m.kwargs["epoch"]), []).extend([] if kept else [m.task_id])
            for (run_id, epoch), task_ids in by_run.items():
                try:
                    self.store.journal(run_id, epoch, self.settings.namespace).unsent(task_ids)
                    self.store.schedule_check(run_id, self.store.now_ms())
                except DurableError as exc:  # Redis down too, or the run moved on: liveness still judges it
                    logger.warning("run %s: unsent messages could not be forgotten: %s", run_id, exc)
            raise

    def send_call(self, record: RunRecord, request: CallRequest) -> None:
        self.sender.send_call(self, record, request)

    run_here = run_durable_task
    """Run durable task ``task``'s body here, as its message would have (a
    wake continued in place, a call answered where its task ran), through
    the one task entry: reached through the engine, so that the task
    modules that continue work in place need not import the entry that
    dispatches to them."""

    def deliver(self, wakes: Sequence[Wake]) -> None:
        """Send the messages of ``wakes``, the one way a counted wake is sent:
        many runs' together (one connection, one round trip where the broker
        batches publishes: kombu's Redis transport); a main body's sent to its
        home is watched there (``HomeWakes``)."""
        if not wakes:
            return
        self._publish([self._wake_message(wake) for wake in wakes])
        for wake in wakes:
            if wake.owner == MAIN and wake.home is not None:
                self.home_wakes.watch(wake.run_id, wake.epoch, wake.workflow, wake.task_id)

    def _wake_message(self, wake: Wake) -> Outgoing:
        if wake.owner == MAIN:
            return coordinator_message(
                self.settings,
                wake.run_id,
                wake.epoch,
                wake.workflow,
                task_id=wake.task_id,
                queue=wake.home,
                # Where the sender did not say it, the one this process met the run in (the pass checks it).
                namespace=wake.namespace or self.store.indexes.known(wake.run_id),
            )
        call, branch = branch_of(wake.owner)
        return branch_messages(self.settings, wake.run_id, wake.epoch, wake.workflow, call, [branch], [wake.task_id])[0]

    def count_refused(self) -> None:
        """Count a task message refused by the fence (stale epoch or forged run)."""
        with self._lock:
            self.refused_messages += 1
