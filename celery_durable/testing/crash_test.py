"""Crash-test your own workflows: every point a worker can die, and what it costs.

``crash_test(workflows, workflow, args)`` is the crash-point explorer
(``testing/explorer.py``) pointed at a user's workflow: it runs the workflow
once cleanly in an in-process environment, recording every boundary its
processes cross (before and after each storage operation and each message
published), then runs it again from scratch once per boundary with the
process dying exactly there (as under ``kill -9``: nothing more of that
process runs), and lets the real recovery sweep finish it on a virtual clock.

The report says, per crash point, whether the run settled as the clean run
did (status, result, journaled step outcomes, children), and which step
producers ran more often than in the clean run. At-least-once allows that:
a worker that dies after a producer ran and before its outcome was journaled
leaves the step to run again. Those are the steps whose side effects need an
idempotency key (``ctx.idempotency_key``). With ``fakes`` (``Fake``
subclasses: the payment API, the mailer your steps call in tests), the
report flags only the steps whose *side effects* happened twice, so a step
that passes its key to a fake that honours it, as the real service would,
is not flagged. Why a report and not an assertion: a rerun step is not a bug
by itself; the user decides which of them matter.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any

from celery_durable.agents import AgentRequest, AgentResult, AgentRunner
from celery_durable.engine import Engine
from celery_durable.testing.explorer import (
    DEFAULT_LEASES,
    Execution,
    ExplorerEnvironment,
    Scenario,
    explore,
)
from celery_durable.testing.tracer import Tracer
from celery_durable.workflows.context import WorkflowContext
from celery_durable.workflows.definition import Workflow
from celery_durable.workflows.saga import Saga

_RUNNING: list[Tracer] = []
"""The tracer of the execution under way, while a crash test runs."""
_STEP: ContextVar[str | None] = ContextVar("celery_durable_crash_test_step", default=None)
"""The step whose producer this thread runs now: a side effect is its step's."""
STEP = "step "
"""How a producer's own runs are named among the tracer's effects."""


class Fake:
    """A stand-in for a service your steps call, for ``crash_test`` to watch.

    Call ``self.side_effect(what)`` wherever the real service would change
    something (a charge made, a mail sent); a call it would answer from an
    idempotency key it saw before makes none. Each side effect is listed in
    ``side_effects``; during a crash test it also counts against the step
    running it. ``crash_test`` puts every fake it is given back to the state
    it had when the test began before each execution, so a fake's memory (of
    keys, of charges) is that execution's alone."""

    side_effects: list[str]

    def side_effect(self, what: str) -> None:
        vars(self).setdefault("side_effects", []).append(what)
        if _RUNNING:
            _RUNNING[0].effect(f"{_STEP.get() or 'outside a step'}: {what}")


class _WatchedContext(WorkflowContext):
    """The run's context, each step and compensation producer counted as it runs."""

    def __init__(self, ctx: WorkflowContext) -> None:
        self._home, self._args = ctx._home, ctx._args

    def step(self, key: str, producer: Callable[[], Any], **options: Any) -> Any:
        return super().step(key, _counted(key, producer), **options)

    def saga(self) -> Saga:
        return _WatchedSaga(lambda: self._replay)


class _WatchedSaga(Saga):
    def compensate(self, key: str, producer: Callable[[], Any]) -> None:
        super().compensate(key, _counted(key, producer) if callable(producer) else producer)


def _counted(key: str, producer: Callable[[], Any]) -> Callable[[], Any]:
    def counted() -> Any:
        _RUNNING[0].effect(STEP + key)  # a dead process's thread unwinds here instead
        token = _STEP.set(key)
        try:
            return producer()
        finally:
            _STEP.reset(token)

    return counted


class _CountedRunner:
    """The agent runner, each turn counted as ``agent <label>``: a turn asked
    again after a crash is a model call paid twice, and a fake it calls is its."""

    def __init__(self, runner: AgentRunner) -> None:
        self._runner = runner

    def run(self, request: AgentRequest) -> AgentResult:
        result: AgentResult = _counted(f"agent {request.label or 'turn'}", lambda: self._runner.run(request))()
        return result


