"""A replay that contradicts the journal stops the run, naming both calls."""

from __future__ import annotations

from typing import Any

from celery_durable import WorkflowContext, workflow
from celery_durable.broker.journal import PendingCommit
from celery_durable.broker.schema import Identity
from celery_durable.workflows.passes import main_pass
from tests.unit.harness import Driver

HINT = "Check that your workflow is deterministic"


def switching(name: str) -> tuple[dict[str, str], Any]:
    """A workflow whose first step key a test can change between passes, as
    code that reads a clock or a random number outside a step would."""
    choice = {"main": "a", "branch": "b1"}

    @workflow(name=name, description="Changes its mind between passes", phases=[])
    def flaky(ctx: WorkflowContext) -> Any:
        ctx.step(choice["main"], lambda: 1)

        def branch() -> Any:
            ctx.step(choice["branch"], lambda: 1)
            return ctx.agent("Check the branch", label="checker")

        return ctx.parallel([branch])

    return choice, flaky


def test_a_replay_that_asks_for_another_step_stops_the_run_naming_both() -> None:
    choice, flaky = switching("switch-main")
    driver = Driver.of(flaky)
    assert driver.main() is None  # step a journaled, the fan-out suspends the pass
    choice["main"] = "x"
    settlement = driver.main()
    assert settlement is not None
    assert (settlement.status, settlement.reason, settlement.can_resume) == ("error", "nondeterminism", False)
    assert "replayed differently in the main body at call 0: expected a, got x." in settlement.error
    assert HINT in settlement.error
    assert driver.record().error == settlement.error


def test_a_branch_that_replays_differently_names_its_sequence_and_stops_the_run() -> None:
    choice, flaky = switching("switch-branch")
    driver = Driver.of(flaky)
    driver.main()
    assert driver.deliver_branches() == [False]  # the branch waits for its agent turn
    driver.finish_turns("checked")  # ... which wakes the branch (owner m:1/0) again
    choice["branch"] = "b2"
    assert driver.branch("m:1", 0) is True  # a fatal outcome wakes the coordinator at once
    settlement = driver.main()
    assert settlement is not None and settlement.reason == "nondeterminism"
    assert "in branch m.1.0 at call 0: expected b1, got b2" in settlement.error
    assert HINT in settlement.error


def test_a_fanout_of_another_width_is_a_different_call() -> None:
    width = {"n": 2}

    @workflow(name="widths", description="Fans out to a width it reads outside a step", phases=[])
    def widths(ctx: WorkflowContext) -> Any:
        return ctx.parallel([lambda: 1] * width["n"])

    driver = Driver.of(widths)
    driver.main()
    width["n"] = 3
    settlement = driver.main()
    assert settlement is not None
    assert "expected parallel(2), got parallel(3)" in settlement.error


def test_a_conflict_the_journal_reports_is_nondeterminism_never_a_mixed_history() -> None:
    """Another execution wrote op 0 between this pass's read and its write:
    the journal answers Conflict, and replay stops rather than carry on."""

    @workflow(name="raced", description="Its first op is taken while it runs", phases=[])
    def raced(ctx: WorkflowContext) -> Any:
        def meanwhile() -> int:
            driver.journal().record("m", PendingCommit(0, Identity.step("x")))
            return 1

        ctx.step("a", meanwhile)
        return ctx.now().isoformat()  # the held-back write of "a" goes out here

    driver = Driver.of(raced)
    driver.activate("lock")
    settlement = main_pass(driver.replay())
    assert settlement is not None and settlement.reason == "nondeterminism"
    assert "at call 0: expected x, got a" in settlement.error
    assert driver.journal().read_sequence("m").live_entries() == [("s|x", None)]


def test_calls_past_the_end_of_the_history_are_new_work() -> None:
    more = {"steps": 1}

    @workflow(name="growing", description="Adds calls after its journaled history", phases=[])
    def growing(ctx: WorkflowContext) -> Any:
        ctx.parallel([lambda: 0])
        return [ctx.step(f"s{i}", lambda i=i: i) for i in range(more["steps"])]

    driver = Driver.of(growing)
    driver.main()
    driver.deliver_branches()
    more["steps"] = 3
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == "[0,1,2]"
