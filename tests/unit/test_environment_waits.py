"""Durable waits in ``WorkflowTestEnvironment``: virtual time that skips, and signals.

A run that sleeps for a day completes in milliseconds; ``start`` and
``signal`` never move the clock, ``clock.advance`` fires the timers it
passes, and ``run``/``resume``/``wait`` skip to the next timer until the run
settles or waits for a signal only.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from celery_durable import RunNotFoundError, Settings, WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment, environment

DAY_MS = 86_400_000


def skipped(env: WorkflowTestEnvironment) -> float:
    """The time the environment skipped, in days (to the ms the test itself took)."""
    return round(env.clock.offset_ms / DAY_MS, 4)


@workflow(name="overnight", description="Works, sleeps a day, works", phases=[{"title": "Night"}])
def overnight(ctx: WorkflowContext) -> Any:
    first = ctx.step("evening", lambda: "evening")
    ctx.phase("Night")
    ctx.sleep(timedelta(days=1))
    return [first, ctx.step("morning", lambda: "morning")]


@workflow(name="go-ahead", description="Waits for a go-ahead, reminding daily, for three days", phases=[])
def go_ahead(ctx: WorkflowContext) -> Any:
    for day in range(3):
        answer = ctx.wait_for_signal("go-ahead", timeout=timedelta(days=1))
        if answer.received:
            return {"answer": answer.payload, "after_days": day}
        ctx.step(f"remind-{day}", lambda: "reminder sent")
    return {"answer": None}


@workflow(name="approval", description="Waits for a decision, no timeout", phases=[])
def approval(ctx: WorkflowContext) -> Any:
    ctx.step("ask", lambda: "asked")
    return ctx.wait_for_signal("approval").payload


def test_a_run_sleeping_for_a_day_completes_in_milliseconds() -> None:
    env = WorkflowTestEnvironment([overnight])
    began = time.monotonic()
    envelope = env.run(overnight, limits={"timeout_seconds": 60})  # waiting is not active time
    assert (envelope.status, envelope.result) == ("completed", ["evening", "morning"])
    assert time.monotonic() - began < 1
    assert skipped(env) == 1  # the clock jumped to the timer, no further
    assert [row.key for row in env.detail(envelope.run_id).steps] == ["evening", "morning"]


def test_start_leaves_a_sleeping_run_waiting_and_advance_fires_its_timer() -> None:
    env = WorkflowTestEnvironment([overnight])
    run_id = env.start(overnight)
    waiting = env.get(run_id)
    assert waiting.status == "running" and waiting.snapshot["steps_done"] == 1
    assert waiting.snapshot["waiting_for"] is not None
    assert (waiting.snapshot["waiting_for"]["kind"], waiting.snapshot["waiting_for"]["name"]) == ("timer", "")
    assert waiting.to_dict()["snapshot"]["waiting_for"]["until"].endswith("+00:00")  # ISO 8601, UTC
    env.clock.advance(timedelta(hours=23, minutes=59))
    assert env.get(run_id).status == "running"
    env.clock.advance(60)
    assert env.get(run_id).result == ["evening", "morning"]


def test_a_run_that_waits_for_a_signal_only_is_returned_running_and_a_signal_completes_it() -> None:
    env = WorkflowTestEnvironment([approval])
    envelope = env.run(approval)
    assert envelope.status == "running" and env.clock.offset_ms == 0  # no timer to skip to
    assert envelope.snapshot["waiting_for"] == {"kind": "signal", "name": "approval", "until": None}
    done = env.signal(envelope.run_id, "approval", {"approved": True, "note": "fine"})
    assert (done.status, done.result) == ("completed", {"approved": True, "note": "fine"})
    assert [r.message for r in env.progress(envelope.run_id).records if r.kind == "system"] == [
        "Attempt 1 started", "Signal approval received", "Run completed",
    ]  # fmt: skip


def test_timeouts_are_skipped_and_a_signal_sent_between_them_is_received() -> None:
    env = WorkflowTestEnvironment([go_ahead])
    expired = env.run(go_ahead)
    assert expired.result == {"answer": None} and expired.snapshot["steps_done"] == 3
    assert skipped(env) == 3

    run_id = env.start(go_ahead)  # never moves the clock: the run waits on its first day
    env.clock.advance(timedelta(days=1))  # the first timeout passes: one reminder
    assert env.get(run_id).snapshot["steps_done"] == 1
    assert env.signal(run_id, "go-ahead", "Oslo").result == {"answer": "Oslo", "after_days": 1}


def test_a_signal_sent_before_the_run_reaches_its_wait_is_kept_for_it() -> None:
    @workflow(name="later", description="Sleeps, then waits for a signal", phases=[])
    def later(ctx: WorkflowContext) -> Any:
        ctx.sleep(3600)
        first, second = ctx.wait_for_signal("item"), ctx.wait_for_signal("item")
        return [first.payload, second.payload]

    env = WorkflowTestEnvironment([later])
    run_id = env.start(later)
    env.signal(run_id, "item", 1)
    assert env.signal(run_id, "item", None).status == "running"  # still asleep: both are kept, in order
    assert env.wait(run_id).result == [1, None]


def test_pause_and_cancel_of_a_waiting_run_act_at_once_and_resume_keeps_the_due_time() -> None:
    env = WorkflowTestEnvironment([overnight, approval])
    run_id = env.start(overnight)
    env.clock.advance(3600)
    paused = env.pause(run_id)
    assert (paused.status, paused.snapshot["waiting_for"]) == ("paused", None)
    env.clock.advance(5 * 3600)  # paused: nothing fires
    resumed = env.resume(run_id)
    assert resumed.status == "completed"
    assert skipped(env) == 1  # due a day after the sleep began, pause or not

    waiting = env.start(approval)
    cancelled = env.cancel(waiting)
    assert (cancelled.status, cancelled.reason) == ("cancelled", "cancelled")


def test_a_signal_sent_while_the_run_is_paused_is_kept_for_the_resumed_attempt() -> None:
    env = WorkflowTestEnvironment([approval])
    run_id = env.start(approval)
    env.pause(run_id)
    assert env.signal(run_id, "approval", "while paused").status == "paused"
    assert env.resume(run_id).result == "while paused"


@workflow(name="two-replies", description="Waits twice for a reply, a minute each", phases=[])
def two_replies(ctx: WorkflowContext) -> Any:
    return [[s.payload, s.received] for s in (ctx.wait_for_signal("reply", timeout=60) for _ in range(2))]


def test_a_signal_sent_after_the_timeout_passed_while_paused_goes_to_the_next_wait() -> None:
    """SPEC §5: received is false when the timeout passed first; the due time
    is kept across a pause. The wait of a run paused past its due time took a
    signal sent after it (received), where the running run timed out and gave
    the signal to its next wait."""
    env = WorkflowTestEnvironment([two_replies])
    paused = env.start(two_replies)
    assert env.pause(paused).status == "paused"
    env.clock.advance(120)
    env.signal(paused, "reply", "late")
    assert env.resume(paused).result == [[None, False], ["late", True]]


def test_branches_sleep_concurrently_on_threads() -> None:
    @workflow(name="staggered", description="Three branches sleep one, two and three hours", phases=[])
    def staggered(ctx: WorkflowContext) -> Any:
        def branch(hours: int) -> int:
            ctx.sleep(timedelta(hours=hours))
            return ctx.step(f"after-{hours}", lambda: hours)

        return ctx.parallel([lambda h=h: branch(h) for h in (3, 1, 2)])

    env = WorkflowTestEnvironment([staggered], fanout="threads")
    assert env.run(staggered).result == [3, 1, 2]
    assert skipped(env) == round(3 / 24, 4)  # three hours in all, not six


def test_a_crashed_run_resumes_without_waiting_again_for_a_wait_that_ended() -> None:
    env = WorkflowTestEnvironment([overnight])
    # (After its last step there is no crash point left short of the settled
    # run: the script that journals the last step settles the run.)
    env.crash_before("morning")
    crashed = env.run(overnight)
    assert crashed.status == "running" and crashed.snapshot["waiting_for"] is None
    slept = env.clock.offset_ms
    assert env.resume(crashed.run_id).result == ["evening", "morning"]
    assert env.clock.offset_ms == slept  # no timer to skip to: the sleep is journaled as ended


def test_what_signal_refuses_as_the_client_does() -> None:
    flips = {"signal": False}

    @workflow(name="flip", description="Waits differently on replay", phases=[])
    def flip(ctx: WorkflowContext) -> Any:
        return ctx.wait_for_signal("b") if flips["signal"] else ctx.sleep(60)

    env = WorkflowTestEnvironment([overnight, approval, flip], settings=Settings(max_payload_bytes=1024))
    waiting = env.start(approval)
    with pytest.raises(ValueError, match="signal name"):
        env.signal(waiting, "")
    with pytest.raises(ValueError, match="signal name"):
        env.signal(waiting, "n" * 129)
    with pytest.raises(ValueError, match="Signal payload"):
        env.signal(waiting, "approval", {"bytes": b"no"})
    with pytest.raises(ValueError, match="max_payload_bytes"):
        env.signal(waiting, "approval", "x" * 2000)
    with pytest.raises(RunNotFoundError):
        env.signal("0" * 32, "approval")
    assert env.get(waiting).status == "running"  # nothing was delivered
    cancelled = env.cancel(waiting)
    with pytest.raises(ValueError, match=f"Run {cancelled.run_id} is cancelled: it takes no more signals"):
        env.signal(waiting, "approval")
    stuck = env.start(flip)
    flips["signal"] = True
    broken = env.wait(stuck)
    assert (broken.status, broken.reason, broken.can_resume) == ("error", "nondeterminism", False)
    with pytest.raises(ValueError, match="is error and cannot be resumed"):
        env.signal(stuck, "b")


def test_a_run_that_never_stops_setting_timers_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    @workflow(name="forever", description="Sleeps in a loop", phases=[])
    def forever(ctx: WorkflowContext) -> Any:
        while True:
            ctx.sleep(60)

    monkeypatch.setattr(environment, "MAX_SKIPPED_TIMERS", 5)
    env = WorkflowTestEnvironment([forever])
    with pytest.raises(RuntimeError, match="kept setting timers"):
        env.run(forever)


@pytest.fixture
def waits_reached(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The identities of the waits passes reach through ``wait.lua``, in order."""
    from celery_durable.broker.redis_journal import RedisJournal

    reached: list[str] = []
    wait = RedisJournal.wait

    def counted(journal: RedisJournal, *args: Any, **options: Any) -> Any:
        reached.append(args[2])  # the op's identity
        return wait(journal, *args, **options)

    monkeypatch.setattr(RedisJournal, "wait", counted)
    return reached


