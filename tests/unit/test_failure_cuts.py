"""Failures replay identically within their attempt and are retried after it;
a retried failure cuts the sequence, so what the older attempt did after it
is an abandoned future, not history."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from celery_durable import StepFailed, WorkflowContext, workflow
from celery_durable.broker import schema
from tests.unit.harness import Driver


def counting(calls: Counter[str]) -> Callable[[str, Any], Callable[[], Any]]:
    def producer(key: str, value: Any) -> Callable[[], Any]:
        def produce() -> Any:
            calls[key] += 1
            return value

        return produce

    return producer


def test_a_failed_step_is_the_same_failure_on_every_pass_of_its_attempt() -> None:
    calls: Counter[str] = Counter()

    def flaky() -> int:
        calls["b"] += 1
        raise ConnectionError("provider down")

    @workflow(name="same-failure", description="Catches a failure, then fans out", phases=[])
    def same_failure(ctx: WorkflowContext) -> Any:
        try:
            ctx.step("b", flaky)
        except StepFailed as exc:
            seen = f"{exc.error_type}: {exc.error_message}"
        ctx.parallel([lambda: 0])
        return seen

    driver = Driver.of(same_failure)
    assert driver.settle().result_json == '"ConnectionError: provider down"'
    assert calls["b"] == 1  # the second pass replayed the journaled failure


def test_a_later_attempt_runs_the_failed_step_again_and_abandons_what_followed() -> None:
    calls: Counter[str] = Counter()
    step = counting(calls)
    provider = {"up": False}

    def book() -> str:
        calls["book"] += 1
        if not provider["up"]:
            raise ConnectionError("provider down")
        return "booked"

    @workflow(name="retry-later", description="Fails, gives up, is resumed", phases=[])
    def retry_later(ctx: WorkflowContext) -> Any:
        ctx.step("quote", step("quote", 100))
        try:
            booking = ctx.step("book", book)
        except StepFailed:
            ctx.step("notify-failure", step("notify-failure", True))
            raise RuntimeError("gave up") from None
        return [booking, ctx.step("confirm", step("confirm", "ok"))]

    driver = Driver.of(retry_later)
    first = driver.settle()
    assert (first.status, first.reason, first.can_resume) == ("error", "exception", True)
    assert first.error == "RuntimeError: gave up"

    provider["up"] = True
    driver.resume()
    second = driver.settle()
    assert (second.status, second.result_json) == ("completed", '["booked","ok"]')
    assert calls == Counter({"quote": 1, "book": 2, "notify-failure": 1, "confirm": 1})
    history = driver.journal().read_sequence("m")
    assert history.cut == (2, 1)
    # "confirm" stands where the older attempt's "notify-failure" did: no conflict.
    assert [identity for identity, _ in history.live_entries()] == ["s|quote", "s|book", "s|confirm"]
    rows = {key: schema.StepRow.parse(key, raw) for key, raw in driver.store.step_rows(driver.run_id).items()}
    assert (rows["book"].status, rows["book"].attempt) == ("completed", 2)
    assert rows["notify-failure"].attempt == 1


def test_branches_that_failed_in_an_older_attempt_run_again_alone() -> None:
    calls: Counter[str] = Counter()
    healthy = {"b1": False}

    def thunk(name: str) -> Callable[[], Any]:
        def run() -> Any:
            calls[name] += 1
            if not healthy.get(name, True):
                raise TimeoutError(name)
            return name

        return run

    @workflow(name="branch-retry", description="A branch fails, the attempt dies before collecting", phases=[])
    def branch_retry(ctx: WorkflowContext) -> Any:
        return ctx.parallel([thunk("b0"), thunk("b1"), thunk("b2")])

    driver = Driver.of(branch_retry)
    driver.main()
    assert driver.deliver_branches() == [False, False, True]
    # The attempt dies before its coordinator collects; a new one takes over.
    healthy["b1"] = True
    driver.resume()
    assert driver.main() is None
    assert driver.branches == [("m:0", 1)]  # only the branch that failed goes out again
    assert driver.journal().read_sequence("m").cut == (2, 0)
    driver.deliver_branches()
    assert driver.main() is not None
    assert driver.record().result == ["b0", "b1", "b2"]
    assert calls == Counter({"b0": 1, "b1": 2, "b2": 1})
