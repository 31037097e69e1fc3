"""Durable waits through replay, on the real journal: ``ctx.sleep``,
``ctx.sleep_until`` and ``ctx.wait_for_signal`` in the main body and in
branches, with pauses, cancels, resumes and bad input (SPEC §5)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_durable import Signal, WorkflowContext, workflow
from celery_durable.broker import schema
from celery_durable.workflows.passes import PAUSED
from tests.unit.harness import Driver

DAY = 86_400


def ops(driver: Driver, seq: str = "m") -> list[tuple[str, str | None]]:
    return driver.journal().read_sequence(seq).live_entries()


def waits_for(driver: Driver) -> dict[str, Any] | None:
    return driver.record().waiting_for


# -- timers ------------------------------------------------------------------------------


@workflow(name="nap", description="Sleeps a day between two steps", phases=[])
def nap(ctx: WorkflowContext) -> Any:
    before = ctx.step("before", lambda: "b")
    ctx.sleep(timedelta(days=1))
    return [before, ctx.step("after", lambda: "a")]


def test_a_sleep_in_the_main_body_suspends_the_run_holding_nothing_until_its_timer_fires() -> None:
    driver = Driver.of(nap)
    started = driver.clock.now_ms()
    assert driver.main() is None
    waiting = waits_for(driver)
    assert waiting is not None and (waiting["kind"], waiting["name"]) == ("timer", "")
    assert started + DAY * 1000 <= waiting["until"] <= driver.clock.now_ms() + DAY * 1000
    assert driver.state.live == {}  # no message in flight: the run holds no worker
    assert driver.record().status == "running"
    assert driver.advance(DAY - 1) == []  # not due yet
    assert driver.advance(1) == ["m"]
    assert waits_for(driver) is None
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == '["b","a"]'
    assert ops(driver) == [("s|before", 'o"b"'), ("z|", '{"fired":true}'), ("s|after", 'o"a"')]


def test_waiting_is_not_active_time() -> None:
    driver = Driver.of(nap, limits={"timeout_seconds": 60})
    assert driver.main() is None
    driver.advance(DAY)
    settlement = driver.main()
    assert settlement is not None and settlement.status == "completed"
    assert int(driver.state.run["active_ms"]) < 60_000


def test_a_sleep_in_a_branch_suspends_that_branch_alone() -> None:
    @workflow(name="branch-nap", description="One branch sleeps, one works", phases=[])
    def branch_nap(ctx: WorkflowContext) -> Any:
        def sleeper() -> str:
            ctx.sleep(60)
            return ctx.step("woke", lambda: "woke")

        return ctx.parallel([sleeper, lambda: ctx.step("work", lambda: "worked")])

    driver = Driver.of(branch_nap)
    assert driver.main() is None
    assert driver.deliver_branches() == [False, False]  # the sleeper waits; the other is done, not the last
    assert waits_for(driver) is not None and driver.record().steps_done == 1
    assert driver.state.live == {}  # nothing in flight while it sleeps
    assert driver.advance(60) == ["m:0/0"]  # the timer wakes the sleeping branch's task, not the coordinator
    assert driver.branches == [("m:0", 0)]
    assert driver.deliver_branches() == [True]
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == '["woke","worked"]'
    assert ops(driver, "m.0.0") == [("z|", '{"fired":true}'), ("s|woke", 'o"woke"')]


def test_sleep_until_an_aware_time() -> None:
    @workflow(name="alarm", description="Sleeps until a time given in its args", phases=[])
    def alarm(ctx: WorkflowContext) -> Any:
        ctx.sleep_until(datetime.fromisoformat(ctx.args["at"]))
        return "awake"

    at = datetime.now(UTC) + timedelta(hours=5, milliseconds=500)
    driver = Driver.of(alarm, args={"at": at.isoformat()})
    assert driver.main() is None
    assert waits_for(driver) == {"kind": "timer", "name": "", "until": math.ceil(at.timestamp() * 1000)}
    assert driver.advance(5 * 3600 + 1) == ["m"]
    assert driver.main() is not None


def test_a_time_already_past_does_not_wait() -> None:
    @workflow(name="past", description="Sleeps for nothing", phases=[])
    def past(ctx: WorkflowContext) -> Any:
        ctx.sleep(0)
        ctx.sleep_until(datetime(2000, 1, 1, tzinfo=UTC))
        return "done"

    settlement = Driver.of(past).main()
    assert settlement is not None and settlement.result_json == '"done"'


# -- signals ---------------------------------------------------------------------------------


@workflow(name="two-answers", description="Waits for two answers in turn", phases=[])
def two_answers(ctx: WorkflowContext) -> Any:
    return [ctx.wait_for_signal("answer").payload, ctx.wait_for_signal("answer").payload]


def test_signals_sent_before_the_waits_are_consumed_in_order() -> None:
    driver = Driver.of(two_answers)
    assert driver.signal("answer", {"n": 1}).owners == []  # kept: nothing waits yet
    driver.signal("other", "ignored")
    driver.signal("answer", {"n": 2})
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == '[{"n":1},{"n":2}]'


def test_a_signal_arriving_while_the_run_waits_wakes_it() -> None:
    driver = Driver.of(two_answers)
    driver.signal("answer", "first")
    assert driver.main() is None
    assert waits_for(driver) == {"kind": "signal", "name": "answer", "until": None}
    assert driver.signal("answer", "second").owners == ["m"]
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == '["first","second"]'


def test_a_timeout_is_told_apart_from_a_none_payload() -> None:
    @workflow(name="deadline", description="Waits twice with a timeout", phases=[])
    def deadline(ctx: WorkflowContext) -> Any:
        first = ctx.wait_for_signal("reply", timeout=60)
        second = ctx.wait_for_signal("reply", timeout=timedelta(minutes=1))
        return [[s.name, s.payload, s.received] for s in (first, second)]

    driver = Driver.of(deadline)
    assert driver.main() is None
    assert driver.advance(60) == ["m"]
    assert driver.main() is None  # the first timed out; the second waits
    assert driver.signal("reply", None).owners == ["m"]
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == '[["reply",null,false],["reply",null,true]]'
    assert Signal("reply", None, False) != Signal("reply", None, True)


def test_a_signal_that_comes_after_the_timeout_passed_is_not_received_by_that_wait() -> None:
    """SPEC §5: ``received`` is false when the timeout passed first. A signal
    sent after the due time, before the sweep fired it, was taken by the wait
    it came too late for (received, where a moment later it timed out); it is
    kept for the next wait instead."""

    @workflow(name="late-reply", description="Waits twice with a timeout", phases=[])
    def late_reply(ctx: WorkflowContext) -> Any:
        first = ctx.wait_for_signal("reply", timeout=60)
        second = ctx.wait_for_signal("reply", timeout=60)
        return [[s.payload, s.received] for s in (first, second)]

    driver = Driver.of(late_reply)
    assert driver.main() is None
    driver.clock.advance(61)  # due; the sweep has not looked yet
    assert driver.signal("reply", "late").owners == []
    assert driver.advance(0) == ["m"]
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == '[[null,false],["late",true]]'


def test_a_signal_wait_in_a_branch_wakes_that_branch() -> None:
    @workflow(name="branch-signal", description="A branch waits for a signal", phases=[])
    def branch_signal(ctx: WorkflowContext) -> Any:
        return ctx.parallel([lambda: ctx.wait_for_signal("go").payload, lambda: "other"])

    driver = Driver.of(branch_signal)
    driver.main()
    assert driver.deliver_branches() == [False, False]
    assert driver.signal("go", 7).owners == ["m:0/0"]
    assert driver.deliver_branches() == [True]
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == '[7,"other"]'


# -- pause, cancel, resume -----------------------------------------------------------------------


def test_pause_of_a_run_waiting_in_its_main_body_settles_at_once_and_resume_keeps_the_due_time() -> None:
    driver = Driver.of(nap)
    driver.main()
    due = waits_for(driver)
    driver.advance(3600)
    driver.pause()
    assert driver.main() == PAUSED
    record = driver.record()
    assert (record.status, record.waiting_for) == ("paused", None)
    driver.advance(3600)
    driver.resume()
    assert driver.main() is None  # waits again, for what is left of its day
    assert waits_for(driver) == due
    assert driver.advance(DAY - 2 * 3600) == ["m"]
    assert driver.main() is not None


@workflow(name="branches-wait", description="Two branches wait, one works", phases=[])
def branches_wait(ctx: WorkflowContext) -> Any:
    return ctx.parallel(
        [
            lambda: ctx.sleep(60),
            lambda: ctx.wait_for_signal("go").received,
            lambda: ctx.step("work", lambda: "worked"),
        ]
    )


def test_pause_while_only_waiting_branches_are_left_settles_paused_at_once() -> None:
    driver = Driver.of(branches_wait)
    driver.main()
    assert driver.deliver_branches() == [False, False, False]  # two wait; the worker's is not the last out
    driver.pause()
    assert driver.main() == PAUSED  # nothing in flight: what is left waits for the outside world
    assert (driver.record().status, driver.state.waits) == ("paused", {})
    driver.resume()
    assert driver.main() is None  # the resumed pass sends the two waiting branches again
    assert driver.deliver_branches() == [False, False]
    driver.signal("go")
    driver.advance(60)
    assert driver.deliver_branches() == [False, True]
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == '[null,true,"worked"]'


def test_pause_while_a_branch_is_in_flight_settles_once_it_ends() -> None:
    driver = Driver.of(branches_wait)
    driver.main()
    sleeper, waiter, worker = driver.branches
    driver.branches = []
    driver.branch(*sleeper)
    driver.branch(*waiter)
    driver.pause()
    assert driver.main() is None  # the worker's branch is still queued: in-flight work finishes first
    driver.branch(*worker)
    assert driver.coordinator, "nothing woke the coordinator to settle the pause"
    assert driver.main() == PAUSED


def test_cancel_of_a_waiting_run_acts_at_once() -> None:
    driver = Driver.of(two_answers)
    driver.main()
    driver.cancel()
    settlement = driver.main()
    assert settlement is not None and (settlement.status, settlement.reason) == ("cancelled", "cancelled")
    assert driver.record().waiting_for is None
    assert driver.signal("answer", 1).verdict == "refused"


def test_a_resumed_run_does_not_wait_again_for_a_wait_that_ended() -> None:
    failures = {"left": 1}

    @workflow(name="then-fail", description="Sleeps, is signalled, then a step fails once", phases=[])
    def then_fail(ctx: WorkflowContext) -> Any:
        ctx.sleep(DAY)
        answer = ctx.wait_for_signal("answer", timeout=DAY)

        def flaky() -> str:
            if failures["left"]:
                failures["left"] -= 1
                raise ConnectionError("down")
            return "ok"

        return [answer.payload, ctx.step("flaky", flaky)]

    driver = Driver.of(then_fail)
    driver.main()
    driver.advance(DAY)
    driver.signal("answer", "yes")
    first = driver.settle()
    assert (first.status, first.reason) == ("error", "exception")
    driver.resume()
    settlement = driver.main()  # no timer, no signal: both waits are hits
    assert settlement is not None and settlement.result_json == '["yes","ok"]'
    assert [identity for identity, _ in ops(driver)] == ["z|", "g|answer", "s|flaky"]


# -- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ctx: ctx.sleep(-1), "not negative"),
        (lambda ctx: ctx.sleep(float("nan")), "finite"),
        (lambda ctx: ctx.sleep(float("inf")), "finite"),
        (lambda ctx: ctx.sleep("5"), "seconds"),
        (lambda ctx: ctx.sleep(timedelta(days=-1)), "not negative"),
        (lambda ctx: ctx.sleep_until(datetime(2030, 1, 1)), "aware datetime"),
        (lambda ctx: ctx.sleep_until("2030-01-01T00:00:00Z"), "takes a datetime"),
        (lambda ctx: ctx.wait_for_signal(""), "signal name"),
        (lambda ctx: ctx.wait_for_signal("x" * 129), "signal name"),
        (lambda ctx: ctx.wait_for_signal("a b"), "signal name"),
        (lambda ctx: ctx.wait_for_signal("go", timeout=-5), "not negative"),
    ],
)
def test_bad_input_is_a_value_error_at_the_call_with_nothing_journaled(call: Any, message: str) -> None:
    @workflow(name="careless", description="Passes a bad argument to a wait", phases=[])
    def careless(ctx: WorkflowContext) -> Any:
        try:
            call(ctx)
        except ValueError as exc:
            return str(exc)
        return "accepted"

    driver = Driver.of(careless)
    settlement = driver.main()
    assert settlement is not None and settlement.status == "completed"  # the run is unharmed
    assert message in str(settlement.result_json)
    assert ops(driver) == [] and driver.state.waits == {} and waits_for(driver) is None
    assert not any(name.startswith("wd:") for name in driver.state.journal)


def test_a_wait_where_the_history_holds_another_call_is_nondeterminism() -> None:
    waits = {"kind": "sleep"}

    @workflow(name="changing", description="Waits differently on replay", phases=[])
    def changing(ctx: WorkflowContext) -> Any:
        if waits["kind"] == "sleep":
            ctx.sleep(60)
        else:
            ctx.wait_for_signal("go")
        return "done"

    driver = Driver.of(changing)
    driver.main()
    waits["kind"] = "signal"
    driver.advance(60)
    settlement = driver.main()
    assert settlement is not None and settlement.reason == "nondeterminism"
    assert "expected sleep(), got wait_for_signal('go')" in settlement.error
    assert schema.describe("g|go") == "wait_for_signal('go')"
