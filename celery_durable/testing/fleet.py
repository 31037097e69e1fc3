"""The in-process fleet: the engine's own task bodies, fed from queues in memory.

A test environment's engine sends its messages through ``InProcessSender``
instead of Celery: each message the engine builds (``tasks.sending``) is
queued here and delivered to the same task body a worker would run for it
(``tasks.entry.run_durable_task``), on the same store, the real Lua scripts
on a real Redis. Nothing of a coordinator pass, a branch task or an agent
turn is written twice: the fleet only decides when each message runs.

The fleet is one or more *worker processes* (``InProcessWorker``), each an
engine of its own with what a worker process keeps in memory (bodies parked
at a call, kept fan-outs, its home queue), all on one store. Each consumes
named queues — the coordinator, steps and agents queues, its home
``<coordinator queue>.<node>``, and the queues of the user's tasks — and a
message goes to a worker that consumes its ``Outgoing.queue``: a home queue
to its worker, a shared queue to each of its consumers in turn. While a
worker delivers, the thread says what that worker consumes
(``in_place.consuming``), so the engine's own decisions — answer a call
where its task ran, run a wake here, take the pass in the answer's script,
send a wake home (``tasks/wake_route.py``) — are taken as on a fleet. With
``in_place`` off a thread knows nothing of its worker, as before: every
answer and wake travels as a message.

A called task (``ctx.call``) runs in this process too, from the functions
the environment was given; its answer is journaled where it ran when that
worker consumes the coordinator queue (``CallAnswerTask``'s decision), else
it travels as a ``CallAnswer`` on the coordinator queue, as Celery's link
would deliver it.

The recovery sweep's part is ``fire_timers``: the due timers of every run
fire (``examine.lua``) and their owners are sent their messages. Nothing is
taken over by itself: a crashed attempt stays dead until the test resumes it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from celery_durable.tasks import throttling
from celery_durable.tasks.app import (
    AGENT_TASK,
    BRANCH_TASK,
    CALL_FAILED_TASK,
    CALL_RESULT_TASK,
    COORDINATOR_TASK,
    new_task_id,
)
from celery_durable.tasks.calls import answer_fields, answer_in_place
from celery_durable.tasks.entry import run_durable_task
from celery_durable.tasks.home import REDIRECT_SECONDS, HomeWakes, has_home, home_name, home_queue
from celery_durable.tasks.in_place import consumes, consuming
from celery_durable.tasks.sending import Outgoing
from celery_durable.tasks.wake_route import answer_here
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
    """A called task's message: what to run, and the answer its link carries
    (``home``: the home queue of the worker that sent it, its header)."""

    run_id: str
    request: CallRequest
    answer: dict[str, Any]
    home: str | None = None


@dataclass(frozen=True, slots=True)
class CallAnswer:
    """A called task's answer as a message on the coordinator queue
    (``celery_durable.call_result`` / ``call_failed``), for a worker that
    did not journal it where the task ran."""

    run_id: str
    answer: dict[str, Any]
    home: str | None
    value: Any = None
    error: BaseException | None = None


Message = Outgoing | TaskCall | CallAnswer


def _run_of(message: Message) -> str:
    return message.kwargs["run_id"] if isinstance(message, Outgoing) else message.run_id


class InProcessSender:
    """The ``Sender`` of a test environment's engines: messages go to its fleet."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def send(self, messages: Sequence[Outgoing]) -> None:
        for message in messages:
            self._fleet.queue.append(message)  # deque.append is thread-safe: branch threads send too

    def send_call(self, engine: Engine, record: RunRecord, request: CallRequest) -> None:
        home = engine.home.name if engine.home is not None else None  # publish_call's header
        self._fleet.queue.append(TaskCall(record.run_id, request, answer_fields(record, request), home))


@dataclass
class Trace:
    """What the fleet's deliveries did, for tests that must see a mechanism run."""

    delivered: Counter[str] = field(default_factory=Counter)
    """Messages delivered, by kind: coordinator, branch, agent, call, answer."""
    home_deliveries: int = 0
    """Coordinator messages delivered from a worker's home queue."""
    home_fallbacks: int = 0
    """Home wakes sent again to the coordinator queue (``HomeWakes``)."""
    answers_in_place: int = 0
    """Call answers journaled in the thread that ran the called task."""


class VirtualHomeWakes(HomeWakes):
    """``HomeWakes`` on the environment's clock: a wake sent home and not
    started ``REDIRECT_SECONDS`` later is checked (the same ``requeue``) when
    the clock passes that, instead of by a thread on the wall clock."""

    def __init__(self, engine: Engine, now: Callable[[], float]) -> None:
        super().__init__(engine)
        self._now = now
        self._watched: list[tuple[float, int, tuple[str, int, str, str]]] = []
        self._order = itertools.count()
        self._guard = threading.Lock()

    def watch(self, run_id: str, epoch: int, workflow: str, task_id: str) -> None:
        with self._guard:
            heapq.heappush(
                self._watched, (self._now() + REDIRECT_SECONDS, next(self._order), (run_id, epoch, workflow, task_id))
            )

    def fire(self) -> int:
        """Check every watched wake now due; how many were."""
        due = []
        with self._guard:
            while self._watched and self._watched[0][0] <= self._now():
                due.append(heapq.heappop(self._watched)[2])
        for wake in due:
            self._check(*wake)
        return len(due)


