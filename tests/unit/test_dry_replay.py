"""The replay check on the real journal (SPEC §8a): runs in every shape a
driver leaves them, replayed against other code; each check is watched
(``MONITOR``) and every key of the store dumped before and after, and no
producer may run."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from celery_durable import StepFailed, WorkflowContext, define_workflow
from celery_durable.broker import schema
from celery_durable.broker.journal import JOURNAL_CALLS, PendingCommit
from celery_durable.testing.server import environment_redis_url
from celery_durable.workflows.dry_replay import READS, DryReplayWrite, ReadOnlyJournal, check_run
from tests.support.redis_watch import dump_keys, writes_seen
from tests.unit.harness import MAX_PAYLOAD, Driver

META = {"name": "order", "description": "Reserves, waits for approval, charges", "phases": []}
RAN: Counter[str] = Counter()


def produce(key: str, value: Any = None) -> Any:
    RAN[key] += 1
    return key if value is None else value


def version(run: Any) -> Any:
    return define_workflow(META, run)


def waiting(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: produce("reserve"))
    approval = ctx.wait_for_signal("approval")
    return ctx.step("charge", lambda: produce("charge", approval.payload))


def patched(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: produce("reserve"))
    if ctx.patched("fraud-check"):
        ctx.step("fraud-check", lambda: produce("fraud-check"))
    approval = ctx.wait_for_signal("approval")
    return ctx.step("charge", lambda: produce("charge", approval.payload))


def unguarded(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: produce("reserve"))
    ctx.step("fraud-check", lambda: produce("fraud-check"))
    approval = ctx.wait_for_signal("approval")
    return ctx.step("charge", lambda: produce("charge", approval.payload))


WAITING, PATCHED, UNGUARDED = version(waiting), version(patched), version(unguarded)


def check(driver: Driver, workflow: Any) -> tuple[str, str]:
    """The check of the driver's run against ``workflow``: nothing written, nothing run."""
    url, prefix = environment_redis_url(), driver.store.settings.key_prefix
    record = driver.record()
    before = dump_keys(url, prefix)
    ran = Counter(RAN)
    with writes_seen(url, prefix) as writes:
        verdict = check_run(
            driver.store.replay_journal(record),
            record,
            workflow,
            max_fanout=4096,
            max_payload_bytes=MAX_PAYLOAD,
        )
    assert writes == []
    assert dump_keys(url, prefix) == before
    assert ran == RAN, "a producer ran"
    assert (driver.branches, driver.turns) == ([], []), "a task was sent"
    return verdict


def waiting_run() -> Driver:
    driver = Driver.of(WAITING)
    assert driver.main() is None
    return driver


def completed_run(workflow: Any = WAITING) -> Driver:
    driver = Driver.of(workflow)
    driver.main()
    driver.signal("approval", 7)
    settlement = driver.main()
    assert settlement is not None and settlement.status == "completed"
    return driver


def test_a_waiting_run_checks_ok_with_its_own_code_and_with_a_patched_change() -> None:
    driver = waiting_run()
    assert check(driver, WAITING) == ("ok", "")
    assert check(driver, PATCHED) == ("ok", "")


def test_an_unguarded_change_diverges_with_the_message_the_run_would_end_with() -> None:
    driver = waiting_run()
    verdict, message = check(driver, UNGUARDED)
    assert verdict == "diverges"
    assert message.startswith(
        "Workflow 'order' replayed differently in the main body at call 1: "
        "expected wait_for_signal('approval'), got fraud-check. The workflow's code changed since the run started"
    )
    driver.workflow = UNGUARDED  # deployed anyway: the run ends with that very message
    driver.signal("approval", 7)
    settlement = driver.main()
    assert settlement is not None and settlement.error == message


def test_a_completed_run_checks_ok_with_its_own_code() -> None:
    assert check(completed_run(), WAITING) == ("ok", "")


def test_a_completed_run_whose_code_calls_past_its_journal_diverges() -> None:
    def more(ctx: WorkflowContext) -> Any:
        result = waiting(ctx)
        ctx.step("receipt", lambda: produce("receipt"))
        return result

    verdict, message = check(completed_run(), version(more))
    assert verdict == "diverges"
    assert "in the main body at call 3: expected the run's end, got receipt" in message


def test_a_body_that_returns_where_the_journal_goes_on_diverges() -> None:
    def shorter(ctx: WorkflowContext) -> Any:
        ctx.step("reserve", lambda: produce("reserve"))
        ctx.wait_for_signal("approval")
        return 7

    verdict, message = check(completed_run(), version(shorter))
    assert verdict == "diverges"
    assert "at call 2: expected charge, got the workflow's return" in message


