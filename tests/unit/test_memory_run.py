"""The run-level scripts of ``MemoryRun``, as the Lua they port behaves.

(The journal scripts are held to Redis itself by ``tests/contract``.)
"""

from __future__ import annotations

from typing import Any

from celery_durable import WorkflowContext, workflow
from celery_durable.broker import schema
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
    run = new_memory_run(lifecycle, run_id="r" * 32, clock=clock or Clock(), **options)
    assert run.activate(1, "pass-1") == Flags()
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


def test_a_recovery_requires_an_expired_lease_and_keeps_the_requests() -> None:
    clock = Clock()
    run = running(clock)
    run.cancel()
    assert run.resume(run.record(), limits_json="", message="m", code_hash="", require_expired=True) is None
    clock.now += 60_000
    assert run.resume(run.record(), limits_json="", message="m", code_hash="", require_expired=True) == 2
    assert run.record().cancel_requested
    assert run.state.run["recoveries"] == "1"


def test_finish_settles_and_fences_everything_after() -> None:
    run = running()
    run.finish(1, "error", reason="exception", error="boom", can_resume=True, message="Run failed: boom")
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
    assert run.halt(run.record()) is False  # its lease is still alive
    clock.now += 60_000
    assert run.halt(run.record()) is True
    halted = run.record()
    assert (halted.status, halted.reason, halted.can_resume, halted.epoch, halted.attempt) == (
        "halted", "interrupted", True, 2, 1,
    )  # fmt: skip


def test_the_activation_lock_and_its_wake_flag() -> None:
    run = running()
    assert run.activate(1, "pass-2") == 30_000  # busy: the holder is told to run once more
    assert run.release("pass-1", 1) is True
    assert run.release("pass-1", 1) is False
    assert run.activate(1, "pass-2") == Flags()


def test_agent_turns_take_a_slot_under_the_concurrency_ceiling() -> None:
    run = running(limits={"max_total_subagents": 2, "max_concurrent_subagents": 1})
    journal = MemoryJournal(run, 1)
    for index, agent in enumerate(("x" * 32, "y" * 32)):
        row = schema.queued_agent_row(agent, None, None, 1, 5)
        journal.agent_call("m", index, agent, '{"prompt":"p"}', "m", row, None, f"message-{index}")
    assert run.agent_start(1, "x" * 32) == ("go", '{"prompt":"p"}')
    assert run.agent_start(1, "x" * 32) == ("wait", None)  # the same turn, delivered twice
    assert run.agent_start(1, "y" * 32) == ("wait", None)  # the ceiling
    assert run.agent_finish(1, "x" * 32, 'o"ok"', "{}", 7, 1, 2) == ["m"]
    assert run.agent_start(1, "x" * 32) == ("done", None)
    assert run.agent_start(1, "y" * 32)[0] == "go"
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
