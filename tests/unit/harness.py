"""Drive replay by hand on the real scripts: no Celery, no worker.

``Driver`` plays the fleet's part one message at a time, so a test decides
what happens between passes: which branch task runs when, twice, or never;
when an attempt is taken over; when a timer fires or a signal arrives. Every
pass is ``passes.main_pass`` and every branch task ``passes.branch_pass``
over a real ``Replay`` on the store's real journal (the Lua scripts, on the
private redis-server ``celery_durable.testing`` starts, under a key prefix
of each driver's own), and every message carries the task id the run counts
in flight (its live hash), as on a real fleet. Time is a ``VirtualClock``
the test moves (``advance``): the store tells every script that time.
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery_durable import Workflow
from celery_durable.broker import Flags, Journal, RunRecord, RunStore, schema
from celery_durable.broker.progress import ProgressSlice
from celery_durable.broker.replies.control import RequestVerdict, Signalled
from celery_durable.broker.replies.run import TurnVerdict
from celery_durable.broker.replies.shape import Refusal
from celery_durable.broker.run_records import RunHashes
from celery_durable.config import Settings
from celery_durable.tasks.sending import Outgoing
from celery_durable.testing.clock import VirtualClock
from celery_durable.testing.environment import _Engine
from celery_durable.testing.server import environment_redis_url
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.branch_work import BranchTarget
from celery_durable.workflows.calls import CallRequest
from celery_durable.workflows.completion import CompletionRoute
from celery_durable.workflows.passes import Settlement, branch_pass, main_pass, settled
from celery_durable.workflows.port import Port
from celery_durable.workflows.replay import Replay

MAX_PAYLOAD = 1 << 20
_ids = itertools.count(1)


def new_id(kind: str) -> str:
    return f"{kind}-{next(_ids)}"


class _DriverPort(Port):
    """The fleet as a ``Driver`` plays it: messages are kept, for the test to deliver."""

    def __init__(self, driver: Driver, send_call: Callable[[CallRequest], None] | None) -> None:
        super().__init__(4096, MAX_PAYLOAD)
        self._driver = driver
        self._send_call = send_call

    def send_branches(self, call: str, indices: Sequence[int], count: Callable[[Sequence[str]], None]) -> list[str]:
        ids = [new_id("branch") for _ in indices]
        count(ids)
        return [self._driver._send_branch(call, j, task_id) for j, task_id in zip(indices, ids, strict=True)]

    def send_agent(self, agent: str, owner: str, task_id: str) -> None:
        self._driver.turns.append((agent, owner))
        self._driver.task_ids[agent] = task_id

    def send_call(self, request: CallRequest) -> None:
        if self._send_call is None:
            super().send_call(request)
        else:
            self._send_call(request)


class _Started:
    """A sender that keeps what the client sends at a run's start: its first coordinator message."""

    def __init__(self) -> None:
        self.sent: list[Outgoing] = []

    def send(self, messages: Sequence[Outgoing]) -> None:
        self.sent.extend(messages)

    def send_call(self, engine: Any, record: RunRecord, request: CallRequest) -> None:
        raise AssertionError("a start sends no task call")


def new_run(
    workflow: Workflow, args: Any = None, limits: dict[str, Any] | None = None, clock: VirtualClock | None = None
) -> tuple[RunStore, str, str]:
    """A run started as the client starts one, on a store of its own: the
    store, the run id, and the task id of its first coordinator message."""
    settings = Settings(redis_url=environment_redis_url(), key_prefix=f"u{uuid.uuid4().hex[:12]}")
    store = RunStore(settings, clock=(clock or VirtualClock()).now_ms)
    engine = _Engine([workflow], settings, None)
    engine.env_store = store
    engine.sender = started = _Started()
    run_id = engine.client().start_workflow(workflow, args=args, limits=limits)
    return store, run_id, started.sent[0].task_id


