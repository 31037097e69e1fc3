"""What may be journaled: JSON values only, checked before anything is written."""

from __future__ import annotations

import enum
from collections import Counter
from typing import Any

import pytest

from celery_durable import JSON_NULL, StepFailed, WorkflowContext, workflow
from celery_durable.broker import schema
from tests.unit.harness import Driver


def test_a_step_result_that_is_not_json_fails_the_step_with_the_spec_message() -> None:
    @workflow(name="not-json", description="A step returns a set", phases=[])
    def not_json(ctx: WorkflowContext) -> Any:
        try:
            ctx.step("tags", lambda: {"a", "b"})
        except StepFailed as exc:
            return [str(exc), exc.key, exc.error_type]
        return None

    driver = Driver.of(not_json)
    assert driver.record().status == "pending"
    settlement = driver.main()
    assert settlement is not None
    assert settlement.result_json == '["Step result must be a JSON value: tags","tags","TypeError"]'
    raw = driver.state.journal["v:tags"]
    assert schema.decode_outcome(raw).kind == "e"  # journaled as the failure, never as a value
    row = schema.StepRow.parse("tags", driver.store.step_rows(driver.run_id)["tags"])
    assert (row.status, row.error) == ("failed", "TypeError: Step result must be a JSON value: tags")


def test_an_uncaught_non_json_step_result_stops_the_run_naming_the_step() -> None:
    @workflow(name="uncaught", description="A step returns bytes", phases=[])
    def uncaught(ctx: WorkflowContext) -> Any:
        return ctx.step("blob", lambda: b"\x00")

    settlement = Driver.of(uncaught).main()
    assert settlement is not None and settlement.reason == "exception"
    assert settlement.error == "StepFailed: step 'blob' raised TypeError: Step result must be a JSON value: blob"


def test_a_volatile_step_is_checked_and_runs_every_pass_without_a_journal_entry() -> None:
    calls: Counter[str] = Counter()

    def poll() -> Any:
        calls["poll"] += 1
        return calls["poll"]

    @workflow(name="volatile", description="Polls on every pass", phases=[])
    def volatile(ctx: WorkflowContext) -> Any:
        seen = ctx.step("poll", poll, volatile=True)
        ctx.parallel([lambda: 0])
        with pytest.raises(StepFailed, match=r"^Step result must be a JSON value: bad$"):
            ctx.step("bad", lambda: object(), volatile=True)
        return seen

    driver = Driver.of(volatile)
    # Every replay runs it: the first pass, the branch task's replay, the pass that returned.
    assert driver.settle().result_json == "3"
    assert "v:poll" not in driver.state.journal and "v:bad" not in driver.state.journal


def test_a_step_returns_its_journaled_json_on_the_first_run_too() -> None:
    class Colour(str, enum.Enum):  # noqa: UP042 - not StrEnum: this one formats as "Colour.RED"
        RED = "red"

    @workflow(name="decoded", description="Returns a str enum", phases=[])
    def decoded(ctx: WorkflowContext) -> Any:
        value = ctx.step("v", lambda: {"colour": Colour.RED})
        return [type(value["colour"]).__name__, f"{value['colour']}"]

    settlement = Driver.of(decoded).main()
    assert settlement is not None and settlement.result_json == '["str","red"]'


@pytest.mark.parametrize(
    ("returned", "has_result", "result_json"),
    [(None, False, None), (JSON_NULL, True, "null"), ({"ok": [1, 2.5]}, True, '{"ok":[1,2.5]}')],
)
def test_none_is_no_result_and_json_null_is_a_null_result(returned: Any, has_result: bool, result_json: Any) -> None:
    @workflow(name="returns", description="Returns what the test gives it", phases=[])
    def returns(ctx: WorkflowContext) -> Any:
        return returned

    driver = Driver.of(returns)
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == result_json
    assert driver.record().has_result is has_result


def test_a_workflow_result_that_is_not_json_fails_the_run() -> None:
    @workflow(name="bad-result", description="Returns a float that JSON cannot hold", phases=[])
    def bad_result(ctx: WorkflowContext) -> Any:
        return {"ratio": float("nan")}

    settlement = Driver.of(bad_result).main()
    assert settlement is not None
    assert (settlement.status, settlement.reason, settlement.can_resume) == ("error", "invalid_result", True)
    # The SPEC's exact text (§4 JSON); the system record says what is not JSON.
    assert settlement.error == "Workflow result must be a JSON value"
    assert settlement.message == "Run failed: Workflow result must be a JSON value: nan is not a finite number"
