"""The journal's wrappers take their methods from the ``Journal`` protocol,
and an execution's stop state changes only through ``Replay``'s methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_durable import WorkflowContext, workflow
from celery_durable.broker.journal import JOURNAL_CALLS, BeginCall, GuardedJournal
from celery_durable.errors import StaleAttemptError
from celery_durable.testing.crash import CrashingJournal, CrashPlan, CrashPoint, SimulatedCrash
from celery_durable.workflows.passes import main_pass
from celery_durable.workflows.stopping import Mode
from tests.unit.harness import Driver


@workflow(name="two-steps", description="Two steps", phases=[])
def two_steps(ctx: WorkflowContext) -> Any:
    return [ctx.step("a", lambda: 1), ctx.step("b", lambda: 2)]


def test_every_method_of_the_protocol_goes_through_around_and_no_other_name_passes() -> None:
    driver = Driver.of(two_steps)
    driver.settle()
    inner = driver.journal()
    seen: list[str] = []

    def around(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        seen.append(method.__name__)
        return method(*args, **kwargs)

    journal = GuardedJournal(inner, around)
    assert journal.read_sequence("m").live_entries() == inner.read_sequence("m").live_entries()
    assert journal.branch_outcomes("m:0", 1, only=[0]) == [None]
    assert (journal.run_id, journal.epoch) == (inner.run_id, inner.epoch)  # properties, not calls
    assert seen == ["read_sequence", "branch_outcomes"]
    assert {"begin", "commit_begin", "complete_begin", "record", "dispatch", "wait", "call"} <= JOURNAL_CALLS
    assert all(callable(getattr(journal, name)) for name in JOURNAL_CALLS)
    with pytest.raises(AttributeError, match="Journal declares no such method"):
        journal._client  # noqa: B018  the store's own attribute: not the protocol's, so not passed through


def test_a_crashed_attempt_journals_nothing_more_through_any_method_of_the_protocol() -> None:
    driver = Driver.of(two_steps)
    plan = CrashPlan()
    plan.arm(CrashPoint("a", "before"))
    journal = CrashingJournal(driver.journal(), plan)
    with pytest.raises(SimulatedCrash, match="before step 'a'"):
        journal.begin("m", BeginCall(step_key="a"))
    assert "a" in driver.state.running, "the crash point fires once the step shows running"
    for call in (lambda: journal.read_sequence("m"), lambda: journal.mark_sent("m:0"), journal.now_ms):
        with pytest.raises(SimulatedCrash, match="already died"):
            call()
    plan.revive()
    assert journal.read_sequence("m").live_entries() == []


def test_an_attempt_that_lost_its_authority_stops_at_its_next_call() -> None:
    """The heartbeat (or a settlement written without the pass) tells the
    execution; the call after that raises, whatever user code caught."""

    @workflow(name="losing", description="Loses its authority inside its first step", phases=[])
    def losing(ctx: WorkflowContext) -> Any:
        def first() -> int:
            replay.lose_authority()
            return 1

        try:
            ctx.step("a", first)
            ctx.step("b", lambda: 2)
        except StaleAttemptError:
            ran.append("caught")
        return ctx.step("c", lambda: 3)

    ran: list[str] = []
    driver = Driver.of(losing)
    driver.activate("lock")
    replay = driver.replay()
    assert replay.mode is Mode.PASS and not replay.cancel_event.is_set()
    with pytest.raises(StaleAttemptError, match="lost execution authority"):
        main_pass(replay)
    assert ran == ["caught"] and replay.cancel_event.is_set()
    assert isinstance(replay.broken, StaleAttemptError)
    assert driver.state.journal.get("v:a") is None, "the held-back step of a lost attempt is never written"