def test_a_completed_run_whose_new_code_returns_where_it_returned_checks_ok_whatever_it_returns() -> None:
    """SPEC §8a: a new version may shape its result differently; returning where the run returned is ok."""

    def other(ctx: WorkflowContext) -> Any:
        return {"charged": waiting(ctx), "version": 2}

    def nothing(ctx: WorkflowContext) -> Any:
        waiting(ctx)
        return None

    assert check(completed_run(), version(other)) == ("ok", "")
    assert check(completed_run(), version(nothing)) == ("ok", "")

    def raises(ctx: WorkflowContext) -> Any:
        waiting(ctx)
        raise RuntimeError("new code fails at the end")

    # Code that raises where the run returned fails the check (SPEC §8a: `failed`, the
    # exception's type and message), as it does on a live run; it is not a history that diverges.
    assert check(completed_run(), version(raises)) == ("failed", "RuntimeError: new code fails at the end")


def test_a_run_that_failed_in_a_step_checks_ok_when_the_code_fails_the_same_way() -> None:
    def failing(ctx: WorkflowContext) -> Any:
        ctx.step("reserve", lambda: produce("reserve"))
        return ctx.step("charge", lambda: (_ for _ in ()).throw(RuntimeError("card declined")))

    driver = Driver.of(version(failing))
    settlement = driver.main()
    assert settlement is not None and settlement.reason == "exception"
    assert check(driver, version(failing)) == ("ok", "")

    def catches(ctx: WorkflowContext) -> Any:
        try:
            return failing(ctx)
        except StepFailed:
            return "declined"

    verdict, message = check(driver, version(catches))
    assert verdict == "diverges"
    assert message == (
        "The run ended error: StepFailed: step 'charge' raised RuntimeError: card declined; the replay completed"
    )
    driver.resume()  # the next attempt runs the failed step again: the check stops there
    assert check(driver, version(catches)) == ("ok", "")


def test_code_that_raises_is_failed_with_the_exceptions_type_and_message() -> None:
    def broken(ctx: WorkflowContext) -> Any:
        ctx.step("reserve", lambda: produce("reserve"))
        return {}["missing"]

    assert check(waiting_run(), version(broken)) == ("failed", "KeyError: 'missing'")


def test_a_volatile_step_ends_the_check_where_its_value_would_be_needed() -> None:
    def volatile(ctx: WorkflowContext) -> Any:
        ctx.step("reserve", lambda: produce("reserve"))
        ctx.step("peek", lambda: produce("peek"), volatile=True)
        return waiting(ctx)

    assert check(waiting_run(), version(volatile)) == (
        "ok",
        "checked up to volatile step 'peek' in the main body, whose value is not journaled",
    )


def test_an_agent_turn_in_flight_is_where_the_check_stops() -> None:
    def asks(ctx: WorkflowContext) -> Any:
        ctx.step("reserve", lambda: produce("reserve"))
        return ctx.agent("Summarize the order", label="summary")

    driver = Driver.of(version(asks))
    assert driver.main() is None
    assert len(driver.turns) == 1
    driver.turns.clear()
    assert check(driver, version(asks)) == ("ok", "")


def fan_out(branch_code: Any) -> Any:
    def run(ctx: WorkflowContext) -> Any:
        return ctx.parallel([lambda i=i: branch_code(ctx, i) for i in range(2)])

    return version(run)


def branch_waits(ctx: WorkflowContext, i: int) -> Any:
    ctx.step(f"b{i}", lambda: produce(f"b{i}"))
    if i == 1:
        return ctx.wait_for_signal("go").payload
    return i


def branch_changed(ctx: WorkflowContext, i: int) -> Any:
    ctx.step(f"b{i}", lambda: produce(f"b{i}"))
    if i == 1:
        ctx.step("new", lambda: produce("new"))
        return ctx.wait_for_signal("go").payload
    return i


def branch_longer(ctx: WorkflowContext, i: int) -> Any:
    value = branch_waits(ctx, i)
    ctx.step(f"after{i}", lambda: produce(f"after{i}"))
    return value


def test_branches_are_checked_in_their_own_sequences() -> None:
    driver = Driver.of(fan_out(branch_waits))
    assert driver.main() is None
    driver.deliver_branches()  # branch 0 ends; branch 1 waits for its signal
    assert check(driver, fan_out(branch_waits)) == ("ok", "")
    verdict, message = check(driver, fan_out(branch_changed))
    assert verdict == "diverges"
    assert "in branch m.0.1 at call 1: expected wait_for_signal('go'), got new" in message
    # Branch 0 ended in the run: a call past its journal's end diverges;
    # branch 1 still waits, so the same call there is new work.
    verdict, message = check(driver, fan_out(branch_longer))
    assert verdict == "diverges"
    assert "in branch m.0.0 at call 1: expected the branch's end, got after0" in message


def test_the_read_only_journal_refuses_every_write_before_redis_sees_it() -> None:
    assert READS < JOURNAL_CALLS
    driver = waiting_run()
    journal = ReadOnlyJournal(driver.journal())
    assert journal.read_sequence("m").entries
    url, prefix = environment_redis_url(), driver.store.settings.key_prefix
    with writes_seen(url, prefix) as writes:
        with pytest.raises(DryReplayWrite, match=r"Journal\.record"):
            journal.record("m", PendingCommit(2, schema.Identity.step("x")))
        with pytest.raises(DryReplayWrite, match=r"Journal\.note_code"):
            journal.note_code("abc")
    assert writes == []