class InProcessWorker:
    """One worker process of the in-process fleet: its engine (and so what
    it keeps in memory), the queues it consumes, its home queue."""

    def __init__(self, engine: Engine, node: str, now: Callable[[], float]) -> None:
        self.engine = engine
        self.node = node
        settings = engine.settings
        self.queues: frozenset[str] = frozenset(
            (settings.coordinator_queue, settings.steps_queue, settings.agents_queue)
        )
        if has_home(engine, prefork=False, consumed=self.queues):
            engine.home = home_queue(engine.celery, settings, home_name(settings, node))
            self.queues |= {engine.home.name}
        self.home_wakes = VirtualHomeWakes(engine, now)
        engine.home_wakes = self.home_wakes
        self.busy = False
        """Every slot taken: it takes no message, and what only it consumes (its home) waits."""

    @property
    def home(self) -> str | None:
        return self.engine.home.name if self.engine.home is not None else None


class Fleet:
    """The queues of an environment's messages, the workers that consume
    them, and the deliveries that drain them.

    Messages wait in one deque, in the order sent, each naming its queue;
    delivery takes them in that order and hands each to a worker consuming
    its queue. One order for all keeps a serial test deterministic.
    """

    def __init__(
        self,
        engines: Sequence[Engine],
        fanout: FanoutMode,
        plan: CrashPlan,
        tasks: Mapping[str, Callable[..., Any]],
        *,
        in_place: bool = False,
        now: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.workers = [InProcessWorker(engine, f"p{n}@fleet", now) for n, engine in enumerate(engines, start=1)]
        self.engine = self.workers[0].engine
        self.fanout = fanout
        self.plan = plan
        self.tasks = dict(tasks)
        self.in_place = in_place
        """Whether a delivering thread knows what its worker consumes (``in_place.consuming``)."""
        self.queue: deque[Message] = deque()
        self.waiting: list[Message] = []
        """Messages no worker may take now (their only consumer is busy)."""
        self.trace = Trace()
        self.runs: list[str] = []
        """The runs the environment started, in order: the ones whose timers it fires."""
        self.crashed: set[tuple[str, int]] = set()
        """Attempts (run id, epoch) that died: nothing of theirs runs again."""
        self._driving = threading.Lock()
        self._turns: Counter[str] = Counter()
        """Per shared queue, how many messages it gave: its consumers take them in turn."""

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
                chosen = [(self._worker_for(message), message) for message in batch]
                self.waiting.extend(message for worker, message in chosen if worker is None)
                self._deliver_all([(worker, message) for worker, message in chosen if worker is not None])
        finally:
            self.plan.revive()
            self._driving.release()

    def _queue_of(self, message: Message) -> str:
        if isinstance(message, Outgoing):
            return message.queue if isinstance(message.queue, str) else str(message.queue.name)
        if isinstance(message, CallAnswer):
            return self.engine.settings.coordinator_queue
        return message.request.queue or self.engine.celery.conf.task_default_queue

    def _worker_for(self, message: Message) -> InProcessWorker | None:
        """The worker that takes ``message``: the one whose home it names,
        else the next of those consuming its queue (every worker consumes
        the user's task queues); None while every one of them is busy."""
        queue = self._queue_of(message)
        for worker in self.workers:
            if worker.home == queue:
                if worker.busy:
                    return None
                self.trace.home_deliveries += 1
                return worker
        consumers = [w for w in self.workers if (queue in w.queues or not _durable(w, queue)) and not w.busy]
        if not consumers:
            return None
        turn = self._turns[queue]
        self._turns[queue] += 1
        return consumers[turn % len(consumers)]

    def set_busy(self, worker: InProcessWorker, busy: bool) -> None:
        """Make ``worker`` take no message (``busy``), or take them again:
        what waited for it goes back to the queues, first."""
        worker.busy = busy
        if not busy:
            self.queue.extendleft(reversed(self.waiting))
            self.waiting.clear()

    def _deliver_all(self, batch: Sequence[tuple[InProcessWorker, Message]]) -> None:
        if not batch:
            return
        if len(batch) == 1:
            self._deliver_guarded(*batch[0])
            return
        with ThreadPoolExecutor(max_workers=min(len(batch), NESTED_FANOUT_THREADS)) as pool:
            futures = [pool.submit(self._deliver_guarded, worker, message) for worker, message in batch]
        for future in futures:
            future.result()

    def _deliver_guarded(self, worker: InProcessWorker, message: Message) -> None:
        try:
            with self._running(worker):
                self._deliver(worker, message)
        except SimulatedCrash:
            self._crashed(_run_of(message))
        except BaseException:
            # A task that raises is a worker process dying of it: the run is
            # left as a crash leaves it (resumable), and the test sees the error.
            self._crashed(_run_of(message))
            raise

    @contextlib.contextmanager
    def _running(self, worker: InProcessWorker) -> Iterator[None]:
        if not self.in_place:
            yield
            return
        with consuming(worker.queues):
            yield

    def _deliver(self, worker: InProcessWorker, message: Message) -> None:
        if (_run_of(message), self._epoch_of(message)) in self.crashed:
            return  # its worker died with it
        if _run_of(message) not in self.runs:
            self.runs.append(_run_of(message))  # a child run: its timers fire too
        if isinstance(message, TaskCall):
            self.trace.delivered["call"] += 1
            self._call(worker, message)
        elif isinstance(message, CallAnswer):
            self.trace.delivered["answer"] += 1
            self._answer(worker.engine, message)
        else:
            self.trace.delivered[_KINDS.get(message.task, message.task)] += 1
            run_durable_task(worker.engine, message.task, message.task_id, dict(message.kwargs))

    def _epoch_of(self, message: Message) -> int:
        epoch = message.kwargs.get("epoch") if isinstance(message, Outgoing) else message.answer["epoch"]
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
        self.waiting[:] = [message for message in self.waiting if _run_of(message) != run_id]

    def alive(self, run_id: str, epoch: int) -> bool:
        """The attempt did not crash."""
        return (run_id, epoch) not in self.crashed

    def fire_timers(self) -> None:
        """The recovery sweep's part (``tasks/recovery.py``): every due timer fires,
        its owner is sent its message. A crashed attempt's timers stay put: it is
        dead until the test resumes it. And each worker's home wakes not
        started in time go to the coordinator queue (``HomeWakes``)."""
        for worker in self.workers:
            self.trace.home_fallbacks += worker.home_wakes.fire()
        throttling.sweep(self.engine)  # a rate's next admission, and the repairs of its look
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

    def kept(self) -> dict[str, int]:
        """What the workers' caches did, summed: passes that went on from a
        kept body (``resumed``), of them passes the answer's script took
        (``taken``), branch tasks run from kept thunks (``kept_fanouts``)."""
        engines = [worker.engine for worker in self.workers]
        return {
            "resumed": sum(engine.parked.resumed for engine in engines),
            "taken": sum(engine.parked.taken for engine in engines),
            "kept_fanouts": sum(engine.kept_fanouts.used for engine in engines),
        }

    # -- a called task (tasks/calls.py): run here, from the environment's tasks ---------

    def _call(self, worker: InProcessWorker, message: TaskCall) -> None:
        """The called task runs in this process: the function the environment
        was given for its name (a Celery task's own ``run`` when it was given
        the task). Its return value or exception answers the call where it
        ran when the worker consumes the coordinator queue (the decision
        ``CallAnswerTask`` takes), else by a message, as the link and
        link_error of ``tasks/calls.py`` do."""
        request = message.request
        task = self.tasks.get(request.task_name)
        error: BaseException | None = None
        result: Any = None
        if task is None:
            error = TaskNotRegistered(
                f"No task {request.task_name!r} in the test environment: give it with "
                f"WorkflowTestEnvironment(tasks={{{request.task_name!r}: function}})"
            )
        else:
            try:
                result = task(*request.args, **request.kwargs)
            except Exception as exc:
                error = exc
        engine = worker.engine
        if answer_here(True, consumes(engine, engine.settings.coordinator_queue)):
            if error is not None:
                run_durable_task(
                    engine, CALL_FAILED_TASK, "", dict(message.answer), (None, error, None), home=message.home
                )
                self.trace.answers_in_place += 1
                return
            if answer_in_place(engine, (result,), dict(message.answer), message.home):
                self.trace.answers_in_place += 1
                return
        self.queue.append(CallAnswer(message.run_id, message.answer, message.home, result, error))

    def _answer(self, engine: Engine, message: CallAnswer) -> None:
        args: tuple[Any, ...]
        if message.error is not None:
            task, args = CALL_FAILED_TASK, (None, message.error, None)
        else:
            task, args = CALL_RESULT_TASK, (message.value,)
        run_durable_task(engine, task, "", dict(message.answer), args, home=message.home)


def _durable(worker: InProcessWorker, queue: str) -> bool:
    """Whether ``queue`` is one of the engine's own (a user's task queue is not)."""
    settings = worker.engine.settings
    return queue in (settings.coordinator_queue, settings.steps_queue, settings.agents_queue) or queue.startswith(
        f"{settings.coordinator_queue}."
    )


_KINDS = {COORDINATOR_TASK: "coordinator", BRANCH_TASK: "branch", AGENT_TASK: "agent"}


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
