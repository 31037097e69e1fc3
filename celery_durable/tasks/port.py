"""The engine's ``Port``, and the one way a task builds an execution.

A coordinator pass and a branch task differ in what their execution may do
outside its journal: a pass runs narrow fan-outs itself and keeps their
thunks; a branch task keeps the thunks of the fan-out it replayed to, for
the branch tasks of this process that follow. Both are this one port, and
``execution`` is where either is built (``workflows/port.py`` says why).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from celery_durable.workflows.port import Count, Port
from celery_durable.workflows.replay import Replay

if TYPE_CHECKING:
    from celery_durable.broker import RunRecord
    from celery_durable.engine import Engine
    from celery_durable.workflows.branch_work import BranchTarget, InlineBranches, KeptFanout
    from celery_durable.workflows.calls import CallRequest
    from celery_durable.workflows.children import ChildPort
    from celery_durable.workflows.throttles import ThrottlePort


class EnginePort(Port):
    """Run ``record``'s attempt's messages, child runs and slots through ``engine``."""

    def __init__(self, engine: Engine, record: RunRecord, *, inline: bool, keeps: bool) -> None:
        super().__init__(engine.settings.max_fanout, engine.settings.max_payload_bytes)
        self.held_step_seconds = engine.held_step_seconds
        self._engine = engine
        self._record = record
        self._keeps = keeps
        self._inline = inline

    @functools.cached_property
    def inline(self) -> InlineBranches | None:
        # A fan-out that would start as one branch task runs in the pass itself
        # (branch_batch_ms 0 asks for a task per branch, so it never does).
        settings = self._engine.settings
        if not self._inline or settings.branch_batch_ms <= 0:
            return None
        from celery_durable.workflows.branch_work import InlineBranches

        r = self._record
        return InlineBranches(
            settings.fanout_tasks,
            settings.branch_batch_ms / 1000,
            self._hand_on,
            forget=functools.partial(self._engine.kept_fanouts.forget, r.run_id, r.epoch),
        )

    @functools.cached_property
    def children(self) -> ChildPort:
        from celery_durable.tasks.children import EngineChildren

        return EngineChildren(self._engine, self._record)

    @functools.cached_property
    def throttles(self) -> ThrottlePort:
        from celery_durable.tasks.throttling import EngineThrottles

        return EngineThrottles(self._engine, self._record)

    def send_branches(self, call: str, indices: Sequence[int], count: Count) -> list[str]:
        r = self._record
        return self._engine.send_branches(r.run_id, r.epoch, r.workflow, call, indices, before=count)

    def _hand_on(self, call: str, indices: Sequence[int], count: Count) -> list[str]:
        """Branches a pass ran itself until one ran slow: the rest, a task each."""
        r = self._record
        return self._engine.send_branches(
            r.run_id, r.epoch, r.workflow, call, indices, tasks=len(indices), before=count
        )

    def send_agent(self, agent: str, owner: str, task_id: str) -> None:
        r = self._record
        self._engine.send_agent(r.run_id, r.epoch, r.workflow, agent, owner, task_id=task_id)

    def send_call(self, request: CallRequest) -> None:
        self._engine.send_call(self._record, request)

    def keep_fanout(self, kept: KeptFanout) -> None:
        # A pass keeps the thunks of the narrow fan-outs it runs (a branch woken
        # by its call's answer, say, runs there later); a branch task those of
        # the fan-out it replayed to, unless it runs from kept thunks already.
        if self._keeps and (self._inline is False or self.inline is not None):
            self._engine.kept_fanouts.keep(self._record.run_id, self._record.epoch, kept)


def execution(
    engine: Engine,
    record: RunRecord,
    token: str,
    *,
    target: BranchTarget | None = None,
    keeps: bool = True,
) -> Replay:
    """One execution of ``record``'s attempt: a coordinator pass, or with
    ``target`` a branch task (``keeps``: it keeps the thunks it builds)."""
    return Replay(
        journal=engine.store.journal(record.run_id, record.epoch, record.namespace),
        run=record,
        workflow=engine.workflows[record.workflow],
        port=EnginePort(engine, record, inline=target is None, keeps=keeps),
        target=target,
        token=token,
    )
