"""``ctx.patched`` and ``ctx.deprecate_patch`` through replay on the real
journal (SPEC §8a): a deploy is the driver's workflow swapped between two
passes, the run record keeping the code hash it started with."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import WorkflowContext, define_workflow
from celery_durable.broker import schema
from celery_durable.errors import NonDeterminismError
from tests.unit.harness import Driver

META = {"name": "order", "description": "Takes an order, waits for approval, charges it", "phases": []}


def version(run: Any) -> Any:
    return define_workflow(META, run)


def v1(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: "r")
    approval = ctx.wait_for_signal("approval")
    return {"charged": ctx.step("charge", lambda: approval.payload), "checked": False}


def v2(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: "r")
    checked = False
    if ctx.patched("fraud-check"):
        checked = ctx.step("fraud-check", lambda: True)
    approval = ctx.wait_for_signal("approval")
    return {"charged": ctx.step("charge", lambda: approval.payload), "checked": checked}


def v3(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: "r")
    ctx.deprecate_patch("fraud-check")
    checked = ctx.step("fraud-check", lambda: True)
    approval = ctx.wait_for_signal("approval")
    return {"charged": ctx.step("charge", lambda: approval.payload), "checked": checked}


def v3_without_deprecate(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: "r")
    checked = ctx.step("fraud-check", lambda: True)
    approval = ctx.wait_for_signal("approval")
    return {"charged": ctx.step("charge", lambda: approval.payload), "checked": checked}


V1, V2, V3, V3_BARE = (version(run) for run in (v1, v2, v3, v3_without_deprecate))


def ops(driver: Driver, seq: str = "m") -> list[str]:
    return [identity for identity, _ in driver.journal().read_sequence(seq).live_entries()]


def approve(driver: Driver, workflow: Any = None) -> Any:
    if workflow is not None:
        driver.workflow = workflow  # the deploy: the next pass runs this code
    driver.signal("approval", 42)
    settlement = driver.main()
    assert settlement is not None and settlement.status == "completed", settlement
    return settlement


def test_new_code_journals_a_marker_and_takes_the_new_branch() -> None:
    driver = Driver.of(V2)
    assert driver.main() is None
    assert ops(driver) == ["s|reserve", "v|fraud-check", "s|fraud-check", "g|approval"]
    assert approve(driver).result_json == '{"charged":42,"checked":true}'


def test_a_run_past_the_patch_under_the_old_code_keeps_the_old_branch_after_a_deploy() -> None:
    driver = Driver.of(V1)
    assert driver.main() is None  # waits for approval, with the old code
    settlement = approve(driver, V2)  # deployed while it waited; its replay meets the wait
    assert settlement.result_json == '{"charged":42,"checked":false}'
    assert ops(driver) == ["s|reserve", "g|approval", "s|charge"]  # no marker, no fraud-check
    record = driver.record()
    assert (record.code_hash, record.attempt_code_hash) == (V1.code_hash, V2.code_hash)


def test_the_same_code_notes_nothing() -> None:
    driver = Driver.of(V2)
    driver.main()
    approve(driver)
    assert "attempt_code_hash" not in driver.state.run  # no write while the code is the run's


def test_a_run_with_a_marker_replays_after_deprecate_patch() -> None:
    driver = Driver.of(V2)
    driver.main()
    settlement = approve(driver, V3)
    assert settlement.result_json == '{"charged":42,"checked":true}'
    assert ops(driver) == ["s|reserve", "v|fraud-check", "s|fraud-check", "g|approval", "s|charge"]


def test_deprecate_patch_journals_nothing_in_a_new_run() -> None:
    driver = Driver.of(V3)
    driver.main()
    assert approve(driver).result_json == '{"charged":42,"checked":true}'
    assert ops(driver) == ["s|reserve", "s|fraud-check", "g|approval", "s|charge"]


def test_a_marker_the_code_no_longer_asks_for_is_a_divergence() -> None:
    driver = Driver.of(V2)
    driver.main()
    driver.workflow = V3_BARE
    driver.signal("approval", 42)
    settlement = driver.main()
    assert settlement is not None and settlement.reason == "nondeterminism"
    assert "at call 1: expected patched('fraud-check'), got fraud-check" in settlement.error
    assert f"code hash {V2.code_hash} then, {V3_BARE.code_hash} now" in settlement.error
    assert "changed since the run started" in settlement.error
    assert driver.record().attempt_code_hash == V3_BARE.code_hash  # the code that diverged


def test_a_run_that_took_the_new_branch_never_replays_into_the_old_one() -> None:
    driver = Driver.of(V2)
    driver.main()
    driver.workflow = V1
    driver.signal("approval", 42)
    settlement = driver.main()
    assert settlement is not None and settlement.reason == "nondeterminism"
    assert "expected patched('fraud-check'), got wait_for_signal('approval')" in settlement.error


def test_the_first_answer_for_an_id_holds_for_the_rest_of_the_sequence() -> None:
    answers: list[bool] = []

    def asks_twice(ctx: WorkflowContext) -> Any:
        ctx.step("reserve", lambda: "r")
        answers.append(ctx.patched("fraud-check"))
        ctx.wait_for_signal("approval")
        answers.append(ctx.patched("fraud-check"))  # past the journal's end: still the first answer
        ctx.deprecate_patch("fraud-check")
        return ctx.step("charge", lambda: 1)

    old = Driver.of(V1)
    old.main()
    approve(old, version(asks_twice))
    assert answers == [False, False]
    assert ops(old) == ["s|reserve", "g|approval", "s|charge"]

    answers.clear()
    new = Driver.of(version(asks_twice))
    new.main()
    approve(new)
    assert answers == [True, True, True]  # one before the wait, two in the pass after: one marker
    assert ops(new) == ["s|reserve", "v|fraud-check", "g|approval", "s|charge"]


def test_patches_are_decided_per_branch() -> None:
    def branches(patched: bool) -> Any:
        def run(ctx: WorkflowContext) -> Any:
            def branch(i: int) -> Any:
                def body() -> Any:
                    value = ctx.step(f"b{i}", lambda: i)
                    if patched and ctx.patched("double"):
                        return ctx.step(f"double{i}", lambda: 2 * value)
                    return value

                return body

            return ctx.parallel([branch(0), branch(1)])

        return version(run)

    driver = Driver.of(branches(False))
    assert driver.main() is None  # dispatched: two branch tasks
    call = schema.call_id("m", 0)
    assert driver.branch(call, 0) is False  # branch 0 ends under the old code
    driver.workflow = branches(True)  # the deploy, before branch 1 starts
    assert driver.branch(call, 1) is True
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == "[0,2]"
    assert ops(driver, "m.0.0") == ["s|b0"]
    assert ops(driver, "m.0.1") == ["s|b1", "v|double", "s|double1"]  # the marker, held back with its branch


def test_a_marker_last_in_a_branch_goes_with_the_branch_outcome() -> None:
    def run(ctx: WorkflowContext) -> Any:
        return ctx.parallel([lambda: ctx.patched("p"), lambda: ctx.patched("p")])

    driver = Driver.of(version(run))
    driver.main()
    driver.deliver_branches()
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == "[true,true]"
    assert ops(driver, "m.0.0") == ops(driver, "m.0.1") == ["v|p"]


@pytest.mark.parametrize(
    "patch_id", ["", " ", "fraud check", "x" * 129, "é", None, 7, "a\n"],
)
def test_a_bad_patch_id_is_a_value_error(patch_id: Any) -> None:
    seen: list[BaseException] = []

    def run(ctx: WorkflowContext) -> Any:
        for ask in (ctx.patched, ctx.deprecate_patch):
            try:
                ask(patch_id)
            except ValueError as exc:
                seen.append(exc)
        return None

    driver = Driver.of(version(run))
    settlement = driver.main()
    assert settlement is not None and settlement.status == "completed"
    assert len(seen) == 2
    assert "A patch id must be a non-blank string of at most 128 characters of [A-Za-z0-9._:-]" in str(seen[0])
    assert ops(driver) == []


def test_a_long_patch_id_of_every_allowed_character_is_fine() -> None:
    patch_id = ("Az09._:-" * 16)[:128]

    def run(ctx: WorkflowContext) -> Any:
        return ctx.patched(patch_id)

    driver = Driver.of(version(run))
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == "true"
    assert ops(driver) == [f"v|{patch_id}"]


def test_the_divergence_message_without_a_code_change_still_says_determinism() -> None:
    assert issubclass(NonDeterminismError, Exception)
    flips = iter([True, False])

    def shifty(ctx: WorkflowContext) -> Any:
        ctx.step("a" if next(flips) else "b", lambda: 1)
        ctx.wait_for_signal("go")

    driver = Driver.of(version(shifty))
    driver.main()
    driver.signal("go")
    settlement = driver.main()
    assert settlement is not None and settlement.reason == "nondeterminism"
    assert "Check that your workflow is deterministic" in settlement.error
    assert "changed since the run started" not in settlement.error
