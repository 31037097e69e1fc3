"""The run-level scripts of ``MemoryRun``, as the Lua they port behaves.

(The journal scripts, signal and examine are held to Redis itself by
``tests/contract``.)
"""

from __future__ import annotations

from typing import Any

from celery_durable import WorkflowContext, workflow
from celery_durable.broker import schema
from celery_durable.broker.fleet_store import Examined
from celery_durable.broker.journal import BeginCall, Flags
from celery_durable.broker.memory import MemoryJournal, MemoryRun
from celery_durable.testing.fleet import new_memory_run


@workflow(name="lifecycle", description="A run to settle, cancel and resume", phases=[])
def lifecycle(ctx: WorkflowContext) -> Any:
    return None


class Clock:
    def __init__(self) -> None:
        self.now = 10_000

    def __call__(self) -> int:
        return self.now


def running(clock: Clock | None = None, **options: Any) -> MemoryRun:
    """A run whose first pass (message "pass-1") holds the lock."""
    run = new_memory_run(lifecycle, run_id="r" * 32, clock=clock or Clock(), message="pass-1", **options)
    assert run.state.live == {"pass-1": "q|c|10000"}
    assert run.activate(1, "pass-1", "resend") == Flags()
    assert run.state.live == {"pass-1": "x|40000"}
    return run


def system_records(run: MemoryRun) -> list[str]:
    return [r.message for r in run.progress_page("", "after", 0, 500).records if r.kind == "system"]


def test_resume_bumps_the_epoch_and_interrupts_what_the_old_attempt_left_running() -> None:
    run = running()
    MemoryJournal(run, 1).begin("m", BeginCall(step_key="slow", step_row=schema.StepRow.running(1, 5).encode()))
    run.state.agents["t@1"] = schema.queued_agent_row("t", None, None, 1, 5)
    record = run.record()
    assert run.resume(record, limits_json="", message="Run recovered", code_hash="") == 2
    assert run.resume(record, limits_json="", message="again", code_hash="") is None  # compare-and-set
    assert schema.StepRow.parse("slow", run.step_rows()["slow"]).status == "interrupted"
    assert schema.parse_agent_row(run.agent_rows()["t@1"])["status"] == "interrupted"
    fresh = run.record()
    assert (fresh.epoch, fresh.attempt, fresh.status, fresh.steps_running) == (2, 2, "running", 0)
    assert system_records(run) == ["Attempt 1 started", "Run recovered (attempt 2)"]


def test_a_recovery_requires_a_dead_attempt_and_keeps_the_requests() -> None:
    clock = Clock()
    run = running(clock)
    run.cancel("cancel-1")
    recover = {"limits_json": "", "message": "m", "code_hash": "", "message_id": "first-2", "recovery": True}
    assert run.resume(run.record(), **recover) is None  # its pass still renews its message
    clock.now += 30_001  # the pass's heartbeat stopped a lease ago
    assert run.examine().verdict == "dead"
    assert run.resume(run.record(), **recover) == 2
    assert run.record().cancel_requested
    assert run.state.run["recoveries"] == "1"
    assert run.state.live == {"first-2": f"q|c|{clock.now}"}  # the old attempt's messages are forgotten


def test_a_queued_message_is_dead_once_its_queue_emptied_without_it_starting() -> None:
    clock = Clock()
    run = new_memory_run(lifecycle, run_id="r" * 32, clock=clock, message="first")
    assert run.examine("c=9000").verdict == "alive"  # the queue was last empty before the message was sent
    assert run.examine("c=10500").verdict == "alive"  # emptied since: some worker took it, give it time to start
    clock.now += 5_000
    examined = run.examine("c=10500")
    assert (examined.verdict, examined.detail) == ("dead", "task first left its queue and never started")


def test_a_message_its_worker_received_waits_for_a_slot_until_that_worker_dies() -> None:
    clock = Clock()
    run = new_memory_run(lifecycle, run_id="r" * 32, clock=clock, message="first")
    assert run.received(["first", "unknown"]) == 1
    clock.now += 20_000
    assert run.examine("c=10500").verdict == "alive"  # not the empty-queue rule's: its worker has it
    assert run.mark_lost(["first"]) == 1
    assert run.examine().detail == "the worker holding task first died"


def test_a_received_message_that_never_starts_is_dead_a_lease_later() -> None:
    clock = Clock()
    run = new_memory_run(lifecycle, run_id="r" * 32, clock=clock, message="first")
    run.received(["first"])
    clock.now += 29_999
    assert run.examine().verdict == "alive"
    clock.now += 1
    assert run.examine().detail == "task first was received and never started"


def test_a_message_held_by_a_dead_worker_is_lost() -> None:
    run = new_memory_run(lifecycle, run_id="r" * 32, clock=Clock(), message="first")
    assert run.mark_lost(["first", "unknown"]) == 1
    assert run.examine() == Examined("pending", 1, "lifecycle", "dead", "the worker holding task first died")
    running_run = running()
    assert running_run.mark_lost(["pass-1"]) == 0  # a running message is judged by its own heartbeat


