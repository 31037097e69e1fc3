"""The in-process fleet: the engine's own task bodies, fed from a queue in memory.

A test environment's engine sends its messages through ``InProcessSender``
instead of Celery: each message the engine builds (``tasks.sending``) is
queued here and delivered to the same task body a worker would run for it
(``tasks.entry.run_durable_task``), on the same store, the real Lua scripts
on a real Redis. Nothing of a coordinator pass, a branch task or an agent
turn is written twice: the fleet only decides when each message runs.

A called task (``ctx.call``) runs in this process too, from the functions
the environment was given, and its answer goes to the engine's answer
handlers (``tasks.calls``) exactly as Celery's link would deliver it.

The recovery sweep's part is ``fire_timers``: the due timers of every run
fire (``examine.lua``) and their owners are sent their messages. Nothing is
taken over by itself: a crashed attempt stays dead until the test resumes it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from celery_durable.tasks.app import BRANCH_TASK, new_task_id
from celery_durable.tasks.calls import answer_fields, call_failed, call_succeeded
from celery_durable.tasks.entry import run_durable_task
from celery_durable.tasks.sending import Outgoing
from celery_durable.tasks.wakes import woken
from celery_durable.testing.crash import CrashPlan, SimulatedCrash
from celery_durable.workflows.branches import NESTED_FANOUT_THREADS
from celery_durable.workflows.calls import CallRequest

if TYPE_CHECKING:
    from celery_durable.broker import RunRecord
    from celery_durable.engine import Engine

FanoutMode = Literal["serial", "threads"]


class TaskNotRegistered(Exception):
    """``ctx.call`` named a task the test environment was not given."""


@dataclass(frozen=True, slots=True)
class TaskCall:
    """A called task's message: what to run, and the answer its link carries."""

    run_id: str
    request: CallRequest
    answer: dict[str, Any]


Message = Outgoing | TaskCall


def _run_of(message: Message) -> str:
    return message.run_id if isinstance(message, TaskCall) else str(message.kwargs["run_id"])