@dataclass
class Driver:
    """One run, and the messages its passes sent that no one delivered yet."""

    workflow: Workflow
    store: RunStore
    run_id: str
    clock: VirtualClock
    branches: list[tuple[str, int]] = field(default_factory=list)
    """Branch tasks sent: (call, branch index)."""
    turns: list[tuple[str, str]] = field(default_factory=list)
    """Agent tasks sent: (agent id, owner)."""
    coordinator: list[str] = field(default_factory=list)
    """Coordinator messages sent (their task ids): each ``main`` takes the first."""
    task_ids: dict[tuple[str, int] | str, str] = field(default_factory=dict)
    """The task id of the last message sent for a branch (call, index) or an agent turn."""
    execution: str = "execution-1"
    last: Replay | None = None
    namespace: str = "default"

    @classmethod
    def of(cls, workflow: Workflow, **options: Any) -> Driver:
        clock = VirtualClock()
        store, run_id, first = new_run(workflow, clock=clock, **options)
        return cls(workflow, store, run_id, clock, coordinator=[first])

    def record(self) -> RunRecord:
        record = self.store.load_run(self.run_id)
        assert record is not None
        return record

    @property
    def state(self) -> RunHashes:
        """The run's hashes as stored now."""
        return self.store.hashes(self.run_id)

    @property
    def epoch(self) -> int:
        return self.record().epoch

    def journal(self) -> Journal:
        """The run's journal: a completed or cancelled run's from its archive (``replay_journal``)."""
        return self.store.replay_journal(self.record())

    def replay(
        self, target: BranchTarget | None = None, send_call: Callable[[CallRequest], None] | None = None
    ) -> Replay:
        """An execution whose messages this driver keeps: a pass, or a branch task given ``target``."""
        self.last = Replay(
            journal=self.store.journal(self.run_id, self.record().epoch, self.namespace),
            run=self.record(),
            workflow=self.workflow,
            port=_DriverPort(self, send_call),
            target=target,
            token=self.execution,
        )
        return self.last

    def _send_branch(self, call: str, index: int, task_id: str) -> str:
        self.branches.append((call, index))
        self.task_ids[(call, index)] = task_id
        return task_id

    def wake(self, owner: str, task_id: str) -> None:
        """``Engine.wake``: the coordinator, or a top-level branch's task."""
        if owner == schema.MAIN:
            self.coordinator.append(task_id)
        else:
            call, _, branch = owner.rpartition("/")
            self._send_branch(call, int(branch), task_id)

    def activate(self, token: str) -> Flags | int:
        return self.store.activate(self.run_id, self.epoch, token, self.namespace, new_id("resend"))

    def main(self) -> Settlement | None:
        """One coordinator pass, as the coordinator task runs it: its message
        (the first one sent, or a new one) takes the lock, and a settlement is
        written as the coordinator writes it."""
        epoch = self.epoch
        token = self.coordinator.pop(0) if self.coordinator else new_id("pass")
        activation = self.activate(token)
        assert isinstance(activation, Flags), "another pass holds the lock"
        replay = self.replay()
        replay.apply_flags(activation)
        settlement = main_pass(replay)
        if settlement is not None:
            settlement = settled(settlement, functools.partial(self._finish, epoch))
        self.store.release(self.run_id, token, epoch)
        return settlement

    def _finish(self, epoch: int, settlement: Settlement) -> bool:
        return self.store.finish(self.run_id, epoch, self.namespace, settlement.status, **settlement.written())

    def branch(self, call: str, index: int) -> bool:
        """One branch task (its message the last one sent for it); True when
        its outcome woke the coordinator."""
        return self.branch_task(call, (index,), self.task_ids.get((call, index), new_id("branch")))

    def branch_task(self, call: str, indices: tuple[int, ...], token: str = "") -> bool:
        """One branch task holding ``indices``, run one after another; True
        when an outcome woke the coordinator."""
        journal = self.journal()
        token = token or self.task_ids.get((call, indices[0])) or new_id("branch")
        woke: list[bool] = []

        def send_wake(wake: str) -> None:
            woke.append(True)
            self.coordinator.append(wake)

        record = self.record()
        started = self.store.branch_start(self.run_id, self.epoch, record.workflow, token, call, indices, [])
        if started is Refusal.UNKNOWN:
            return False  # delivered again after it ended: refused, nothing runs
        assert not isinstance(started, Refusal), started
        route = CompletionRoute(new_wake=lambda: new_id("wake"), send_wake=send_wake)
        target = BranchTarget(call, indices, route, started=started)
        replay = self.replay(target=target)
        replay.apply_flags(started.flags)
        try:
            branch_pass(replay)
        finally:
            wake = new_id("wake")
            if self.store.task_end(self.run_id, journal.epoch, token, wake):
                self.coordinator.append(wake)
        return any(woke)

    def deliver_branches(self) -> list[bool]:
        """Every branch task sent so far, in order; whether each woke the coordinator."""
        sent, self.branches = self.branches, []
        return [self.branch(call, index) for call, index in sent]

    def finish_turns(self, answer: str) -> None:
        """Every agent turn sent, answered with ``answer`` as the agent task journals it."""
        sent, self.turns = self.turns, []
        for agent, _owner in sent:
            token = self.task_ids[agent]
            start = self.store.agent_start(self.run_id, self.epoch, agent, token, new_id("resend"), 100)
            assert start.verdict is TurnVerdict.GO, start
            outcome = schema.value_outcome(answer).encode()
            row = schema.finished_agent_row(
                None, failed=False, started_at=1, completed_at=2, active_ms=1, usage={}, error=None
            )
            prefix = new_id("turn")
            woken = self.store.agent_finish(self.run_id, self.epoch, agent, outcome, row, (0, 0, 0), token, prefix)
            for n, owner in enumerate(woken.owners):
                self.wake(owner, f"{prefix}-{n + 1}")

    def settle(self, limit: int = 20) -> Settlement:
        """Passes and branch tasks until the run settles."""
        for _ in range(limit):
            settlement = self.main()
            if settlement is not None:
                return settlement
            self.deliver_branches()
        raise AssertionError(f"run did not settle in {limit} passes")

    def resume(self, message: str = "Run resumed") -> int:
        """A new attempt takes the run (resume.lua), with a new execution."""
        first = new_id("resumed")
        epoch = self.store.resume(self.record(), limits_json="", message=message, code_hash="", message_id=first)
        assert epoch is not None
        self.execution = f"execution-{epoch}"
        self.branches, self.turns, self.coordinator = [], [], [first]
        return epoch

    # -- the outside world: time, signals, requests ------------------------------------

    def advance(self, seconds: float) -> list[str]:
        """Time passes and the sweep fires the timers now due; the owners woken."""
        self.clock.advance(seconds)
        prefix = new_id("fire")
        examined = self.store.examine(self.run_id, "", fire_prefix=prefix)
        assert examined is not None
        for n, owner in enumerate(examined.woken, start=1):
            self.wake(owner, f"{prefix}-{n}")
        return examined.woken

    def signal(self, name: str, payload: Any = None) -> Signalled:
        """``signal_workflow_run``: kept for the run, and what waits for it woken."""
        prefix = new_id("signal")
        answer = self.store.signal(self.run_id, self.namespace, name, jsonvalue.dumps(payload), prefix)
        for n, owner in enumerate(answer.owners, start=1):
            self.wake(owner, f"{prefix}-{n}")
        return answer

    def pause(self) -> None:
        message = new_id("pause")
        if self.store.pause(self.run_id, self.namespace, message).verdict is RequestVerdict.REQUESTED:
            self.coordinator.append(message)

    def cancel(self) -> None:
        message = new_id("cancel")
        if self.store.cancel(self.run_id, self.namespace, message).verdict is RequestVerdict.REQUESTED:
            self.coordinator.append(message)

    def page(self) -> ProgressSlice:
        return self.store.progress_page(self.run_id, "", "after", 0, 500)

    def progress(self) -> list[tuple[str, str]]:
        return [(record.kind, record.message) for record in self.page().records]
