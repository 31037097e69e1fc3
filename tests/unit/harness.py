"""Drive replay by hand on the in-memory journal: no Redis, no Celery, no worker.

``Driver`` plays the fleet's part one message at a time, so a test decides
what happens between passes: which branch task runs when, twice, or never;
when an attempt is taken over. Every pass is ``passes.main_pass`` and every
branch task ``passes.branch_pass`` over a real ``Replay``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from celery_durable import Workflow
from celery_durable.broker import schema
from celery_durable.broker.memory import MemoryJournal, MemoryRun
from celery_durable.testing.fleet import new_memory_run, settle
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.fanout import BranchTarget
from celery_durable.workflows.passes import Settlement, branch_pass, main_pass
from celery_durable.workflows.replay import Replay

MAX_PAYLOAD = 1 << 20


def new_run(workflow: Workflow, args: Any = None, limits: dict[str, Any] | None = None) -> MemoryRun:
    return new_memory_run(
        workflow, run_id=uuid.uuid4().hex, args_json=jsonvalue.dumps({} if args is None else args), limits=limits
    )


@dataclass
class Driver:
    """One run, and the messages its passes sent that no one delivered yet."""

    workflow: Workflow
    run: MemoryRun
    branches: list[tuple[str, int]] = field(default_factory=list)
    """Branch tasks sent: (call, branch index)."""
    turns: list[tuple[str, str]] = field(default_factory=list)
    """Agent tasks sent: (agent id, owner)."""
    execution: str = "execution-1"
    last: Replay | None = None

    @classmethod
    def of(cls, workflow: Workflow, **options: Any) -> Driver:
        return cls(workflow, new_run(workflow, **options))

    @property
    def epoch(self) -> int:
        return self.run.record().epoch

    def journal(self) -> MemoryJournal:
        return MemoryJournal(self.run, self.epoch)

    def replay(self, **extra: Any) -> Replay:
        record = self.run.record()

        def send_branches(call: str, indices: list[int]) -> list[str]:
            self.branches.extend((call, j) for j in indices)
            return [f"branch-{call}-{j}" for j in indices]

        def send_agent(agent: str, owner: str, task_id: str) -> None:
            self.turns.append((agent, owner))

        options: dict[str, Any] = {"send_branches": send_branches, "token": self.execution, **extra}
        self.last = Replay(
            journal=MemoryJournal(self.run, record.epoch),
            run=record,
            workflow=self.workflow,
            max_fanout=4096,
            max_payload_bytes=MAX_PAYLOAD,
            send_agent=send_agent,
            **options,
        )
        return self.last

    def main(self) -> Settlement | None:
        """One coordinator pass; a settlement is written as the coordinator writes it."""
        epoch = self.epoch
        self.run.activate(epoch, self.execution)
        settlement = main_pass(self.replay())
        if settlement is not None:
            settle(self.run, epoch, settlement)
        self.run.release(self.execution, epoch)
        return settlement

    def branch(self, call: str, index: int) -> bool:
        """One branch task; True when its outcome woke the coordinator."""
        journal = self.journal()
        woke: list[bool] = []

        def on_outcome(j: int, outcome: schema.Outcome) -> None:
            woke.append(journal.complete_branch(call, j, outcome.encode(), "wake"))

        replay = self.replay(target=BranchTarget(call, (index,), on_outcome), send_branches=None)
        branch_pass(replay, on_outcome)
        return any(woke)

    def deliver_branches(self) -> list[bool]:
        """Every branch task sent so far, in order; whether each woke the coordinator."""
        sent, self.branches = self.branches, []
        return [self.branch(call, index) for call, index in sent]

    def finish_turns(self, answer: str) -> None:
        """Every agent turn sent, answered with ``answer`` as the agent task journals it."""
        sent, self.turns = self.turns, []
        for agent, _owner in sent:
            verdict, _ = self.run.agent_start(self.epoch, agent)
            assert verdict == "go", verdict
            outcome = schema.value_outcome(answer).encode()
            row = schema.finished_agent_row(
                None, failed=False, started_at=1, completed_at=2, active_ms=1, usage={}, error=None
            )
            self.run.agent_finish(self.epoch, agent, outcome, row, 0, 0, 0)

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
        epoch = self.run.resume(self.run.record(), limits_json="", message=message, code_hash="")
        assert epoch is not None
        self.execution = f"execution-{epoch}"
        self.branches, self.turns = [], []
        return epoch

    def progress(self) -> list[tuple[str, str]]:
        page = self.run.progress_page("", "after", 0, 500)
        return [(record.kind, record.message) for record in page.records]