class InProcessSender:
    """The ``Sender`` of a test environment's engine: messages go to its fleet."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def send(self, messages: Sequence[Outgoing]) -> None:
        for message in messages:
            self._fleet.queue.append(message)  # deque.append is thread-safe: branch threads send too

    def send_call(self, engine: Engine, record: RunRecord, request: CallRequest) -> None:
        self._fleet.queue.append(TaskCall(record.run_id, request, answer_fields(record, request)))


class Fleet:
    """The queue of an environment's messages, and the deliveries that drain it."""

    def __init__(
        self, engine: Engine, fanout: FanoutMode, plan: CrashPlan, tasks: Mapping[str, Callable[..., Any]]
    ) -> None:
        self.engine = engine
        self.fanout = fanout
        self.plan = plan
        self.tasks = dict(tasks)
        self.queue: deque[Message] = deque()
        self.runs: list[str] = []
        """The runs the environment started, in order: the ones whose timers it fires."""
        self.crashed: set[tuple[str, int]] = set()
        """Attempts (run id, epoch) that died: nothing of theirs runs again."""
        self._driving = threading.Lock()

    def drive(self) -> None:
        """Deliver messages until none is left. Called again from inside a
        delivery (a step that cancels its own run), it returns at once: the
        delivery under way picks the new messages up."""
        if not self._driving.acquire(blocking=False):
            return
        try:
            while self.queue:
                batch = [self.queue.popleft()]
                if self.fanout == "threads" and _is_branch(batch[0]):
                    while self.queue and _is_branch(self.queue[0]):
                        batch.append(self.queue.popleft())
                self._deliver_all(batch)
        finally:
            self.plan.revive()
            self._driving.release()

    def _deliver_all(self, batch: Sequence[Message]) -> None:
        if len(batch) == 1:
            self._deliver_guarded(batch[0])
            return
        with ThreadPoolExecutor(max_workers=min(len(batch), NESTED_FANOUT_THREADS)) as pool:
            futures = [pool.submit(self._deliver_guarded, message) for message in batch]
        for future in futures:
            future.result()

    def _deliver_guarded(self, message: Message) -> None:
        try:
            self._deliver(message)
        except SimulatedCrash:
            self._crashed(_run_of(message))
        except BaseException:
            # A task that raises is a worker process dying of it: the run is
            # left as a crash leaves it (resumable), and the test sees the error.
            self._crashed(_run_of(message))
            raise

    def _deliver(self, message: Message) -> None:
        if (_run_of(message), self._epoch_of(message)) in self.crashed:
            return  # its worker died with it
        if _run_of(message) not in self.runs:
            self.runs.append(_run_of(message))  # a child run: its timers fire too
        if isinstance(message, TaskCall):
            self._call(message)
        else:
            run_durable_task(self.engine, message.task, message.task_id, dict(message.kwargs))

    def _epoch_of(self, message: Message) -> int:
        epoch = message.answer["epoch"] if isinstance(message, TaskCall) else message.kwargs.get("epoch")
        return epoch if isinstance(epoch, int) else -1

    def _crashed(self, run_id: str) -> None:
        """Every process of the attempt died: its queued messages are lost
        with it (a later attempt's fence would refuse them anyway), and it
        never runs again. Its lock and its messages in flight are left as a
        SIGKILL leaves them: a resume takes the run over all the same."""
        record = self.engine.store.load_run(run_id)
        if record is not None:
            self.crashed.add((run_id, record.epoch))
        remaining = [message for message in self.queue if _run_of(message) != run_id]
        self.queue.clear()
        self.queue.extend(remaining)

    def alive(self, run_id: str, epoch: int) -> bool:
        """The attempt did not crash."""
        return (run_id, epoch) not in self.crashed

    def fire_timers(self) -> None:
        """The recovery sweep's part (``tasks/recovery.py``): every due timer fires,
        its owner is sent its message. A crashed attempt's timers stay put: it is
        dead until the test resumes it."""
        store = self.engine.store
        for run_id in self.runs:
            record = store.load_run(run_id)
            if record is None or record.status not in ("pending", "running") or not self.alive(run_id, record.epoch):
                continue
            prefix = new_task_id()
            examined = store.examine(run_id, "", fire_prefix=prefix)
            if examined is None:
                continue
            self.engine.deliver(woken(run_id, examined.epoch, examined.workflow, examined.woken, prefix))

    # -- a called task (tasks/calls.py): run here, from the environment's tasks ---------

    def _call(self, message: TaskCall) -> None:
        """The called task runs in this process: the function the environment
        was given for its name (a Celery task's own ``run`` when it was given
        the task). Its return value or exception answers the call, as the
        link and link_error of ``tasks/calls.py`` do."""
        request = message.request
        task = self.tasks.get(request.task_name)
        if task is None:
            missing = TaskNotRegistered(
                f"No task {request.task_name!r} in the test environment: give it with "
                f"WorkflowTestEnvironment(tasks={{{request.task_name!r}: function}})"
            )
            call_failed(self.engine, (None, missing, None), dict(message.answer))
            return
        try:
            result = task(*request.args, **request.kwargs)
        except Exception as exc:
            call_failed(self.engine, (None, exc, None), dict(message.answer))
        else:
            call_succeeded(self.engine, (result,), dict(message.answer))


def _is_branch(message: Message) -> bool:
    return isinstance(message, Outgoing) and message.task == BRANCH_TASK


def callables(tasks: Mapping[str, Any]) -> dict[str, Callable[..., Any]]:
    """What ``ctx.call`` runs in the environment, by task name: a function, or
    a Celery task (its ``run``, the task's own body, called in this process)."""
    found: dict[str, Callable[..., Any]] = {}
    for name, task in tasks.items():
        body = getattr(task, "run", task)
        if not isinstance(name, str) or not callable(body):
            raise ValueError(f"tasks maps task names to functions or Celery tasks, got {name!r}: {task!r:.80}")
        found[name] = body
    return found