def test_the_pass_a_fired_timer_wakes_finds_the_timers_end_in_what_it_read_with_its_lock(
    waits_reached: list[str],
) -> None:
    """The sweep journals a due timer's end as it wakes the owner
    (``examine.lua``), and the woken pass reads the main body's journal in
    the script that takes its lock: so it replays past the sleep with no
    round trip of its own for it (``wait.lua`` runs once: to set the timer)."""
    env = WorkflowTestEnvironment([overnight])
    run_id = env.start(overnight)
    assert env.get(run_id).status == "running" and waits_reached == ["z|"]
    envelope = env.skip_to_next_timer(run_id)
    assert (envelope.status, envelope.result) == ("completed", ["evening", "morning"])
    assert waits_reached == ["z|"]


def test_the_pass_a_signal_wakes_finds_it_taken_for_its_wait(waits_reached: list[str]) -> None:
    """``signal.lua`` takes the signal for the wait of its name, as that
    wait's ``wait.lua`` would: the woken pass replays past the wait with no
    round trip of its own for it."""
    env = WorkflowTestEnvironment([approval])
    run_id = env.start(approval)
    assert env.get(run_id).status == "running" and waits_reached == ["g|approval"]
    envelope = env.signal(run_id, "approval", {"ok": True})
    assert (envelope.status, envelope.result) == ("completed", {"ok": True})
    assert waits_reached == ["g|approval"]
