"""``WorkflowTestEnvironment``: run workflows in-process, with no worker.

As with Temporal's test environment, a user's test starts a workflow and
gets back what a real client returns (a ``RunEnvelope``), with the engine's
real semantics underneath, because it is the engine: a real ``Engine`` and
its ``Client`` on the real Lua scripts, on a private ``redis-server`` the
environment starts itself (``testing.server``: one per test process, each
environment under a key prefix of its own), and the engine's own task
bodies, fed from named queues in this process (``testing.fleet``: one or
more worker processes, each an engine of its own) instead of Celery, with
the production mechanisms on unless a test switches them off
(``testing.mechanisms``). Calls are synchronous: each one drives the run as far as it goes
before it returns.

Time is virtual and skips, as with Temporal's time-skipping test server: a
run that sleeps for a day completes in milliseconds. The store reads the
environment's clock wherever it tells a script the time, so
``clock.advance(...)`` moves every lease, timer and active-time count on and
fires every timer it passes (the recovery sweep's part). The calls that
block on a real client until a run settles — ``run``, ``resume`` and
``wait`` — also skip time by themselves: whenever nothing else can make
progress, the clock jumps to the next timer. They stop skipping where
waiting longer could change nothing: a run that waits only for a signal is
returned as it is (``running``, with ``snapshot["waiting_for"]`` saying for
what), and ``signal`` delivers one. ``start`` and ``signal`` never move the
clock, so a test can act on a run while it waits (signal it before its
timeout, look at its reminders). ``ctx.now()`` and a ``ctx.sleep_until``
time read the virtual clock too (``testing.clock``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from celery_durable.agents import AgentRunner
from celery_durable.broker import RunRecord, RunStore
from celery_durable.broker.connection import connect
from celery_durable.broker.journal import Journal, LastWrites
from celery_durable.broker.run_records import RunHashes
from celery_durable.client.client import Client
from celery_durable.config import Settings
from celery_durable.engine import Engine
from celery_durable.schedules.firing import fire_due
from celery_durable.testing.clock import VirtualClock
from celery_durable.testing.crash import CrashingJournal, CrashPlan, CrashPoint
from celery_durable.testing.fleet import FanoutMode, Fleet, InProcessSender, callables
from celery_durable.testing.mechanisms import Mechanisms
from celery_durable.testing.server import private_settings
from celery_durable.workflows.definition import Workflow
from celery_durable.workflows.envelope import ProgressPage, RunDetail, RunEnvelope

MAX_SKIPPED_TIMERS = 10_000
"""``wait`` gives up on a run that keeps setting timers (a loop that sleeps
forever) after firing this many, rather than hang the test suite."""


class _Store(RunStore):
    """The engine's store on the environment's clock, its journals dying at the crash points."""

    def __init__(self, settings: Settings, clock: VirtualClock, plan: CrashPlan) -> None:
        super().__init__(settings, connect(settings), clock=clock.now_ms)
        self._plan = plan

    def journal(self, run_id: str, epoch: int, namespace: str) -> Journal:
        return CrashingJournal(super().journal(run_id, epoch, namespace), self._plan)

    def finish(self, *args: Any, last: LastWrites | None = None, **options: Any) -> bool:
        """A settlement that journals the pass's last step (``LastWrites``) is a
        journal write too: a dead attempt makes none, and the step's ``after``
        point fires once it is journaled, as ``CrashingJournal``'s do."""
        if last is not None:
            self._plan.check_alive()
        settled = super().finish(*args, last=last, **options)
        if settled and last is not None and last.commit is not None and last.commit.step_key:
            self._plan.reached(last.commit.step_key, "after")
        return settled


class _Engine(Engine):
    """An engine whose store is the environment's (one process, no fork)."""

    def __init__(self, workflows: Iterable[Workflow], settings: Settings, agent_runner: AgentRunner | None) -> None:
        super().__init__(workflows, settings, agent_runner)
        self.env_store: RunStore | None = None
        # Runs here go step by step on a virtual clock, and their crash points
        # are the order of their journal writes: a step journaled from another
        # thread after real time passed would make that order the machine's
        # load. A held step goes with the body's next call, as it always may.
        self.held_step_seconds = None

    @property
    def store(self) -> RunStore:
        assert self.env_store is not None
        return self.env_store


