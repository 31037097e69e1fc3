"""Every combination of the production mechanisms runs a run the same way.

In-place answers, kept bodies, home queues, the answer's script taking the
pass and fan-outs run in the pass exist for what they save
(``benchmarks/NOTES.md``); none may change what a run does. Each
combination of the switches (``Mechanisms``), on one worker process and on
two, runs the same representative runs in the in-process fleet — steps in
a row, parallels of 8 and 16, calls in a row, branches that call, an agent
turn, a signal wait — and must give the same results and the same history
in the journal as every branch, answer and wake sent as a message of its
own (``Mechanisms.MESSAGES``). And each mechanism must have run exactly
where it applies: a switch that is on but did nothing fails, as does one
that is off and ran.

Where each decision is taken is tested where it is made
(``test_wake_route.py`` is the table of ``route``); this is what the
decisions add up to.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from celery_durable import AgentRequest, FunctionRunner, WorkflowContext, workflow
from celery_durable.tasks.in_place import consumes, consuming
from celery_durable.testing import Mechanisms, WorkflowTestEnvironment

STEPS = 5
CALLS = 5


@workflow(name="steps", description="Steps in a row", phases=[])
def steps(ctx: WorkflowContext) -> Any:
    total = 0
    for i in range(STEPS):
        total += ctx.step(f"s{i}", lambda i=i: i * i)
    return total


def _parallel(width: int) -> Callable[[WorkflowContext], Any]:
    def body(ctx: WorkflowContext) -> Any:
        first = ctx.step("before", lambda: width)
        squares = ctx.parallel([lambda i=i: ctx.step(f"b{i}", lambda: i * i) for i in range(width)])
        return [first, squares, ctx.step("after", lambda: sum(squares))]

    return body


parallel_8 = workflow(name="parallel-8", description="A parallel of 8", phases=[])(_parallel(8))
parallel_16 = workflow(name="parallel-16", description="A parallel of 16", phases=[])(_parallel(16))


def double(n: int) -> int:
    return 2 * n


@workflow(name="calls", description="Calls in a row", phases=[])
def calls(ctx: WorkflowContext) -> Any:
    return [ctx.call(f"c{i}", "fleet.double", args=(i,)) for i in range(CALLS)]


@workflow(name="branch-calls", description="Branches that call", phases=[])
def branch_calls(ctx: WorkflowContext) -> Any:
    def branch(i: int) -> Any:
        return ctx.step(f"pre{i}", lambda: i) + ctx.call(f"bc{i}", "fleet.double", args=(i,))

    return ctx.parallel([lambda i=i: branch(i) for i in range(3)])


@workflow(name="agent", description="An agent turn", phases=[])
def agent(ctx: WorkflowContext) -> Any:
    return [ctx.step("ask", lambda: "q"), ctx.agent("Answer it", label="answerer")]


@workflow(name="signal", description="A signal wait", phases=[])
def signal(ctx: WorkflowContext) -> Any:
    before = ctx.step("before", lambda: 1)
    return [before, ctx.wait_for_signal("go").payload, ctx.call("after", "fleet.double", args=(before,))]


WORKFLOWS = [steps, parallel_8, parallel_16, calls, branch_calls, agent, signal]
FANOUT_WIDTHS = {"parallel-8": 8, "parallel-16": 16}

BOOKKEEPING = ("d:", "s:", "wk:", "wt:", "wf:")
"""Journal fields that say how the work was delivered, which is what the
mechanisms change — the token of the execution that dispatched a fan-out
(``d:``), the branch messages it sent (``s:``), the ids of the wakes a
call's answer sent (``wk:``) — and when a wait began and ended (``wt:``,
``wf:``: the clock's readings, in ms)."""


def answer(request: AgentRequest) -> Any:
    return {"answered": request.prompt}


@dataclass
class Outcome:
    result: Any
    history: dict[str, str]
    trace: dict[str, int]
    """What the mechanisms did for this run (``WorkflowTestEnvironment.trace``, its part)."""


def run_all(mechanisms: Mechanisms) -> dict[str, Outcome]:
    """Each workflow run to its end in one environment with ``mechanisms``."""
    env = WorkflowTestEnvironment(
        WORKFLOWS,
        tasks={"fleet.double": double},
        agent_runner=FunctionRunner(default=answer),
        mechanisms=mechanisms,
    )
    outcomes: dict[str, Outcome] = {}
    for definition in WORKFLOWS:
        before = env.trace()
        if definition is signal:
            run_id = env.start(definition)
            assert env.get(run_id).snapshot["waiting_for"]["name"] == "go"
            envelope = env.signal(run_id, "go", {"ok": True})
        else:
            envelope = env.run(definition)
        assert envelope.status == "completed", (definition.name, envelope.error)
        after = env.trace()
        journal = env.stored(envelope.run_id).journal
        outcomes[definition.name] = Outcome(
            envelope.result,
            {k: v for k, v in journal.items() if not k.startswith(BOOKKEEPING)},
            {k: after[k] - before[k] for k in after},
        )
    return outcomes


@pytest.fixture(scope="module")
def reference() -> dict[str, Outcome]:
    return run_all(Mechanisms.MESSAGES)


