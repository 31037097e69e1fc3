"""SPEC §5c against §4: a failure is run again by a later attempt, unless that
attempt began compensating after it. The attempt here dies right after its
first compensation is journaled; the next replays to there and must resume
the compensations, not run the failure again (which passes now)."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import pytest

from celery_durable import StepFailed, WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment
from celery_durable.workflows.cursor import Cursor
from tests.support.producers import calls, did, fails_first


@workflow(name="saga-fanout", description="A saga around a fan-out whose branch fails", phases=[])
def saga_fanout(ctx: WorkflowContext) -> Any:
    try:
        with ctx.saga() as saga:
            ctx.step("a0", lambda: did("a0"))
            saga.compensate("undo-a0", lambda: did("undo-a0"))
            saga.compensate("undo-a1", lambda: did("undo-a1"))
            ctx.parallel(
                [lambda: ctx.step("a", lambda: did("a")), lambda: ctx.step("b", lambda: fails_first("b"))],
                errors="raise",
            )
            return "booked"
    except StepFailed as failed:
        return f"undone after {failed.key}"


def test_a_fanout_failure_a_saga_began_to_undo_stands_in_the_next_attempt() -> None:
    calls.clear()
    env = WorkflowTestEnvironment([saga_fanout])
    env.crash_after("undo-a1")
    crashed = env.run(saga_fanout)
    assert (crashed.status, crashed.attempt) == ("running", 1)
    assert calls == Counter({"a0": 1, "a": 1, "b": 1, "undo-a1": 1})
    resumed = env.resume(crashed.run_id)
    assert (resumed.status, resumed.attempt, resumed.result) == ("completed", 2, "undone after b")
    assert calls == Counter({"a0": 1, "a": 1, "b": 1, "undo-a1": 1, "undo-a0": 1}), "b is not run again"


@workflow(name="saga-caught", description="A saga whose block catches a failure, then fails", phases=[])
def saga_caught(ctx: WorkflowContext) -> Any:
    try:
        with ctx.saga() as saga:
            ctx.step("a0", lambda: did("a0"))
            saga.compensate("undo-a0", lambda: did("undo-a0"))
            if ctx.args["fanout"]:
                ctx.parallel([lambda: ctx.step("a", lambda: did("a")), lambda: ctx.step("b", lambda: did_fail("b"))])
            else:
                with contextlib.suppress(StepFailed):
                    ctx.step("b", lambda: did_fail("b"))
            saga.compensate("undo-a1", lambda: did("undo-a1"))
            ctx.step("c", lambda: fails_first("c"))
            return "booked"
    except StepFailed as failed:
        return f"undone after {failed.key}"


def did_fail(key: str) -> str:
    did(key)
    raise RuntimeError(f"{key} always fails")


@pytest.mark.parametrize("fanout", [False, True], ids=["caught-step", "fanout-slot"])
def test_a_failure_caught_before_a_journaled_compensation_is_not_run_again(fanout: bool) -> None:
    """A failure the block caught (a step, a failed slot of an errors='none'
    fan-out) before the saga registered the undo it began: run again, it cut
    the sequence there, erasing the later failure and its journaled undo, and
    the run completed with undo-a1 run."""
    calls.clear()
    env = WorkflowTestEnvironment([saga_caught])
    env.crash_after("undo-a1")
    crashed = env.run(saga_caught, args={"fanout": fanout})
    assert (crashed.status, crashed.attempt) == ("running", 1)
    ran = Counter({"a0": 1, "b": 1, "c": 1, "undo-a1": 1}) + (Counter({"a": 1}) if fanout else Counter())
    assert calls == ran
    resumed = env.resume(crashed.run_id)
    assert (resumed.status, resumed.attempt, resumed.result) == ("completed", 2, "undone after c")
    assert calls == ran + Counter({"undo-a0": 1}), "neither b nor c is run again"


def test_a_journal_that_names_no_compensation_reads_as_before() -> None:
    """Runs journaled before compensations were named (no ``u:<seq>``): a
    failure stands where a compensation its open sagas registered follows it."""
    history: list[tuple[str, str | None]] = [("s|b", None), ("s|undo", 'o"undo"')]
    unnamed = Cursor(seq="m", history=list(history), high_water=-1, writes=True)
    assert not unnamed.compensated_after()
    unnamed.undo.append("s|undo")
    assert unnamed.compensated_after()
    named = Cursor(seq="m", history=list(history), high_water=-1, writes=True, compensated=1)
    assert named.compensated_after()
    named.advance()
    assert not named.compensated_after(), "the compensation itself has none after it"


@workflow(name="saga-undos-in-branches", description="A saga whose branches try to register undos", phases=[])
def saga_undos_in_branches(ctx: WorkflowContext) -> Any:
    with ctx.saga() as saga:
        ctx.step("a", lambda: did("a"))
        saga.compensate("undo-a", lambda: did("undo-a"))

        def branch(j: int) -> Any:
            ctx.step(f"b{j}", lambda: did(f"b{j}"))
            saga.compensate(f"undo-b{j}", lambda: did(f"undo-b{j}"))
            return j

        ctx.parallel([lambda: branch(0), lambda: branch(1)], errors="return")
        ctx.step("boom", lambda: fails_first("boom"))
    return "booked"


def test_undos_registered_by_branches_with_the_blocks_saga_are_refused_in_process_too() -> None:
    """SPEC §5c: a saga undoes what its own sequence registered. Branches run
    inline here, as a fan-out that starts as one task does on a fleet: an undo
    they registered with the block's saga ran here, and was dropped by a pass
    that took the fan-out's results from the journal. Refused everywhere now;
    the block's own undo still runs once."""
    calls.clear()
    env = WorkflowTestEnvironment([saga_undos_in_branches])
    done = env.run(saga_undos_in_branches)
    assert done.status == "error"
    assert done.error == "StepFailed: step 'boom' raised RuntimeError: boom failed on run 1"
    assert {key: calls[key] for key in ("undo-a", "undo-b0", "undo-b1")} == {"undo-a": 1, "undo-b0": 0, "undo-b1": 0}