class _Client(Client):
    """The engine's client, judging a crashed attempt dead as the sweep would once its lease ran out."""

    def __init__(self, engine: Engine, namespace: str, fleet: Fleet) -> None:
        super().__init__(engine, namespace)
        self._fleet = fleet

    def _attempt_alive(self, record: RunRecord) -> bool:
        return self._fleet.alive(record.run_id, record.epoch) and super()._attempt_alive(record)


class WorkflowTestEnvironment:
    """Registered workflows, run in this process by the real engine on a private Redis.

    ``fanout="serial"`` runs the branches of a ``parallel``/``pipeline`` one
    after another, in order (deterministic tests); ``"threads"`` runs them
    at once, as a fleet would. Fan-outs nested inside a branch always run in
    threads, as on a worker. ``agent_runner`` answers ``ctx.agent`` (a
    ``FunctionRunner`` in most tests), with the schema check and the one
    retry of a real agent task. ``tasks`` answers ``ctx.call``: task name ->
    a function or a Celery task, run in this process (a fake of the GPU job,
    or the real task's body); a call to a name it lacks fails at once with
    ``TaskNotRegistered``.

    ``mechanisms`` chooses which production mechanisms run (``Mechanisms``:
    all of them by default, on one in-process worker process):
    answers and wakes run where they land, bodies are kept at their calls,
    home queues, narrow fan-outs run in the pass. ``Mechanisms.MESSAGES``
    makes every branch, answer and wake a message of its own, delivered in
    the order sent. ``trace()`` says which of them ran.
    """

    def __init__(
        self,
        workflows: Iterable[Workflow],
        *,
        agent_runner: AgentRunner | None = None,
        fanout: FanoutMode = "serial",
        max_fanout: int | None = None,
        settings: Settings | None = None,
        namespace: str = "default",
        tasks: Mapping[str, Any] | None = None,
        mechanisms: Mechanisms = Mechanisms.ALL,
    ) -> None:
        if fanout not in ("serial", "threads"):
            raise ValueError(f"fanout must be 'serial' or 'threads', got {fanout!r}")
        if agent_runner is not None and not isinstance(agent_runner, AgentRunner):
            raise ValueError(f"agent_runner must have a run(request) method, got {type(agent_runner).__name__}")
        # The private server is one Redis, whatever the environment says.
        base = settings or Settings(redis_cluster=False)
        limit = base.max_fanout if max_fanout is None else max_fanout
        self.mechanisms = mechanisms
        self.settings = private_settings(base).model_copy(update=mechanisms.settings(base, limit))
        self.namespace = namespace
        self.clock = VirtualClock(on_advance=self._time_passed)
        self._plan = CrashPlan()
        workflows = list(workflows)
        # One engine per worker process: each keeps its own bodies, fan-outs and home.
        engines = [_Engine(workflows, self.settings, agent_runner) for _ in range(mechanisms.processes)]
        self.engine = engines[0]
        self.workflows = self.engine.workflows
        store = self.engine.gives_back(_Store(self.settings, self.clock, self._plan))
        for engine in engines:
            engine.env_store = store
        self._fleet = Fleet(
            engines,
            fanout,
            self._plan,
            callables(tasks or {}),
            in_place=mechanisms.in_place,
            now=lambda: self.clock.now_ms() / 1000,
        )
        sender = InProcessSender(self._fleet)
        for engine in engines:
            engine.sender = sender
        self.client: Client = _Client(self.engine, namespace, self._fleet)
        """The engine's client, for what the environment does not wrap (listing runs, say)."""

    # -- starting and resuming ------------------------------------------------------

    def start(
        self,
        name_or_handle: str | Workflow,
        args: Any = None,
        limits: dict[str, Any] | None = None,
        **throttled: Any,
    ) -> str:
        """Start a run and drive it as far as it goes without time passing: until
        it settles, waits (a timer, a signal, a throttle's slot) or an armed
        crash kills its attempt; its run id. ``throttled``: start_workflow's
        ``throttle``, ``throttle_key`` and ``priority``."""
        self._workflow(name_or_handle)
        run_id = self.client.start_workflow(name_or_handle, args=args, limits=limits, **throttled)
        self._fleet.runs.append(run_id)
        self._fleet.drive()
        return run_id

    def run(
        self, name_or_handle: str | Workflow, args: Any = None, limits: dict[str, Any] | None = None
    ) -> RunEnvelope:
        """Start a run and ``wait`` for it: its envelope once it has settled,
        crashed, or waits for a signal only, time skipped over its timers."""
        return self.wait(self.start(name_or_handle, args=args, limits=limits))

    def wait(self, run_id: str) -> RunEnvelope:
        """Drive the run, skipping time to its next timer whenever nothing else
        can make progress (a sleep of a day takes milliseconds; waiting is not
        active time, so ``timeout_seconds`` does not count it). Returns the
        envelope once the run has settled, its attempt crashed, or it waits
        only for a signal: still ``running``, ``snapshot["waiting_for"]``
        naming the signal. Like the client's wait, it never sends a signal."""
        self._record(run_id)
        for _ in range(MAX_SKIPPED_TIMERS):
            self._fleet.drive()
            record = self._record(run_id)
            waiting = record.waiting_for
            if record.status != "running" or not self._fleet.alive(run_id, record.epoch) or waiting is None:
                return RunEnvelope.from_record(record)
            until = self._due(waiting)
            if until is None:
                return RunEnvelope.from_record(record)  # a signal without a timeout: only signal() helps
            self.clock.advance_to(until)
        raise RuntimeError(
            f"Run {run_id} kept setting timers: {MAX_SKIPPED_TIMERS} fired and it has not settled "
            "(a loop that sleeps forever?); use start() and clock.advance() to step through it"
        )

    def skip_to_next_timer(self, run_id: str) -> RunEnvelope:
        """Time-travel: move the clock to the run's next timer (a sleep, a
        signal's time-out, or that of a child it waits for), fire it, and
        drive the run as far as it goes; its envelope. A ``ValueError`` when
        the run waits for no timer (not waiting, or for a signal with no
        time-out: ``signal`` is what moves it)."""
        self._fleet.drive()
        waiting = self._record(run_id).waiting_for
        until = self._due(waiting) if waiting is not None else None
        if until is None:
            raise ValueError(f"Run {run_id} waits for no timer (waiting for: {waiting})")
        self.clock.advance_to(until)
        return self.get(run_id)

    def resume(
        self,
        run_id: str,
        limits: dict[str, Any] | None = None,
        *,
        force: bool = False,
        allow_code_change: bool = False,
    ) -> RunEnvelope:
        """Give the run a new attempt (as ``Client.resume_workflow``: same rules,
        same codes) and ``wait`` for it; a run whose attempt crashed continues
        from its journal, a wait that already ended is not waited for again."""
        self.client._resume(run_id, limits, force=force, allow_code_change=allow_code_change)
        return self.wait(run_id)

    def cancel(self, run_id: str) -> RunEnvelope:
        """Request cancellation and drive the run until it settles; a waiting
        run settles at once, without waiting for its timer or signal."""
        self.client._ask_cancel(run_id)
        self._fleet.drive()
        return self.get(run_id)

    def pause(self, run_id: str) -> RunEnvelope:
        """Request a pause and drive the run until it settles as paused; a
        waiting run pauses at once, and ``resume`` continues its wait with the
        original due time."""
        self.client._ask_pause(run_id)
        self._fleet.drive()
        return self.get(run_id)

    def signal(self, run_id: str, name: str, payload: Any = None) -> RunEnvelope:
        """Deliver signal ``name`` with a JSON ``payload``, as
        ``Client.signal_workflow_run`` does — the same checks and refusals —
        and drive the run as far as it goes without time passing.

        A signal sent before the run reaches its ``wait_for_signal`` is kept
        for it, in arrival order; a completed, cancelled or non-resumable run
        refuses it with a ``ValueError`` naming its status."""
        self.client.signal_workflow_run(run_id, name, payload)
        self._fleet.drive()
        return self.get(run_id)

    def busy(self, process: int, busy: bool = True) -> None:
        """Make worker process ``process`` (from 1) take no message, every slot
        taken, or (``busy=False``) take them again: what only it consumes —
        its home queue — waits for it, and a home wake falls back to the
        coordinator queue once the clock passes its 2 s (``HomeWakes``)."""
        self._fleet.set_busy(self._fleet.workers[process - 1], busy)

    def trace(self) -> dict[str, int]:
        """What the production mechanisms did so far, counted: messages
        delivered by kind (``coordinator``, ``branch``, ``agent``, ``call``,
        ``answer``), answers journaled where their task ran
        (``answers_in_place``), wakes delivered from a home queue
        (``home_deliveries``) and sent on from it (``home_fallbacks``),
        passes that went on from a kept body (``resumed``), of them passes
        the answer's script took (``taken``), branch tasks run from kept
        thunks (``kept_fanouts``)."""
        trace = self._fleet.trace
        counts = {kind: trace.delivered[kind] for kind in ("coordinator", "branch", "agent", "call", "answer")}
        return {
            **counts,
            "answers_in_place": trace.answers_in_place,
            "home_deliveries": trace.home_deliveries,
            "home_fallbacks": trace.home_fallbacks,
            **self._fleet.kept(),
        }

    # -- crashes ------------------------------------------------------------------------

    def crash_before(self, key: str) -> None:
        """The next attempt that reaches step ``key`` dies as the step starts:
        it shows running, its producer has not run. ``resume`` runs it then."""
        self._plan.arm(CrashPoint(key, "before"))

    def crash_after(self, key: str) -> None:
        """The next attempt that journals step ``key`` dies right after: a
        resumed run replays its value and does not run it again."""
        self._plan.arm(CrashPoint(key, "after"))

    @property
    def armed_crashes(self) -> list[tuple[str, str]]:
        """Crash points not reached yet, as (key, "before"|"after")."""
        return [(point.key, point.moment) for point in self._plan.armed]

    # -- reading --------------------------------------------------------------------------

    def get(self, run_id: str) -> RunEnvelope:
        return self.client.get_workflow_run(run_id)

    def progress(self, run_id: str, **page: Any) -> ProgressPage:
        """A page of progress records: ``Client.get_workflow_run_progress``, whose
        options (``phase_id``, ``after_seq``, ``before_seq``, ``limit``) it takes."""
        return self.client.get_workflow_run_progress(run_id, **page)

    def detail(self, run_id: str) -> RunDetail:
        """Phases, steps, agent rows and the latest progress, as ``Client.get_workflow_run_detail``."""
        return self.client.get_workflow_run_detail(run_id)

    def stored(self, run_id: str) -> RunHashes:
        """The run as storage holds it now — its run hash, journal, step and
        agent rows, messages in flight, waits and signals — for assertions a
        client cannot make (``stored(id).journal``; formats: ``broker/schema``)."""
        self._record(run_id)
        return self.engine.store.hashes(run_id)

    # -- helpers ----------------------------------------------------------------------------

    def _time_passed(self) -> None:
        """The clock moved: fire the schedules' ticks and the timers now due and
        drive what they woke (from inside a delivery, ``drive`` leaves that to
        the delivery under way)."""
        self.fire_schedules()
        self._fleet.fire_timers()
        self._fleet.drive()

    def fire_schedules(self) -> int | None:
        """The sweep's part for schedules (``schedules/firing.py``), on the
        virtual clock: the ticks due by now start their runs, which the fleet
        then drives with the rest (moving the clock does this by itself; a
        clock moved in one jump is an outage the catch-up window judges, so
        step it to fire each tick on time). Returns the next tick due."""
        next_due = fire_due(self.engine)
        known = set(self._fleet.runs)
        fresh = [run_id for run_id, _ in self.engine.store.list_run_ids(self.namespace, None, 500)]
        self._fleet.runs.extend(run_id for run_id in reversed(fresh) if run_id not in known)
        return next_due

    def _record(self, run_id: str) -> RunRecord:
        return self.client._record(run_id)

    def _due(self, waiting: dict[str, Any]) -> int | None:
        """When what a run waits for is due: its own time-out, else, for a
        child run it waits for, what that child waits for (and so on down)."""
        seen: set[str] = set()
        while waiting["until"] is None and waiting["kind"] == "child" and waiting["name"] not in seen:
            seen.add(waiting["name"])
            child = self.engine.store.load_run(waiting["name"])
            if child is None or child.status != "running" or child.waiting_for is None:
                return None
            waiting = child.waiting_for
        return cast(int | None, waiting["until"])

    def _workflow(self, name_or_handle: str | Workflow) -> Workflow:
        name = name_or_handle.name if isinstance(name_or_handle, Workflow) else name_or_handle
        registered = self.workflows.get(name) if isinstance(name, str) else None
        if registered is None or (isinstance(name_or_handle, Workflow) and registered is not name_or_handle):
            raise ValueError(f"Workflow {name!r:.80} is not registered with this environment")
        return registered