SWITCHES = [
    Mechanisms(in_place=p, kept=k, home=h, inline=i, processes=n)
    for p, k, h, i in itertools.product((True, False), repeat=4)
    for n in (1, 2)
]


def _total(outcomes: dict[str, Outcome], counter: str) -> int:
    return sum(outcome.trace[counter] for outcome in outcomes.values())


@pytest.mark.parametrize("mechanisms", SWITCHES, ids=lambda m: _name(m))
def test_every_combination_gives_the_same_runs_and_runs_what_it_switches_on(
    mechanisms: Mechanisms, reference: dict[str, Outcome]
) -> None:
    outcomes = run_all(mechanisms)
    for name, expected in reference.items():
        assert outcomes[name].result == expected.result, name
        assert outcomes[name].history == expected.history, name

    calls_made = _total(outcomes, "call")
    assert calls_made == _total(reference, "call") > 0
    # In place: every answer journaled where its task ran; off, each one a message.
    answers_in_place = _total(outcomes, "answers_in_place")
    assert answers_in_place == (calls_made if mechanisms.in_place else 0)
    assert _total(outcomes, "answer") == (0 if mechanisms.in_place else calls_made)

    # Kept bodies: the calls in a row go on from the kept body, wherever
    # the answers land (one process), or when their wakes go home. On two
    # processes without homes an answer may land, in turn, always in the
    # process that does not keep the current body: the cost home queues save.
    resumed = outcomes["calls"].trace["resumed"]
    if mechanisms.processes == 1 or mechanisms.home or not mechanisms.kept:
        assert (resumed > 0) is mechanisms.kept, resumed
    # Taken in the answer's script: where the answer is journaled in the
    # process that keeps the body, which in place it is (each call on one
    # process; every other call on two).
    taken = _total(outcomes, "taken")
    assert (taken > 0) is (mechanisms.in_place and mechanisms.kept), taken
    if not mechanisms.kept:
        assert _total(outcomes, "resumed") == _total(outcomes, "kept_fanouts") == 0

    # Home queues: an answer that lands elsewhere than the body (two
    # processes), or that is not run where it lands (not in place), sends
    # the body's wake home. On one process in place, every answer lands at
    # home and runs there: the home has nothing to carry.
    homes = _total(outcomes, "home_deliveries")
    home_applies = mechanisms.home and mechanisms.kept and (mechanisms.processes > 1 or not mechanisms.in_place)
    assert (homes > 0) is home_applies, homes
    assert _total(outcomes, "home_fallbacks") == 0  # every home wake started at home

    # Inline fan-out: branches run in the pass that dispatched them (a branch
    # handed on once another runs slow is a message, so at least the first ran inline).
    for name, width in FANOUT_WIDTHS.items():
        branch_messages = outcomes[name].trace["branch"]
        assert branch_messages < width if mechanisms.inline else branch_messages == width, (name, branch_messages)


def test_the_sweep_covers_every_switch_on_and_off() -> None:
    for switch in ("in_place", "kept", "home", "inline"):
        assert {getattr(m, switch) for m in SWITCHES} == {True, False}, switch
    assert {m.processes for m in SWITCHES} == {1, 2}
    assert len(set(SWITCHES)) == 2**4 * 2


def test_a_home_wake_not_started_in_time_goes_to_the_coordinator_queue() -> None:
    """The home's fallback (``HomeWakes``), on the environment's clock: a
    wake sent home whose worker never takes it is sent again to the
    coordinator queue once 2 s have passed, and the run goes on by a replay."""
    def double_then_busy(n: int) -> int:
        # The second call runs on the second worker (each takes a call in
        # turn) while the first keeps the body: from now on the first takes
        # no message, and the body's wake waits in its home queue.
        if n == 1:
            env.busy(1)
        return double(n)

    env = WorkflowTestEnvironment(
        [calls], tasks={"fleet.double": double_then_busy}, mechanisms=Mechanisms(processes=2)
    )
    run_id = env.start(calls)
    assert env.get(run_id).status == "running"
    assert env.trace()["home_fallbacks"] == 0
    env.clock.advance(timedelta(seconds=3))
    envelope = env.wait(run_id)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [double(i) for i in range(CALLS)]
    assert env.trace()["home_fallbacks"] == 1


def _name(m: Mechanisms) -> str:
    on = [s for s in ("in_place", "kept", "home", "inline") if getattr(m, s)]
    return f"{'+'.join(on) or 'none'}-p{m.processes}"


def test_a_thread_consumes_what_its_worker_consumes_and_no_other_thread_does() -> None:
    """The one seam ``in_place.consumes`` answers from: outside any task
    nothing; inside the fleet's delivery its worker's queues, in that thread
    only (a kept body's thread, or the sweep's, consumes nothing)."""
    env = WorkflowTestEnvironment([steps])
    engine, queue = env.engine, env.settings.coordinator_queue
    assert not consumes(engine, queue)
    seen: list[bool] = []
    with consuming({queue}):
        assert consumes(engine, queue) and not consumes(engine, env.settings.agents_queue + ".other")
        other = threading.Thread(target=lambda: seen.append(consumes(engine, queue)))
        other.start()
        other.join()
        with consuming(set()):
            assert not consumes(engine, queue)
        assert consumes(engine, queue)
    assert seen == [False]
    assert not consumes(engine, queue)
