"""The in-process fleet: the three Celery tasks, run from a queue in this process.

A run is driven exactly as workers drive it — coordinator passes through
``passes.main_pass``, branch tasks through ``passes.branch_pass``, agent
turns through ``tasks.agent.run_turn`` — but the messages go to a deque
instead of a broker, and the storage is a ``MemoryRun``. Each task below
mirrors its namesake in ``celery_durable/tasks/`` minus what only a fleet
needs (heartbeat threads, retries on a storage outage, message parsing),
and like it tells the run which of its messages are in flight (the live
hash), so active time and ``timeout_seconds`` count as on a real fleet.

The recovery sweep's part is ``fire_timers``: the due timers of every run
fire (``examine.lua``) and their owners are sent their messages.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from celery_durable.agents import AgentRunner
from celery_durable.broker import Flags, RunRecord, now_ms, schema
from celery_durable.broker.memory import Clock, MemoryRun
from celery_durable.broker.schema import Outcome
from celery_durable.config import Settings
from celery_durable.errors import StaleAttemptError, StepFailed, StorageCorruptError
from celery_durable.testing.clock import VirtualClock
from celery_durable.testing.crash import CrashingJournal, CrashPlan, SimulatedCrash
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.calls import CallRequest, failure_error, result_outcome
from celery_durable.workflows.definition import Workflow
from celery_durable.workflows.fanout import NESTED_FANOUT_THREADS, BranchTarget
from celery_durable.workflows.limits import ceiling_fields, merge_limits, nano_credits
from celery_durable.workflows.passes import Settlement, branch_pass, corrupt, main_pass
from celery_durable.workflows.replay import Replay

if TYPE_CHECKING:
    from celery_durable.engine import Engine

FanoutMode = Literal["serial", "threads"]


@dataclass(frozen=True, slots=True)
class Message:
    """One task message: a coordinator pass, branch tasks, or an agent turn."""

    kind: Literal["coordinator", "branch", "agent", "call"]
    run_id: str
    epoch: int
    task_id: str
    call: str = ""
    indices: tuple[int, ...] = ()
    agent: str = ""
    owner: str = ""
    request: CallRequest | None = None
    """For a task call (``ctx.call``): what to run."""


@dataclass(frozen=True, slots=True)
class TurnConfig:
    """What ``tasks.agent.run_turn`` reads of its engine: the runner and the settings.
    (``run_turn`` is typed to take an ``Engine``; this carries just those two.)"""

    agent_runner: AgentRunner | None
    settings: Settings


def new_task_id() -> str:
    return uuid.uuid4().hex


def new_memory_run(
    definition: Workflow,
    *,
    run_id: str,
    args_json: str = "{}",
    limits: dict[str, Any] | None = None,
    namespace: str = "default",
    created_ms: int = 1_000,
    lease_ms: int = 30_000,
    progress_max: int = 0,
    clock: Clock = now_ms,
    message: str = "",
) -> MemoryRun:
    """A run as ``Client.start_workflow`` creates one (``limits`` over the
    workflow's, as checked overrides), held in memory; ``message`` is the
    task id of its first coordinator message."""
    effective = merge_limits(dict(definition.limits), limits)
    fields = schema.new_run_fields(
        run_id=run_id,
        workflow=definition.name,
        namespace=namespace,
        args_json=args_json,
        limits_json=jsonvalue.dumps(effective),
        code_hash=definition.code_hash,
        created_ms=created_ms,
        lease_ms=lease_ms,
        idempotency_key=None,
        progress_max=progress_max,
        ceilings=ceiling_fields(effective),
    )
    return MemoryRun(fields, message=message, clock=clock, lease_ms=lease_ms, lock_ms=lease_ms)


class Fleet:
    """Runs held in memory and the queue of their task messages."""

    def __init__(
        self,
        workflows: Mapping[str, Workflow],
        settings: Settings,
        agent_runner: AgentRunner | None,
        fanout: FanoutMode,
        plan: CrashPlan,
        clock: VirtualClock,
        tasks: Mapping[str, Callable[..., Any]] | None = None,
    ) -> None:
        self.workflows = workflows
        self.tasks = dict(tasks or {})
        self.clock = clock
        self.settings = settings
        self.turns = TurnConfig(agent_runner, settings)
        self.fanout = fanout
        self.plan = plan
        self.runs: dict[str, MemoryRun] = {}
        self.queue: deque[Message] = deque()
        self.crashed: set[tuple[str, int]] = set()
        """Attempts (run id, epoch) that died: nothing of theirs runs again."""
        self._driving = threading.Lock()

    def send(self, message: Message) -> None:
        self.queue.append(message)  # deque.append is thread-safe: branch threads send too

    def drive(self) -> None:
        """Deliver messages until none is left. Called again from inside a
        delivery (a step that cancels its own run), it returns at once: the
        delivery under way picks the new messages up."""
        if not self._driving.acquire(blocking=False):
            return
        try:
            while self.queue:
                message = self.queue.popleft()
                try:
                    if message.kind == "branch" and self.fanout == "threads":
                        batch = [message]
                        while self.queue and self.queue[0].kind == "branch":
                            batch.append(self.queue.popleft())
                        self._deliver_together(batch)
                    else:
                        self._deliver(message)
                except SimulatedCrash:
                    self._crashed(message.run_id)
                except BaseException:
                    # A task that raises is a worker process dying of it: the
                    # run is left as a crash leaves it (resumable), and the
                    # test sees the error.
                    self._crashed(message.run_id)
                    raise
        finally:
            self.plan.revive()
            self._driving.release()

    def _deliver_together(self, batch: Sequence[Message]) -> None:
        with ThreadPoolExecutor(max_workers=min(len(batch), NESTED_FANOUT_THREADS)) as pool:
            futures = [pool.submit(self._deliver, message) for message in batch]
        for future in futures:
            future.result()

    def _deliver(self, message: Message) -> None:
        handlers = {"coordinator": self._coordinator, "branch": self._branch, "agent": self._agent, "call": self._call}
        handlers[message.kind](message)

    def _crashed(self, run_id: str) -> None:
        """Every process of the attempt died: its queued messages are lost
        with it (a later attempt's fence would refuse them anyway), its lock
        runs out, and every message it had in flight is lost, as the sweep
        finds them once their workers stop beating (``liveness``: dead)."""
        remaining = [message for message in self.queue if message.run_id != run_id]
        self.queue.clear()
        self.queue.extend(remaining)
        run = self.runs[run_id]
        with run.lock:
            self.crashed.add((run_id, int(run.state.run["epoch"])))
            run.state.run.update(lock="", lock_until="0", lease_until="0")
            now = run.clock()
            for task_id in run.state.live:
                run.state.live[task_id] = f"l|{now}"

    def alive(self, run: MemoryRun) -> bool:
        """The run's current attempt did not crash."""
        with run.lock:
            return (run.run_id, int(run.state.run["epoch"])) not in self.crashed

    def wake(self, run_id: str, epoch: int, owner: str, task_id: str) -> None:
        """``Engine.wake``: the message that continues ``owner`` of a run."""
        if owner == schema.MAIN:
            self.send(Message("coordinator", run_id, epoch, task_id))
        else:
            call, branch = schema.branch_of(owner)
            self.send(Message("branch", run_id, epoch, task_id, call=call, indices=(branch,)))

    def fire_timers(self) -> None:
        """The recovery sweep's part (``tasks/recovery.py``): every due timer fires,
        its owner is sent its message. A crashed attempt's timers stay put: it is
        dead until the test resumes it."""
        for run in list(self.runs.values()):
            if not self.alive(run):
                continue
            prefix = new_task_id()
            examined = run.examine(fire_prefix=prefix)
            for n, owner in enumerate(examined.woken, start=1):
                self.wake(run.run_id, examined.epoch, owner, f"{prefix}-{n}")

    # -- the coordinator task (tasks/coordinator.py) ------------------------------------

    def _coordinator(self, message: Message) -> None:
        run = self.runs[message.run_id]
        record = run.record()
        if record.epoch != message.epoch:
            return
        definition = self.workflows[record.workflow]
        resend = new_task_id()
        try:
            activation = run.activate(record.epoch, message.task_id, resend)
        except StaleAttemptError:
            return
        if isinstance(activation, int):
            # Another pass holds the lock and was told to run once more.
            self.send(Message("coordinator", run.run_id, record.epoch, resend))
            return
        execution = new_task_id()
        replay = self._replay(run, record, definition, execution)
        replay.apply_flags(activation)
        while True:
            try:
                settlement = main_pass(replay)
                if settlement is not None:
                    settle(run, record.epoch, settlement)
            except StaleAttemptError:
                return
            except StorageCorruptError as exc:
                with contextlib.suppress(StaleAttemptError):
                    settle(run, record.epoch, corrupt(exc))
                return
            # A pass that lost a first-write race runs again at once, holding the lock.
            if not replay.rerun and not run.release(message.task_id, record.epoch):
                return
            fresh = run.record()
            if fresh.epoch != record.epoch:
                return
            replay = self._replay(run, fresh, definition, execution)
            replay.apply_flags(Flags(cancel=fresh.cancel_requested, pause=fresh.pause_requested))

    def _replay(self, run: MemoryRun, record: RunRecord, definition: Workflow, execution: str) -> Replay:
        def send_branches(call: str, indices: Sequence[int], count: Callable[[Sequence[str]], None]) -> list[str]:
            # One message per branch, so that "threads" runs every branch at once.
            ids = [new_task_id() for _ in indices]
            count(ids)
            for task_id, index in zip(ids, indices, strict=True):
                self.send(Message("branch", run.run_id, record.epoch, task_id, call=call, indices=(index,)))
            return ids

        return Replay(
            journal=CrashingJournal(run, record.epoch, self.plan, self.clock),
            run=record,
            workflow=definition,
            max_fanout=self.settings.max_fanout,
            max_payload_bytes=self.settings.max_payload_bytes,
            send_branches=send_branches,
            token=execution,
            send_agent=self._agent_sender(record),
            send_call=self._call_sender(record),
        )

    def _call_sender(self, record: RunRecord) -> Callable[[CallRequest], None]:
        def send_call(request: CallRequest) -> None:
            self.send(Message("call", record.run_id, record.epoch, request.task_id, request=request))

        return send_call

    # -- a called task (tasks/calls.py): run here, from the environment's tasks ------------

    def _call(self, message: Message) -> None:
        """The called task runs in this process: the function the environment
        was given for its name (a Celery task's own ``run`` when it was given
        the task). Its return value or exception answers the call, as the
        link and link_error of tasks/calls.py do."""
        request = message.request
        assert request is not None
        run = self.runs[message.run_id]
        task = self.tasks.get(request.task_name)
        if task is None:
            failure = StepFailed(
                request.key,
                "TaskNotRegistered",
                f"No task {request.task_name!r} in the test environment: give it with "
                f"WorkflowTestEnvironment(tasks={{{request.task_name!r}: function}})",
            )
            outcome = schema.failure_outcome(message.epoch, failure)
        else:
            try:
                result = task(*request.args, **request.kwargs)
            except Exception as exc:
                outcome = schema.failure_outcome(message.epoch, StepFailed(request.key, type(exc).__name__, str(exc)))
            else:
                outcome = result_outcome(request.key, result, message.epoch, self.settings.max_payload_bytes)
        prefix = new_task_id()
        try:
            owners = run.call_done(message.epoch, request.key, outcome.encode(), failure_error(outcome), prefix)
        except StaleAttemptError:
            return
        for n, owner in enumerate(owners or [], start=1):
            self.wake(message.run_id, message.epoch, owner, f"{prefix}-{n}")

    def _agent_sender(self, record: RunRecord) -> Callable[[str, str, str], None]:
        def send_agent(agent: str, owner: str, task_id: str) -> None:
            self.send(Message("agent", record.run_id, record.epoch, task_id, agent=agent, owner=owner))

        return send_agent

    # -- the branch task (tasks/branch.py) ------------------------------------------------

    def _branch(self, message: Message) -> None:
        run = self.runs[message.run_id]
        workflow = run.record().workflow
        started = run.branch_start(message.epoch, workflow, message.task_id, message.call, message.indices, [])
        if isinstance(started, str):
            return
        record = started.record
        journal = CrashingJournal(run, record.epoch, self.plan, self.clock)

        def on_outcome(index: int, outcome: Outcome) -> None:
            wake = new_task_id()
            if journal.complete_branch(message.call, index, outcome.encode(), wake):
                self.send(Message("coordinator", run.run_id, record.epoch, wake))

        replay = Replay(
            journal=journal,
            run=record,
            workflow=self.workflows[record.workflow],
            max_fanout=self.settings.max_fanout,
            max_payload_bytes=self.settings.max_payload_bytes,
            target=BranchTarget(message.call, message.indices, on_outcome, started=started),
            send_agent=self._agent_sender(record),
            send_call=self._call_sender(record),
        )
        try:
            replay.apply_flags(started.flags)
            died = False
            try:
                branch_pass(replay, on_outcome)
            except SimulatedCrash:
                died = True  # its worker died with the message in flight: nothing ends it
                raise
            finally:
                wake = new_task_id()
                # However it ends, it is no longer in flight; a pause waiting for it is woken.
                if not died and run.task_end(record.epoch, message.task_id, wake):
                    self.send(Message("coordinator", run.run_id, record.epoch, wake))
        except StaleAttemptError:
            return
        except StorageCorruptError:
            self.send(Message("coordinator", run.run_id, record.epoch, new_task_id()))

    # -- the agent task (tasks/agent.py) -------------------------------------------------

    def _agent(self, message: Message) -> None:
        # Imported here: tasks/ is the Celery side of the package, loaded only
        # once a turn runs. run_turn is the one that checks the schema and retries.
        from celery_durable.tasks.agent import run_turn

        run = self.runs[message.run_id]
        record = run.record()
        if record.epoch != message.epoch:
            return
        resend = new_task_id()
        try:
            verdict, request_json = run.agent_start(record.epoch, message.agent, message.task_id, resend)
            if verdict == "wait":
                # At the concurrency ceiling: come back later without holding a worker.
                self.send(dataclasses.replace(message, task_id=resend))
                return
            if verdict != "go" or request_json is None:
                return
            started, clock = run.clock(), time.monotonic()
            turn = run_turn(cast("Engine", self.turns), record, message.agent, json.loads(request_json))
            row = schema.finished_agent_row(
                run.agent_rows().get(schema.agent_row_key(message.agent, record.epoch)),
                failed=turn.error is not None,
                started_at=started,
                completed_at=run.clock(),
                active_ms=int((time.monotonic() - clock) * 1000),
                usage=turn.usage,
                error=turn.error,
            )
            usage: dict[str, Any] = turn.usage
            credits = (
                nano_credits(usage.get("ai_credits") or 0),
                int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0),
            )
            prefix = new_task_id()
            waiters = run.agent_finish(
                record.epoch, message.agent, turn.outcome.encode(), row, credits, message.task_id, prefix
            )
        except StaleAttemptError:
            return
        for n, owner in enumerate(waiters, start=1):
            self.wake(run.run_id, record.epoch, owner, f"{prefix}-{n}")


def settle(run: MemoryRun, epoch: int, settlement: Settlement) -> None:
    """Write a pass's settlement as the coordinator task does (finish.lua)."""
    run.finish(
        epoch,
        settlement.status,
        reason=settlement.reason,
        error=settlement.error,
        can_resume=settlement.can_resume,
        result_json=settlement.result_json,
        message=settlement.message,
    )
