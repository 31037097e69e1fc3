"""Progress records are positioned by (ops before, n-th since): every pass
logs them again, and the journal keeps each one once, across passes, branch
tasks delivered twice, and attempts."""

from __future__ import annotations

from typing import Any

from celery_durable import WorkflowContext, workflow
from celery_durable.broker.schema import position
from tests.unit.harness import Driver


def test_records_are_written_once_across_passes_and_attempts() -> None:
    flaky = {"fail": True}

    def check() -> bool:
        if flaky["fail"]:
            raise ValueError("not yet")
        return True

    @workflow(
        name="chatty",
        description="Logs around a fan-out and a step that fails once",
        phases=[{"title": "Gather"}, {"title": "Check"}],
    )
    def chatty(ctx: WorkflowContext) -> Any:
        ctx.phase("Gather")
        ctx.log("one")
        ctx.step("a", lambda: 1)
        ctx.log("two")
        ctx.parallel([lambda: ctx.log("in a branch")])
        ctx.phase("Check")
        ctx.log("three")
        ctx.step("check", check)
        ctx.log("four")
        return None

    driver = Driver.of(chatty)
    assert driver.settle().status == "error"
    flaky["fail"] = False
    driver.resume("Run resumed from error")
    assert driver.settle().status == "completed"
    assert driver.progress() == [
        ("system", "Attempt 1 started"),
        ("phase", "Gather"),
        ("log", "one"),
        ("log", "two"),
        ("log", "in a branch"),
        ("phase", "Check"),
        ("log", "three"),
        ("system", "Run failed: StepFailed: step 'check' raised ValueError: not yet"),
        ("system", "Run resumed from error (attempt 2)"),
        ("log", "four"),
        ("system", "Run completed"),
    ]
    # The main body's mark: "four", the first record after op 3 ("check").
    assert driver.journal().read_sequence("m").high_water == position(3, 0)
    record = driver.record()
    assert record.phase == "Check"
    assert set(record.phase_times) == {phase.phase_id for phase in chatty.phases}


def test_a_branch_task_delivered_twice_logs_once() -> None:
    @workflow(name="branch-logs", description="Each branch logs", phases=[])
    def branch_logs(ctx: WorkflowContext) -> Any:
        def branch(i: int) -> int:
            ctx.log(f"branch {i} starts")
            value: int = ctx.step(f"b{i}", lambda: i)
            ctx.log(f"branch {i} done")
            return value

        return ctx.parallel([lambda i=i: branch(i) for i in range(2)])

    driver = Driver.of(branch_logs)
    driver.main()
    sent = list(driver.branches)
    driver.deliver_branches()
    for call, index in sent:  # Celery redelivers both
        assert driver.branch(call, index) is False
    driver.main()
    logs = [message for kind, message in driver.progress() if kind == "log"]
    assert logs == ["branch 0 starts", "branch 0 done", "branch 1 starts", "branch 1 done"]
    assert driver.journal().read_sequence("m.0.1").high_water == position(1, 0)