def _watched(workflow: Workflow) -> Workflow:
    """The same workflow (name, code hash), its context watched."""
    return dataclasses.replace(workflow, run=lambda ctx: workflow.run(_WatchedContext(ctx)))


@dataclass(frozen=True, slots=True)
class PointReport:
    """One crash point: ``point`` names it ("after commit_begin#3 (in coordinate)")."""

    point: str
    settled: bool
    differences: list[str]
    """How the run ended unlike the clean run (empty: as the clean run did)."""
    reran: list[str]
    """Steps whose producer ran more often than in the clean run (agent turns
    as ``agent <label>``)."""
    repeated: list[str]
    """Fakes' side effects seen more often than in the clean run, as "step: what"."""

    @property
    def as_clean(self) -> bool:
        return self.settled and not self.differences


@dataclass(frozen=True, slots=True)
class CrashReport:
    workflow: str
    points: list[PointReport]
    watched_fakes: bool
    seconds: float

    @property
    def all_settled_as_clean(self) -> bool:
        return all(p.as_clean for p in self.points)

    @property
    def reran(self) -> list[str]:
        """Every step some crash point ran twice."""
        return sorted({key for p in self.points for key in p.reran})

    @property
    def flagged(self) -> list[str]:
        """The steps whose side effects need an idempotency key: those whose
        fakes' side effects happened twice at some point. Given no fakes
        (None; ``fakes=[]`` says the steps call no service), every step that
        ran twice: nothing says its effects were keyed."""
        if not self.watched_fakes:
            return self.reran
        return sorted({effect.partition(": ")[0] for p in self.points for effect in p.repeated})

    def failures(self) -> dict[str, list[str]]:
        """The points that hung or settled unlike the clean run, and how."""
        return {p.point: p.differences or ["did not settle"] for p in self.points if not p.as_clean}

    def __str__(self) -> str:
        clean = sum(p.as_clean for p in self.points)
        lines = [f"{self.workflow}: {len(self.points)} crash points, {clean} settled as the clean run did"]
        lines += [f"  {point}: {'; '.join(why)}" for point, why in self.failures().items()]
        lines.append(f"  steps run twice: {', '.join(self.reran) or 'none'}")
        lines.append(f"  need an idempotency key: {', '.join(self.flagged) or 'none'}")
        return "\n".join(lines)


def crash_test(
    workflows: Engine | Iterable[Workflow],
    workflow: Workflow | str,
    args: Any = None,
    *,
    fakes: Sequence[Fake] | None = None,
    signals: Mapping[str, Any] | None = None,
    tasks: Mapping[str, Any] | None = None,
    agent_runner: AgentRunner | None = None,
    leases: int = DEFAULT_LEASES,
) -> CrashReport:
    """Run ``workflow`` with ``args`` once cleanly and once per crash point.

    ``workflows``: an engine or the workflows to register (children
    included). ``fakes``: the ``Fake`` services the steps call (None: not
    known, and every step that ran twice is flagged). ``signals``: name -> payload, each sent as the run first waits
    for it (a signal is a client's call: a point of its own too). ``tasks``
    and ``agent_runner`` answer ``ctx.call`` and ``ctx.agent`` as in
    ``WorkflowTestEnvironment``. A point at which the run has not settled
    after ``leases`` leases of virtual time counts as hung."""
    registered = list(workflows.workflows.values() if isinstance(workflows, Engine) else workflows)
    name = workflow if isinstance(workflow, str) else workflow.name
    saved = [(fake, copy.deepcopy(vars(fake))) for fake in fakes or ()]

    def restore() -> None:
        for fake, state in saved:
            vars(fake).clear()
            vars(fake).update(copy.deepcopy(state))

    def drive(env: ExplorerEnvironment) -> tuple[str, bool]:
        restore()
        run_id = env.client.start_workflow(name, args=args)
        unsent = dict(signals or {})
        waiting = partial(_waits_for, env, run_id, unsent)
        while True:
            if not env.recover(lambda: env.settled(run_id) or waiting() is not None, leases):
                return run_id, False
            signal = waiting()
            if signal is None:
                return run_id, True
            payload = unsent.pop(signal)
            env.client_call(f"signal {signal}", partial(env.client.signal_workflow_run, run_id, signal, payload))

    runner = None if agent_runner is None else _CountedRunner(agent_runner)
    watched = tuple(_watched(w) for w in registered)
    scenario = Scenario(name, watched, drive, tasks=dict(tasks or {}), agent_runner=runner)
    try:
        clean, exploration = explore(scenario, _RUNNING, compare)
    finally:
        _RUNNING.clear()
        restore()  # the fakes as the test left them, not as the last execution did
    ran = clean.tracer.effects
    points = [
        PointReport(
            point.boundary.name,
            point.settled,
            [p for p in point.problems if not p.startswith("duplicate effect")] if point.settled else [],
            sorted(k.removeprefix(STEP) for k, n in point.effects.items() if k.startswith(STEP) and n > ran[k]),
            sorted(k for k, n in point.effects.items() if not k.startswith(STEP) and n > ran[k]),
        )
        for point in exploration.points
    ]
    return CrashReport(name, points, fakes is not None, exploration.seconds)


