"""``WorkflowTestEnvironment``: run workflows in-process, with no Redis and no worker.

As with Temporal's test environment, a user's test starts a workflow and
gets back what a real client would return (a ``RunEnvelope``), with the
engine's real semantics underneath: the journal is a ``MemoryJournal``,
which passes the same contract tests as the Redis one, and runs are driven
through the same replay passes as on workers (``testing.fleet``). Calls are
synchronous: each one drives the run as far as it goes before it returns.

Time is virtual and skips, as with Temporal's time-skipping test server: a
run that sleeps for a day completes in milliseconds. ``clock.advance(...)``
moves the environment's clock on and fires every timer it passes (the
recovery sweep's part). The calls that block on a real client until a run
settles — ``run``, ``resume`` and ``wait`` — also skip time by themselves:
whenever nothing else can make progress, the clock jumps to the next timer.
They stop skipping where waiting longer could change nothing: a run that
waits only for a signal is returned as it is (``running``, with
``snapshot["waiting_for"]`` saying for what), and ``signal`` delivers one.
``start`` and ``signal`` never move the clock, so a test can act on a run
while it waits (signal it before its timeout, look at its reminders).
Workflow code itself still reads the wall clock: ``ctx.now()`` does not
jump, and a ``ctx.sleep_until`` time is taken on the wall clock as
``ctx.now()`` gives it (``testing.clock``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from celery_durable.agents import AgentRunner
from celery_durable.broker.memory import MemoryRun
from celery_durable.config import Settings
from celery_durable.errors import RunNotFoundError, WorkflowDefinitionError, WorkflowResumeError
from celery_durable.progress import check_phase_id, check_query, to_page
from celery_durable.run_views import agent_row, phase_rows, resume_verdict, step_row
from celery_durable.testing.clock import VirtualClock
from celery_durable.testing.crash import CrashPlan, CrashPoint
from celery_durable.testing.fleet import FanoutMode, Fleet, Message, new_memory_run, new_task_id
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.definition import Workflow, check_unique_names
from celery_durable.workflows.envelope import ProgressPage, RunDetail, RunEnvelope
from celery_durable.workflows.limits import ceilings_argument, merge_limits, validate_limits
from celery_durable.workflows.waits import check_signal_name

_EPOCH = datetime.fromtimestamp(0, tz=UTC)
MAX_SKIPPED_TIMERS = 10_000
"""``wait`` gives up on a run that keeps setting timers (a loop that sleeps
forever) after firing this many, rather than hang the test suite."""


class WorkflowTestEnvironment:
    """Registered workflows, run in this process on in-memory storage.

    ``fanout="serial"`` runs the branches of a ``parallel``/``pipeline`` one
    after another, in order (deterministic tests); ``"threads"`` runs them
    at once, as a fleet would. Fan-outs nested inside a branch always run in
    threads, as on a worker. ``agent_runner`` answers ``ctx.agent`` (a
    ``FunctionRunner`` in most tests), with the schema check and the one
    retry of a real agent task. ``tasks`` answers ``ctx.call``: task name ->
    a function or a Celery task, run in this process (a fake of the GPU job,
    or the real task's body); a call to a name it lacks fails at once with
    ``TaskNotRegistered``.
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
    ) -> None:
        if fanout not in ("serial", "threads"):
            raise ValueError(f"fanout must be 'serial' or 'threads', got {fanout!r}")
        if agent_runner is not None and not isinstance(agent_runner, AgentRunner):
            raise ValueError(f"agent_runner must have a run(request) method, got {type(agent_runner).__name__}")
        base = settings or Settings()
        self.settings = base if max_fanout is None else base.model_copy(update={"max_fanout": max_fanout})
        self.namespace = namespace
        self.clock = VirtualClock(on_advance=self._time_passed)
        self.workflows = check_unique_names(workflows)
        self._plan = CrashPlan()
        self._fleet = Fleet(
            self.workflows, self.settings, agent_runner, fanout, self._plan, self.clock, _callables(tasks or {})
        )

    # -- starting and resuming ------------------------------------------------------

    def start(self, name_or_handle: str | Workflow, args: Any = None, limits: dict[str, Any] | None = None) -> str:
        """Start a run and drive it as far as it goes without time passing: until
        it settles, waits (a timer, a signal) or an armed crash kills its
        attempt; its run id."""
        definition = self._workflow(name_or_handle)
        args = {} if args is None else args
        args_json = jsonvalue.encode_payload(
            args,
            self.settings.max_payload_bytes,
            noun="Workflow args",
            too_large="{noun} are {size} bytes, above max_payload_bytes ({limit})",
        )
        definition.validate_args(args)
        if limits is not None:
            validate_limits(limits, allow_none=True)
        run_id, message = new_task_id(), new_task_id()
        lease_ms = int(self.settings.lease_seconds * 1000)
        self._fleet.runs[run_id] = new_memory_run(
            definition,
            run_id=run_id,
            args_json=args_json,
            limits=limits,
            namespace=self.namespace,
            created_ms=self.clock.now_ms(),
            lease_ms=lease_ms,
            progress_max=self.settings.progress_max_records,
            clock=self.clock.now_ms,
            message=message,
        )
        self._fleet.send(Message("coordinator", run_id, 1, message))
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
        run = self._stored(run_id)
        for _ in range(MAX_SKIPPED_TIMERS):
            self._fleet.drive()
            record = run.record()
            waiting = record.waiting_for
            if record.status != "running" or not self._fleet.alive(run) or waiting is None:
                return RunEnvelope.from_record(record)
            if waiting["until"] is None:
                return RunEnvelope.from_record(record)  # a signal without a timeout: only signal() helps
            self.clock.advance_to(waiting["until"])
        raise RuntimeError(
            f"Run {run_id} kept setting timers: {MAX_SKIPPED_TIMERS} fired and it has not settled "
            "(a loop that sleeps forever?); use start() and clock.advance() to step through it"
        )

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
        if limits is not None:
            try:
                validate_limits(limits, allow_none=True)
            except WorkflowDefinitionError as exc:
                raise WorkflowResumeError(str(exc), code="workflow_limits_invalid") from None
        try:
            run = self._stored(run_id)
        except RunNotFoundError as exc:
            raise WorkflowResumeError(str(exc), code="not_found") from None
        record = run.record()
        definition = self.workflows[record.workflow]
        code_changed = definition.code_hash != record.code_hash
        if code_changed and not allow_code_change:
            raise WorkflowResumeError(
                f"Workflow {record.workflow!r} code changed since run {run_id} started", code="workflow_code_changed"
            )
        merged = merge_limits(record.limits, limits)
        # Alive as the client judges it: work in flight, or waits for the outside
        # world. A crashed attempt's messages died with it (Fleet._crashed).
        alive = record.status in ("pending", "running") and run.examine().verdict in ("alive", "waiting")
        message = new_task_id()
        epoch = run.resume(
            record,
            limits_json=jsonvalue.dumps(merged),
            message=resume_verdict(record, alive=alive, force=force, code_changed=code_changed),
            code_hash=definition.code_hash if code_changed else "",
            message_id=message,
            ceilings=ceilings_argument(merged),
        )
        if epoch is None:
            raise WorkflowResumeError(f"Run {run_id} changed while resuming it", code="already_active")
        self._fleet.send(Message("coordinator", run_id, epoch, message))
        return self.wait(run_id)

    def cancel(self, run_id: str) -> RunEnvelope:
        """Request cancellation (``cancel.lua``) and drive the run until it settles;
        a waiting run settles at once, without waiting for its timer or signal."""
        return self._request(run_id, self._stored(run_id).cancel)

    def pause(self, run_id: str) -> RunEnvelope:
        """Request a pause (``pause.lua``) and drive the run until it settles as
        paused; a waiting run pauses at once, and ``resume`` continues its wait
        with the original due time."""
        return self._request(run_id, self._stored(run_id).pause)

    def _request(self, run_id: str, request: Callable[[str], tuple[str, int | None]]) -> RunEnvelope:
        message = new_task_id()
        verdict, epoch = request(message)
        if verdict == "requested" and epoch is not None:
            self._fleet.send(Message("coordinator", run_id, epoch, message))
            self._fleet.drive()
        return self.get(run_id)

    def signal(self, run_id: str, name: str, payload: Any = None) -> RunEnvelope:
        """Deliver signal ``name`` with a JSON ``payload`` (``signal.lua``), as
        ``Client.signal_workflow_run`` does — the same checks and refusals —
        and drive the run as far as it goes without time passing.

        A signal sent before the run reaches its ``wait_for_signal`` is kept
        for it, in arrival order; a completed, cancelled or non-resumable run
        refuses it with a ``ValueError`` naming its status."""
        check_signal_name(name)
        payload_json = jsonvalue.encode_payload(payload, self.settings.max_payload_bytes, noun="Signal payload")
        run = self._stored(run_id)
        prefix = new_task_id()
        answer = run.signal(name, payload_json, prefix)
        if answer.verdict == "refused":
            detail = " and cannot be resumed" if answer.status == "error" else ""
            raise ValueError(f"Run {run_id} is {answer.status}{detail}: it takes no more signals")
        for n, owner in enumerate(answer.owners, start=1):
            self._fleet.wake(run_id, answer.epoch, owner, f"{prefix}-{n}")
        self._fleet.drive()
        return self.get(run_id)

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
        return RunEnvelope.from_record(self._stored(run_id).record())

    def progress(
        self,
        run_id: str,
        phase_id: str | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int | None = None,
    ) -> ProgressPage:
        """A page of progress records, as ``Client.get_workflow_run_progress`` pages them."""
        query = check_query(after_seq, before_seq, limit)
        run = self._stored(run_id)
        record = run.record()
        declared = [phase.phase_id for phase in self.workflows[record.workflow].phases]
        scope = check_phase_id(phase_id, declared, record.workflow)
        return to_page(run.progress_page(scope, query.mode, query.cursor, query.limit), query)

    def detail(self, run_id: str) -> RunDetail:
        """Phases, steps, agent rows and the latest progress, as ``Client.get_workflow_run_detail``."""
        run = self._stored(run_id)
        record = run.record()
        steps = [step_row(key, row) for key, row in run.step_rows().items()]
        steps.sort(key=lambda row: (row.started_at is None, row.started_at or _EPOCH, row.key))
        agents = [agent_row(row) for row in run.agent_rows().values()]
        agents.sort(key=lambda row: (row["started_at"] is None, row["started_at"] or _EPOCH, row["agent_id"]))
        return RunDetail(
            run=RunEnvelope.from_record(record),
            phases=phase_rows(self.workflows[record.workflow], record),
            steps=steps,
            progress=self.progress(run_id, limit=20).records,
            agents=agents,
        )

    def stored(self, run_id: str) -> MemoryRun:
        """The run as storage holds it: its journal, rows and run hash, for
        assertions a client cannot make (``stored(id).state.journal``)."""
        return self._stored(run_id)

    # -- helpers ----------------------------------------------------------------------------

    def _time_passed(self) -> None:
        """The clock moved: fire the timers now due and drive what they woke
        (from inside a delivery, ``drive`` leaves that to the delivery under way)."""
        self._fleet.fire_timers()
        self._fleet.drive()

    def _stored(self, run_id: str) -> MemoryRun:
        run = self._fleet.runs.get(run_id) if isinstance(run_id, str) else None
        if run is None:
            raise RunNotFoundError(f"Run not found: {jsonvalue.short_repr(run_id)}")
        return run

    def _workflow(self, name_or_handle: str | Workflow) -> Workflow:
        name = name_or_handle.name if isinstance(name_or_handle, Workflow) else name_or_handle
        registered = self.workflows.get(name) if isinstance(name, str) else None
        if registered is None or (isinstance(name_or_handle, Workflow) and registered is not name_or_handle):
            raise ValueError(f"Workflow {jsonvalue.short_repr(name)} is not registered with this environment")
        return registered


def _callables(tasks: Mapping[str, Any]) -> dict[str, Callable[..., Any]]:
    """What ``ctx.call`` runs in the environment, by task name: a function, or
    a Celery task (its ``run``, the task's own body, called in this process)."""
    found: dict[str, Callable[..., Any]] = {}
    for name, task in tasks.items():
        body = getattr(task, "run", task)
        if not isinstance(name, str) or not callable(body):
            raise ValueError(f"tasks maps task names to functions or Celery tasks, got {name!r}: {task!r:.80}")
        found[name] = body
    return found
