"""A crash-point explorer: a run killed at every boundary it crosses, then recovered.

``test_crash_explorer.py`` runs a scenario once cleanly and records every
boundary its processes cross: before and after each storage operation (a
script run, a pipelined write, the sweep schedule's writes) and before and
after each message published. A *process* is the delivery of one message by
the in-process fleet, or one client call (a signal, a cancel). Then, for each
boundary in turn, the scenario runs again from scratch with that process
dying exactly there: ``SimulatedCrash`` is raised, and every later storage
call, publish or step producer of that process raises too (nothing after a
``kill -9`` happens: no publish, no cleanup, no ``finally`` write). Other
processes go on, and messages already published are delivered. Recovery is
then the real sweep's (``RecoverySweep._look``: claim the due runs, examine
them, take the dead ones over, fire due timers, send the wakes) on the
environment's virtual clock, step after step, until the run settles or a
bound of leases of virtual time passes.

The tracer, and the store and sender that cross its boundaries, are in
``tracer.py``; ``crash_test.py`` points all this at a user's workflow.

Why here and not in production code: the hooks are the test environment's
store and sender (subclasses), so the engine's modules carry no trigger
points, and the explorer sees exactly the calls a worker would make.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery_durable.agents import AgentRunner
from celery_durable.broker.connection import now_ms as wall_ms
from celery_durable.broker.run_records import RunHashes
from celery_durable.config import Settings
from celery_durable.tasks import throttling
from celery_durable.tasks.recovery import BATCH, CLAIM_MS, RecoverySweep
from celery_durable.tasks.sending import Outgoing
from celery_durable.testing.clock import VirtualClock
from celery_durable.testing.crash import SimulatedCrash
from celery_durable.testing.environment import WorkflowTestEnvironment, _Client
from celery_durable.testing.fleet import CallAnswer, TaskCall
from celery_durable.testing.mechanisms import Mechanisms
from celery_durable.testing.tracer import Boundary, Trace, Tracer, _TracedSender, _TracedStore, short
from celery_durable.workflows.definition import Workflow

TERMINAL = frozenset({"completed", "cancelled", "error", "halted", "paused"})
PRODUCTION = Mechanisms(kept=False, home=False)
"""The production paths (answers in place, inline fan-out), but no body
parked in a thread of its own at a call: every storage call of a process is
in its thread, where the tracer sees it."""
DEFAULT_LEASES = 10
"""How many leases of virtual time recovery gets before a point counts as hung."""
MAX_SWEEPS = 400
"""A guard on the recovery loop itself (each sweep moves the clock on at least 1 ms)."""


def _queue_name(queue: Any) -> str:
    return queue if isinstance(queue, str) else str(getattr(queue, "name", queue))


_BASE_MS = wall_ms()
"""Where every execution's virtual time starts (in this process): ``ctx.now()``
reads alike in the clean run and each crashed one."""


class _StillClock(VirtualClock):
    """Virtual time that moves only when told to: the wall clock's drift
    between two runs of a scenario would make their traces differ."""

    def __init__(self) -> None:
        super().__init__()
        self._base_ms = _BASE_MS

    def now_ms(self) -> int:
        return self._base_ms + self.offset_ms

    def advance_to(self, at_ms: int) -> None:
        self._move(max(at_ms - self.now_ms(), 0))


class _NumberingClient(_Client):
    """Runs numbered from 1 (as 32 hex digits) in each execution: the same run
    ids, so results and child ids derived from them compare across executions."""

    _started = 0

    def _new_run_id(self) -> str:
        self._started += 1
        return f"{self._started:032x}"


class ExplorerEnvironment(WorkflowTestEnvironment):
    """A test environment whose store and sender cross traced boundaries, and
    whose time moves only when the explorer moves it (no timer fires behind
    the sweep's back).

    Before each process a gap of ``gap_seconds`` (a lease by default) of
    virtual time passes and the sweep looks at what fell due, as a fleet's
    sweep does while a run's messages wait or its steps run: so a run that
    only waits (for a child, a signal, a call) is found waiting and taken
    out of the sweep's schedule before the process that wakes it runs, as
    in production. Without it a crash that loses the wake would be rescued
    by a look left over from the run's start, which a real sweep has long
    consumed.
    """

    def __init__(
        self,
        workflows: Iterable[Workflow],
        tracer: Tracer,
        *,
        tasks: Mapping[str, Any] | None = None,
        mechanisms: Mechanisms = PRODUCTION,
        gap_seconds: float | None = None,
        agent_runner: AgentRunner | None = None,
    ) -> None:
        # Branches are handed on after branch_batch_ms of wall time: far off
        # here, so that every execution of a scenario crosses the same
        # boundaries however loaded the machine (the explorer replays a trace).
        settings = Settings(branch_batch_ms=60_000)
        super().__init__(workflows, tasks=tasks, mechanisms=mechanisms, settings=settings, agent_runner=agent_runner)
        self.client = _NumberingClient(self.engine, self.namespace, self._fleet)
        self.clock = _StillClock()
        self.tracer = tracer
        self.gap_ms = self.engine.store.lease_ms if gap_seconds is None else round(gap_seconds * 1000)
        store = _TracedStore(self.settings, self.clock, self._plan)
        store.tracer = tracer
        self.engine.env_store = self.engine.gives_back(store)
        sender = _TracedSender(self._fleet)
        sender.tracer = tracer
        sender.env = self
        self.delayed: list[tuple[int, Outgoing]] = []
        """Messages sent with a countdown, by when they fall due on the virtual clock."""
        self.engine.sender = sender
        self.sweep = RecoverySweep(self.engine, empty_queues=lambda: [])

    def _time_passed(self) -> None:
        """Time moved: the explorer's sweep fires what fell due, nothing else."""

    def deliver_all(self) -> None:
        """Deliver every queued message, each a process of its own (its
        death is its own: the other messages are still delivered)."""
        fleet = self._fleet
        self._release_due()
        while fleet.queue:
            self._time_goes_by()
            if not fleet.queue:
                continue
            message = fleet.queue.popleft()
            worker = fleet._worker_for(message)
            assert worker is not None, "no worker of the explorer's fleet is ever busy"
            name = _process_name(message)
            with self.tracer.process(name), fleet._running(worker):
                try:
                    fleet._deliver(worker, message)
                except SimulatedCrash:
                    if isinstance(message, TaskCall | CallAnswer):
                        # A called task is the user's plain Celery task, acks_late:
                        # the broker gives a dead worker's message to another (SPEC 5a);
                        # so is its answer, which no run counts in flight (on Redis,
                        # the sweep that buries its worker gives it back: give_back).
                        fleet.queue.append(message)
                    raise
            self._release_due()

    def _release_due(self) -> None:
        now = self.clock.now_ms()
        due = [m for at, m in self.delayed if at <= now]
        self.delayed = [(at, m) for at, m in self.delayed if at > now]
        self._fleet.queue.extend(due)

    def _time_goes_by(self) -> None:
        """The gap before a process: time passes, the sweep looks, and what it
        sent (a fired timer's wake, a take-over) joins the queue."""
        if self.gap_ms:
            self.clock.advance(self.gap_ms / 1000)
            self.sweep_once()
            self._release_due()

    def client_call(self, name: str, call: Callable[[], Any]) -> None:
        """A client call as a process, after the gap: a caller that dies is not retried."""
        self._time_goes_by()
        with self.tracer.process(f"client {name}"):
            call()

    def sweep_once(self) -> int | None:
        """The real sweep's pass on the virtual clock: the schedules' due ticks
        fired, every queue found empty now (the fleet's queue was drained),
        the due runs claimed, examined, their timers fired and the dead taken
        over. Returns when the next run or tick falls due."""
        store = self.engine.store
        now = store.now_ms()
        s = self.settings
        held = {_queue_name(m.queue) for m in self._fleet.queue if isinstance(m, Outgoing)}
        queues = [s.coordinator_queue, s.steps_queue, s.agents_queue]
        store.report_empty([queue for queue in queues if queue not in held], now)
        next_tick = self.sweep.fire_schedules()
        throttles = throttling.sweep(self.engine)
        due = store.claim_due(now, BATCH, CLAIM_MS)
        if due.runs:
            self.sweep._look(due.runs, due.claim, store.queue_room(), now)
        return min((at for at in (next_tick, throttles, due.next_due) if at is not None), default=None)

    def recover(self, done: Callable[[], bool], leases: int = DEFAULT_LEASES) -> bool:
        """Deliver and sweep, moving the clock to each next look, until
        ``done()``; False when it did not happen within ``leases`` leases
        of virtual time the fleet spent idle, waiting on the sweep (or
        nothing was left that could ever move the run)."""
        idle, bound = 0, leases * self.engine.store.lease_ms
        for _ in range(MAX_SWEEPS):
            self.deliver_all()
            if done():
                return True
            now = self.clock.now_ms()
            if idle >= bound:
                return False
            next_due = self.sweep_once()
            if self._fleet.queue:
                continue
            soonest = [at for at in (next_due, *(at for at, _ in self.delayed)) if at is not None]
            if not soonest:
                return done()  # nothing queued, nothing scheduled: nothing will ever move it
            self.clock.advance_to(max(min(soonest), now + 1))
            idle += self.clock.now_ms() - now
        return False

    def status(self, run_id: str) -> str:
        record = self.engine.store.load_run(run_id)
        return "missing" if record is None else record.status

    def settled(self, run_id: str) -> bool:
        return self.status(run_id) in TERMINAL

    def waits_for_signal(self, run_id: str) -> bool:
        record = self.engine.store.load_run(run_id)
        if record is None or record.status in TERMINAL:
            return True  # nothing more to wait for: the caller looks at what it became
        waiting = record.waiting_for
        return waiting is not None and waiting.get("kind") == "signal"

    def hashes(self, run_id: str) -> RunHashes:
        return self.engine.store.hashes(run_id)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A workflow and what happens to it: ``drive(env)`` starts it, acts as
    its clients do, recovers it, and returns the run id and whether it settled."""

    name: str
    workflows: tuple[Workflow, ...]
    drive: Callable[[ExplorerEnvironment], tuple[str, bool]]
    tasks: Mapping[str, Any] = field(default_factory=dict)
    mechanisms: Mechanisms = field(default_factory=lambda: PRODUCTION)
    agent_runner: AgentRunner | None = None


@dataclass(slots=True)
class Execution:
    """One run of a scenario: the tracer (trace, effects, where it died) and the run."""

    tracer: Tracer
    env: ExplorerEnvironment
    run_id: str
    settled: bool


def execute(scenario: Scenario, target: int | None, tracer_box: list[Tracer]) -> Execution:
    """Run ``scenario`` from scratch in a fresh environment (a fresh key
    prefix on the one redis-server), killing the process at boundary
    ``target`` (None: the clean run). ``tracer_box`` holds the tracer the
    scenario's step functions report their effects to."""
    tracer = Tracer()
    tracer.target = target
    tracer_box[:] = [tracer]
    s = scenario
    env = ExplorerEnvironment(s.workflows, tracer, tasks=s.tasks, mechanisms=s.mechanisms, agent_runner=s.agent_runner)
    run_id, settled = scenario.drive(env)
    return Execution(tracer, env, run_id, settled)


@dataclass(slots=True)
class PointResult:
    boundary: Boundary
    settled: bool
    problems: list[str]
    effects: Counter[str] = field(default_factory=Counter)
    """What ran in this execution (``Tracer.effect``), counted by name."""

    @property
    def hung(self) -> bool:
        return not self.settled

    @property
    def duplicated(self) -> bool:
        return any(p.startswith("duplicate") for p in self.problems)


@dataclass(slots=True)
class Exploration:
    scenario: str
    points: list[PointResult]
    seconds: float

    def failing(self) -> dict[str, list[str]]:
        return {p.boundary.name: (["hung"] if p.hung else []) + p.problems for p in self.points if p.hung or p.problems}

    def row(self) -> tuple[str, int, int, int, int, int, float]:
        """(workflow, points, settled as clean, duplicated, hung, other, seconds):
        ``other`` settled unlike the clean run without running anything twice."""
        clean = sum(1 for p in self.points if p.settled and not p.problems)
        duplicated = sum(1 for p in self.points if p.duplicated)
        hung = sum(1 for p in self.points if p.hung)
        other = len(self.points) - clean - duplicated - sum(1 for p in self.points if p.hung and not p.duplicated)
        return self.scenario, len(self.points), clean, duplicated, hung, other, self.seconds


Compare = Callable[[Execution, Execution], list[str]]


def allowed_effects(clean: Trace, boundary: Boundary) -> Counter[str]:
    """How many times each producer may run when the process dies at
    ``boundary``: as often as in the clean run, plus once more for each of
    its runs the dying process had begun before the boundary (run, not yet
    journaled: at least once allows it again), or had sent (a called task
    published, whose answer the next attempt cannot wait for: it sends the
    task again, as Temporal retries an activity whose worker died). A
    producer the crash came before may run only as often as in the clean run."""
    names = {b.process: b.process_name for b in clean.boundaries}
    sent = [
        b.label.removeprefix("publish ").rpartition("#")[0]
        for b in clean.boundaries
        if b.process == boundary.process
        and b.index <= boundary.index
        and b.moment == "after"
        and b.label.startswith("publish ")
    ]
    allowed: Counter[str] = Counter()
    for position, process, name in clean.effects:
        allowed[name] += 1
        begun = process == boundary.process and position <= boundary.index
        if begun or names.get(process, "").removeprefix("call ") in sent:
            allowed[name] += 1
    return allowed


def _process_name(message: Any) -> str:
    """A delivery's name in the trace: a called task's is "call <task name>",
    so that its effects can be traced to the process that published it."""
    if isinstance(message, Outgoing):
        return short(message.task)
    if isinstance(message, TaskCall):
        return f"call {message.request.task_name}"
    return type(message).__name__


def crash_points(trace: Trace) -> list[Boundary]:
    """The boundaries to die at: all of them, but those of a client call
    before its first storage operation returned. A caller that dies there
    made no call (nothing of it is durable); SPEC 3 promises a signal, cancel
    or pause only once it is stored."""
    stored: set[int] = set()
    points = []
    for boundary in trace.boundaries:
        if boundary.process_name.startswith("client") and boundary.process not in stored:
            if boundary.moment == "after" and not boundary.label.startswith("publish"):
                stored.add(boundary.process)
            else:
                continue
        points.append(boundary)
    return points


def explore(scenario: Scenario, tracer_box: list[Tracer], compare: Compare) -> tuple[Execution, Exploration]:
    """The clean run, then one run per boundary of it, each judged by ``compare``
    (the scenario's own checks) and by the producers' counts."""
    began = time.monotonic()
    clean = execute(scenario, None, tracer_box)
    if not clean.settled:
        raise AssertionError(f"{scenario.name}: the clean run did not settle ({clean.env.status(clean.run_id)})")
    points: list[PointResult] = []
    for boundary in crash_points(clean.tracer.trace):
        crashed = execute(scenario, boundary.index, tracer_box)
        problems: list[str] = []
        if crashed.tracer.crashed_at is None or crashed.tracer.crashed_at.label != boundary.label:
            problems.append(
                f"nondeterministic trace: meant to die {boundary.name}, died at {crashed.tracer.crashed_at}"
            )
        if crashed.settled:
            problems += compare(clean, crashed)
        allowed = allowed_effects(clean.tracer.trace, boundary)
        for name in sorted(set(allowed) | set(crashed.tracer.effects)):
            ran, limit = crashed.tracer.effects[name], allowed[name]
            if ran > limit:
                problems.append(f"duplicate effect {name}: ran {ran}x, at most {limit}x allowed")
            elif crashed.settled and ran < clean.tracer.effects[name]:
                problems.append(f"effect {name} ran {ran}x, {clean.tracer.effects[name]}x in the clean run")
        points.append(PointResult(boundary, crashed.settled, problems, crashed.tracer.effects))
    return clean, Exploration(scenario.name, points, time.monotonic() - began)


def table(explorations: Sequence[Exploration]) -> str:
    """The explorer's table: per workflow, its crash points and how they ended."""
    head = (
        f"{'workflow':<18} {'points':>6} {'settled as clean':>16} {'duplicated':>10} {'hung':>5} {'other':>5} "
        f"{'seconds':>8}"
    )
    lines = [head, "-" * len(head)]
    for e in explorations:
        name, points, clean, duplicated, hung, other, seconds = e.row()
        lines.append(f"{name:<18} {points:>6} {clean:>16} {duplicated:>10} {hung:>5} {other:>5} {seconds:>8.1f}")
    return "\n".join(lines)