def _waits_for(env: ExplorerEnvironment, run_id: str, unsent: Mapping[str, Any]) -> str | None:
    """The signal still to send that the run waits for now, if any."""
    record = env.engine.store.load_run(run_id)
    waiting = record.waiting_for if record is not None and not env.settled(run_id) else None
    if waiting is not None and waiting.get("kind") == "signal" and waiting.get("name") in unsent:
        return str(waiting["name"])
    return None


# -- what "settled as the clean run did" means ---------------------------------------------

COUNTED_ONCE = ("signal_received", "child_started")
"""History events that must happen as often as in the clean run. (A
compensation is counted by its producer's runs, as every step is: the
``compensation_started`` event is written by each attempt that starts
compensating, so a take-over mid-compensation shows two, by design.)"""


def outcomes(hashes: Any) -> dict[str, str]:
    """The journaled step, call and child outcomes; a failure's epoch (which a
    take-over raises) left out."""
    found: dict[str, str] = {}
    for name, value in hashes.journal.items():
        if name.startswith("v:"):
            found[name] = value if value.startswith("o") else value[:1] + value.split("|", 1)[-1]
    return found


def view(execution: Execution) -> dict[str, Any]:
    """What a run settled as: status, result, outcomes, its children's, the events counted once."""
    env, run_id = execution.env, execution.run_id
    envelope = env.get(run_id)
    events = env.client.get_workflow_run_history(run_id, limit=500).events
    children = {
        child.key: (child.status, env.get(child.run_id).result, outcomes(env.hashes(child.run_id)))
        for child in env.detail(run_id).children
    }
    return {
        "status": envelope.status,
        "result": envelope.result,
        "outcomes": outcomes(env.hashes(run_id)),
        "children": children,
        **{kind: sum(1 for e in events if e.kind == kind) for kind in COUNTED_ONCE},
    }


def compare(clean: Execution, crashed: Execution, racing: frozenset[str] = frozenset()) -> list[str]:
    """What differs from the clean run, as problems ("duplicate ..." for an
    event seen more often than in the clean run); ``racing``: outcomes that
    may or may not be journaled."""
    want, got = view(clean), view(crashed)
    for seen in (want, got):
        seen["outcomes"] = {k: v for k, v in seen["outcomes"].items() if k not in racing}
    problems = []
    for what in want:
        if want[what] == got[what]:
            continue
        prefix = "duplicate " if what in COUNTED_ONCE and got[what] > want[what] else ""
        problems.append(f"{prefix}{what}: {got[what]!r:.300} (clean: {want[what]!r:.300})")
    return problems