def test_finish_settles_and_fences_everything_after() -> None:
    run = running()
    run.finish(1, "error", reason="exception", error="boom", can_resume=True, message="Run failed: boom")
    assert run.state.live == {} and run.examine().verdict == ""
    record = run.record()
    assert (record.status, record.reason, record.can_resume, record.has_result) == ("error", "exception", True, False)
    assert system_records(run)[-1] == "Run failed: boom"
    assert run.cancel() == ("cancelled", None)  # a settled, resumable run is cancelled at once
    cancelled = run.record()
    assert (cancelled.status, cancelled.epoch, cancelled.attempt) == ("cancelled", 2, 1)
    assert run.cancel() == ("settled", None)
    assert run.pause() == ("settled", None)


def test_halt_stops_a_run_whose_attempt_died() -> None:
    clock = Clock()
    run = running(clock)
    assert run.halt(run.record()) is False  # its pass still renews its message
    clock.now += 60_000
    assert run.halt(run.record()) is True
    halted = run.record()
    assert (halted.status, halted.reason, halted.can_resume, halted.epoch, halted.attempt) == (
        "halted", "interrupted", True, 2, 1,
    )  # fmt: skip


def test_the_activation_lock_and_its_wake_flag() -> None:
    run = running()
    run.state.live["pass-2"] = "q|c|10000"
    # Busy: the holder is told to run once more; this message comes back when the lock would expire.
    assert run.activate(1, "pass-2", "pass-3") == 30_100
    assert run.state.live == {"pass-1": "x|40000", "pass-3": "q|c|40100"}
    assert run.release("pass-1", 1) is True
    assert run.release("pass-1", 1) is False
    assert run.state.live == {"pass-3": "q|c|40100"}
    assert run.activate(1, "pass-3", "pass-4") == Flags()


def test_active_time_runs_only_while_a_message_is_in_flight() -> None:
    clock = Clock()
    run = running(clock, limits={"timeout_seconds": 60})
    clock.now += 10_000
    assert run.release("pass-1", 1) is False
    assert (run.state.run["active_ms"], run.state.run["active_since"]) == ("10000", "")
    clock.now += 3_600_000  # an hour with nothing in flight: a wait, not work
    # A wake-up (here a branch task) starts the clock again.
    started = run.branch_start(1, lifecycle.name, "branch-1", "m:0", [0], [])
    assert not isinstance(started, str) and started.flags == Flags()
    clock.now += 5_000
    run.task_end(1, "branch-1")
    assert run.state.run["active_ms"] == "15000"
    assert run.heartbeat(1, "gone", wake="wake-1") == (Flags(), False)  # not in flight: not renewed
    assert run.state.live == {}
    assert not isinstance(run.branch_start(1, lifecycle.name, "branch-2", "m:0", [0], []), str)
    clock.now += 50_000
    # A ceiling newly reached by a task other than the coordinator wakes the coordinator.
    assert run.heartbeat(1, "branch-2", wake="wake-2") == (Flags(limit="timeout_seconds"), True)
    assert run.state.live["wake-2"] == f"q|c|{clock.now}"
    assert run.heartbeat(1, "branch-2", wake="wake-3") == (Flags(limit="timeout_seconds"), False)


def test_agent_turns_take_a_slot_under_the_concurrency_ceiling() -> None:
    run = running(limits={"max_total_subagents": 2, "max_concurrent_subagents": 1})
    journal = MemoryJournal(run, 1)
    for index, agent in enumerate(("x" * 32, "y" * 32)):
        row = schema.queued_agent_row(agent, None, None, 1, 5)
        journal.agent_call("m", index, agent, '{"prompt":"p"}', "m", row, None, f"turn-{agent[0]}")
    assert run.agent_start(1, "x" * 32, "turn-x") == ("go", '{"prompt":"p"}')
    assert run.agent_start(1, "x" * 32, "again-x", "later-x", 200) == ("wait", None)  # the same turn, twice
    assert run.agent_start(1, "y" * 32, "turn-y", "later-y", 200) == ("wait", None)  # the ceiling
    assert {task: value[:2] for task, value in run.state.live.items() if task != "pass-1"} == {
        "turn-x": "x|", "later-x": "q|", "later-y": "q|",
    }  # fmt: skip
    assert run.state.live["later-y"] == "q|a|10200"
    assert run.agent_finish(1, "x" * 32, 'o"ok"', "{}", (7, 1, 2), "turn-x", "woken") == ["m"]
    assert "turn-x" not in run.state.live and run.state.live["woken-1"] == "q|c|10000"
    assert run.agent_start(1, "x" * 32, "later-x") == ("done", None)
    assert run.agent_start(1, "y" * 32, "later-y")[0] == "go"
    record = run.record()
    assert (record.agents_done, record.agents_running, record.credits_nano) == (1, 1, 7)


def test_progress_keeps_the_newest_records_when_bounded() -> None:
    run = running(progress_max=3)
    journal = MemoryJournal(run, 1)
    records = [(schema.position(0, n), "log", "", f"line {n}") for n in range(5)]
    journal.begin("m", BeginCall(records=records))
    page = run.progress_page("", "newest", 0, 10)
    assert ([r.seq for r in page.records], page.oldest, page.newest, page.revision) == ([4, 5, 6], 4, 6, 6)
    before = run.progress_page("", "before", 6, 1)
    assert [r.message for r in before.records] == ["line 3"]
