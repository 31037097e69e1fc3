"""Held-back commits: a step's journal write travels with the next call
(``commit_begin``), one script per straight-line step. In a branch task a
branch's last step travels with the branch's outcome (``complete_held``);
there several executions may journal one key, and the one that loses the
first write runs the branch again."""

from __future__ import annotations

from typing import Any

from celery_durable import WorkflowContext, workflow
from celery_durable.broker import schema
from celery_durable.broker.journal import PendingCommit
from celery_durable.broker.schema import Identity
from tests.unit.harness import Driver


def test_a_main_body_step_is_journaled_together_with_the_next_call() -> None:
    seen: dict[str, Any] = {}

    @workflow(name="straight", description="Two steps in a row", phases=[])
    def straight(ctx: WorkflowContext) -> Any:
        ctx.step("a", lambda: 1)
        seen["between"] = driver.state.journal.get("v:a")

        def b() -> int:
            seen["inside b"] = (driver.state.journal.get("v:a"), "b" in driver.state.running)
            return 2

        ctx.step("b", b)
        seen["after b"] = driver.state.journal.get("v:b")
        return None

    driver = Driver.of(straight)
    assert driver.main() is not None
    journal = driver.state.journal
    assert seen == {"between": None, "inside b": ("o1", True), "after b": None}
    assert journal["v:b"] == "o2"  # the pass's end sends the last one before the run settles
    assert driver.record().steps_done == 2


def test_a_branch_step_is_journaled_with_its_next_call_and_the_last_with_the_outcome() -> None:
    seen: list[Any] = []

    @workflow(name="branch-writes", description="A branch of two steps", phases=[])
    def branch_writes(ctx: WorkflowContext) -> Any:
        def branch() -> Any:
            ctx.step("a", lambda: 1)
            seen.append(driver.state.journal.get("v:a"))

            def b() -> int:
                seen.append((driver.state.journal.get("v:a"), "b" in driver.state.running))
                return 2

            return ctx.step("b", b)

        return ctx.parallel([branch])

    driver = Driver.of(branch_writes)
    driver.main()
    assert driver.branch("m:0", 0) is True
    journal = driver.state.journal
    assert seen == [None, ("o1", True)]
    assert (journal["v:b"], journal["r:m:0:0"]) == ("o2", "o2"), "the last step went with the outcome"
    assert driver.record().steps_done == 2


def test_a_held_back_step_that_lost_a_first_write_race_ends_the_pass_for_a_rerun() -> None:
    def mine() -> str:
        # Another execution journals the same key first, while this producer runs.
        row = schema.StepRow.running(1, 1).settled(schema.value_outcome("theirs"), 2).encode()
        commit = PendingCommit(0, Identity.step("shared"), "v:shared", 'o"theirs"', "shared", row)
        driver.journal().record("m.9.0", commit)
        return "mine"

    @workflow(name="race", description="Loses a first-write race", phases=[])
    def race(ctx: WorkflowContext) -> Any:
        value = ctx.step("shared", mine)
        return [value, ctx.uuid4().version]

    driver = Driver.of(race)
    assert driver.main() is None
    assert driver.last is not None and driver.last.rerun  # the coordinator runs the next pass at once
    assert driver.journal().read_sequence("m").live_entries() == [("s|shared", 'o"theirs"')]
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == '["theirs",4]'


def test_now_and_uuid4_flush_the_held_back_step_and_replay_their_values() -> None:
    @workflow(name="values", description="Reads the clock and a uuid between steps", phases=[])
    def values(ctx: WorkflowContext) -> Any:
        ctx.step("a", lambda: 1)
        stamp, ident = ctx.now(), ctx.uuid4()
        ctx.parallel([lambda: 0])
        return [stamp.isoformat(), str(ident)]

    driver = Driver.of(values)
    driver.main()
    history = driver.journal().read_sequence("m").live_entries()
    assert [identity for identity, _ in history] == ["s|a", "t|", "u|", "p|1"]
    driver.deliver_branches()
    settlement = driver.main()
    assert settlement is not None
    assert settlement.result_json == f'["{history[1][1]}","{history[2][1]}"]'
