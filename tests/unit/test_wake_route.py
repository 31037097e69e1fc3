"""Where a wake runs (``tasks/wake_route.py``): every row of the decision.

``route`` is a pure function: the table below is the decision written out,
one row per rule and per fact that changes its answer, and the sweep after
it checks every combination of the facts against what must always hold.
The integration tests (``tests/test_calls_in_place.py``,
``tests/test_home_queue.py``, ``tests/test_calls.py``) check that the task
code gathers those facts and carries the verdicts out.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from celery_durable.tasks.wake_route import Home, Owner, Verdict, WakeFacts, Where, answer_here, route

MAIN, BRANCH = Owner.MAIN, Owner.BRANCH
NONE, HERE_, ELSEWHERE = Home.NONE, Home.HERE, Home.ELSEWHERE
MAY_RUN: dict[str, Any] = {"consumes": True, "knows_workflow": True}
"""A thread that may run the wake here: it consumes the queue, knows the workflow."""

TAKE, HERE, HOME, QUEUE = Where.TAKE, Where.HERE, Where.HOME, Where.QUEUE

ROWS: list[tuple[str, WakeFacts, Verdict]] = [
    # -- 1. a main body's wake waits for this process's pass, wherever it goes --
    ("main, the pass here, runs here after it", WakeFacts(MAIN, **MAY_RUN, pass_here=True), Verdict(HERE, True)),
    (
        "main, the pass here, sent home after it",
        WakeFacts(MAIN, ELSEWHERE, **MAY_RUN, pass_here=True),
        Verdict(HOME, True),
    ),
    ("main, the pass here, a queue after it", WakeFacts(MAIN, pass_here=True), Verdict(QUEUE, True)),
    ("a branch never waits for a pass", WakeFacts(BRANCH, **MAY_RUN, pass_here=True), Verdict(HERE)),
    # -- 2. shutting down: nothing starts here, nothing goes to this process's home --
    ("stopping: main to its queue", WakeFacts(MAIN, **MAY_RUN, shutting_down=True), Verdict(QUEUE)),
    (
        "stopping: main kept here, not taken",
        WakeFacts(MAIN, **MAY_RUN, kept=True, takeable=True, shutting_down=True),
        Verdict(QUEUE),
    ),
    ("stopping: not to this home", WakeFacts(MAIN, HERE_, **MAY_RUN, shutting_down=True), Verdict(QUEUE)),
    ("stopping: to another's home", WakeFacts(MAIN, ELSEWHERE, shutting_down=True), Verdict(HOME)),
    ("stopping: main waits", WakeFacts(MAIN, **MAY_RUN, pass_here=True, shutting_down=True), Verdict(QUEUE, True)),
    ("stopping: a branch to its queue", WakeFacts(BRANCH, **MAY_RUN, shutting_down=True), Verdict(QUEUE)),
    # -- 3. a branch: here when it may run here, else its queue --
    ("branch here", WakeFacts(BRANCH, **MAY_RUN), Verdict(HERE)),
    ("branch: a home is the main body's", WakeFacts(BRANCH, ELSEWHERE, **MAY_RUN), Verdict(HERE)),
    ("branch: queue not consumed", WakeFacts(BRANCH, knows_workflow=True), Verdict(QUEUE)),
    ("branch: workflow unknown here", WakeFacts(BRANCH, consumes=True), Verdict(QUEUE)),
    ("branch: a user's acks_late task", WakeFacts(BRANCH, **MAY_RUN, user_task_binds=True), Verdict(QUEUE)),
    ("branch: another owner runs here", WakeFacts(BRANCH, **MAY_RUN, slot_taken=True), Verdict(QUEUE)),
    # -- 4. main kept in another process: its home --
    ("main kept elsewhere", WakeFacts(MAIN, ELSEWHERE, **MAY_RUN), Verdict(HOME)),
    ("kept elsewhere, not taken", WakeFacts(MAIN, ELSEWHERE, **MAY_RUN, kept=True, takeable=True), Verdict(HOME)),
    ("main kept elsewhere, queue not consumed", WakeFacts(MAIN, ELSEWHERE), Verdict(HOME)),
    # -- 5. main that may run here: taken in the answer's script when kept here --
    ("main, no home, here", WakeFacts(MAIN, **MAY_RUN), Verdict(HERE)),
    ("main, home here, here", WakeFacts(MAIN, HERE_, **MAY_RUN), Verdict(HERE)),
    ("main kept here: the script takes it", WakeFacts(MAIN, **MAY_RUN, kept=True, takeable=True), Verdict(TAKE)),
    (
        "main kept here, home here: taken",
        WakeFacts(MAIN, HERE_, **MAY_RUN, kept=True, takeable=True),
        Verdict(TAKE),
    ),
    (
        "main kept here, the pass still here: taken softly",
        WakeFacts(MAIN, **MAY_RUN, kept=True, takeable=True, pass_here=True),
        Verdict(TAKE, True),
    ),
    ("main kept, after the script: here", WakeFacts(MAIN, **MAY_RUN, kept=True), Verdict(HERE)),
    ("main not kept: nothing to take", WakeFacts(MAIN, **MAY_RUN, takeable=True), Verdict(HERE)),
    # -- 6. main that may not run here: this process's home, else the coordinator queue --
    ("main, acks_late task, home here", WakeFacts(MAIN, HERE_, **MAY_RUN, user_task_binds=True), Verdict(HOME)),
    ("main, acks_late task, no home", WakeFacts(MAIN, **MAY_RUN, user_task_binds=True), Verdict(QUEUE)),
    (
        "main kept here but bound: not taken, home",
        WakeFacts(MAIN, HERE_, **MAY_RUN, user_task_binds=True, kept=True, takeable=True),
        Verdict(HOME),
    ),
    ("main, queue not consumed, home here", WakeFacts(MAIN, HERE_, knows_workflow=True), Verdict(HOME)),
    ("main, queue not consumed (a GPU pool)", WakeFacts(MAIN, knows_workflow=True), Verdict(QUEUE)),
    ("main, workflow unknown here", WakeFacts(MAIN, consumes=True), Verdict(QUEUE)),
    ("main, a branch runs here already", WakeFacts(MAIN, **MAY_RUN, slot_taken=True), Verdict(QUEUE)),
    ("main, a branch runs here, home here", WakeFacts(MAIN, HERE_, **MAY_RUN, slot_taken=True), Verdict(HOME)),
]


@pytest.mark.parametrize(("facts", "verdict"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_each_row_of_the_decision(facts: WakeFacts, verdict: Verdict) -> None:
    assert route(facts) == verdict


def _every_combination() -> list[WakeFacts]:
    flags = [f.name for f in dataclasses.fields(WakeFacts) if f.type in ("bool", bool)]
    return [
        WakeFacts(owner, home, **dict(zip(flags, values, strict=True)))
        for owner, home in itertools.product(Owner, Home)
        for values in itertools.product([False, True], repeat=len(flags))
    ]


def test_every_combination_keeps_what_must_always_hold() -> None:
    """Over all 1,536 combinations of the facts: what the table's rows say
    holds everywhere, so no combination falls between them."""
    combinations = _every_combination()
    assert len(combinations) == 2 * 3 * 2**8
    for facts in combinations:
        verdict = route(facts)
        may_run = facts.consumes and facts.knows_workflow and not facts.user_task_binds and not facts.slot_taken
        if verdict.where in (HERE, TAKE):
            assert may_run and not facts.shutting_down, facts
        if verdict.where is TAKE:
            assert facts.owner is MAIN and facts.kept and facts.takeable and facts.home is not ELSEWHERE, facts
        if verdict.where is HOME:
            assert facts.owner is MAIN and facts.home is not NONE, facts
            assert not (facts.shutting_down and facts.home is HERE_), "a stopping worker's home is not consumed"
        if facts.owner is MAIN and facts.home is ELSEWHERE:
            assert verdict.where is HOME, "the body is kept in another process"
        if facts.owner is BRANCH:
            assert verdict.where in (HERE, QUEUE), facts
        assert verdict.wait_let_go == (facts.owner is MAIN and facts.pass_here), facts
        if may_run and not facts.shutting_down and not (facts.owner is MAIN and facts.home is ELSEWHERE):
            assert verdict.where in (HERE, TAKE), "a wake that may run here does: no broker round trip"


def test_a_branchs_route_depends_on_nothing_of_the_main_body() -> None:
    for facts in _every_combination():
        if facts.owner is BRANCH:
            plain = dataclasses.replace(facts, home=NONE, kept=False, pass_here=False, takeable=False)
            assert route(facts) == route(plain), facts


@pytest.mark.parametrize(
    ("link_of_running_task", "consumes_coordinator", "here"),
    [
        (True, True, True),  # the link would come back to this worker: answered here
        (True, False, False),  # a GPU pool: the link's message goes to a worker that has the queue
        (False, True, False),  # not the link of the task this thread ran (a user's own apply_async)
        (False, False, False),
    ],
)
def test_where_a_calls_answer_is_journaled(link_of_running_task: bool, consumes_coordinator: bool, here: bool) -> None:
    assert answer_here(link_of_running_task, consumes_coordinator) is here
