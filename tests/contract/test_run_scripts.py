"""The run-lifecycle scripts on a real Redis: activate and release, heartbeat,
finish, resume (and recovery), halt, cancel and pause, branch_start and
task_end, agent_start and agent_finish, received and mark_lost, and the
liveness that examine.lua judges from them.

(The journal scripts, signal and examine's timers are in ``test_journal``,
``test_calls`` and ``test_waits``.) Time is a clock this module moves: the
store tells every script its time.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from celery_durable import WorkflowContext, workflow
from celery_durable.broker import RunRecord, RunStore, schema
from celery_durable.broker.journal import BeginCall, Conflict, Flags, LastWrites
from celery_durable.broker.replies.control import Requested, RequestVerdict
from celery_durable.broker.replies.fleet import Examined, Liveness
from celery_durable.broker.replies.run import NotRun, Renewal, TurnStart, TurnVerdict
from celery_durable.broker.replies.shape import Refusal
from celery_durable.broker.run_records import RunHashes
from celery_durable.broker.schema import position
from celery_durable.config import Settings
from celery_durable.errors import StepFailed
from celery_durable.testing.server import environment_redis_url
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.limits import ceiling_fields, merge_limits
from tests.support.contract import RUNNING, ok, step


@workflow(name="lifecycle", description="A run to settle, cancel and resume", phases=[])
def lifecycle(ctx: WorkflowContext) -> Any:
    return None


class Clock:
    def __init__(self) -> None:
        self.now = 10_000

    def __call__(self) -> int:
        return self.now


class Run:
    """One run on a store of its own, created as the client creates one,
    with its first coordinator message named ``message``."""

    def __init__(
        self, clock: Clock, message: str, limits: dict[str, Any] | None = None, progress_max: int = 0
    ) -> None:
        settings = Settings(redis_url=environment_redis_url(), key_prefix=f"l{uuid.uuid4().hex[:12]}")
        self.store = RunStore(settings, clock=clock)
        self.clock = clock
        self.run_id = uuid.uuid4().hex
        effective = merge_limits({}, limits)
        fields = schema.new_run_fields(
            run_id=self.run_id,
            workflow=lifecycle.name,
            namespace="default",
            args_json="{}",
            limits_json=jsonvalue.dumps(effective),
            code_hash=lifecycle.code_hash,
            created_ms=clock(),
            lease_ms=self.store.lease_ms,
            idempotency_key=None,
            progress_max=progress_max,
            ceilings=ceiling_fields(effective),
        )
        assert self.store.create_run(self.run_id, fields, message)

    @property
    def state(self) -> RunHashes:
        return self.store.hashes(self.run_id)

    def record(self) -> RunRecord:
        record = self.store.load_run(self.run_id)
        assert record is not None
        return record

    def examine(self, room: str = "") -> Examined:
        examined = self.store.examine(self.run_id, room)
        assert examined is not None
        return examined

    def resume(self, record: RunRecord, message: str, message_id: str = "", recovery: bool = False) -> int | None:
        return self.store.resume(
            record, limits_json="", message=message, code_hash="", message_id=message_id, recovery=recovery
        )

    def system_records(self) -> list[str]:
        page = self.store.progress_page(self.run_id, "", "after", 0, 500)
        return [r.message for r in page.records if r.kind == "system"]


def running(clock: Clock | None = None, **options: Any) -> Run:
    """A run whose first pass (message "pass-1") holds the lock."""
    run = Run(clock or Clock(), "pass-1", **options)
    assert run.state.live == {"pass-1": "q|c|10000"}
    assert run.store.activate(run.run_id, 1, "pass-1", "default", "resend") == Flags()
    assert run.state.live == {"pass-1": "x|40000"}
    return run


def test_resume_bumps_the_epoch_and_interrupts_what_the_old_attempt_left_running() -> None:
    run = running()
    journal = run.store.journal(run.run_id, 1, "default")
    journal.begin("m", BeginCall(step_key="slow", step_row=schema.StepRow.running(1, 5).encode()))
    row = schema.queued_agent_row("t", None, None, 1, 5)
    journal.agent_call("m", 1, "t" * 32, '{"prompt":"p"}', "m", row, None, "")
    record = run.record()
    assert run.resume(record, "Run recovered") == 2
    assert run.resume(record, "again") is None  # compare-and-set
    assert schema.StepRow.parse("slow", run.store.step_rows(run.run_id)["slow"]).status == "interrupted"
    assert schema.parse_agent_row(run.store.agent_rows(run.run_id)["t" * 32 + "@1"])["status"] == "interrupted"
    fresh = run.record()
    assert (fresh.epoch, fresh.attempt, fresh.status, fresh.steps_running) == (2, 2, "running", 0)
    assert run.system_records() == ["Attempt 1 started", "Run recovered (attempt 2)"]


def test_a_recovery_requires_a_dead_attempt_and_keeps_the_requests() -> None:
    clock = Clock()
    run = running(clock)
    run.store.cancel(run.run_id, "default", "cancel-1")
    assert run.resume(run.record(), "m", "first-2", recovery=True) is None  # its pass still renews its message
    clock.now += 30_001  # the pass's heartbeat stopped a lease ago
    assert run.examine().verdict is Liveness.DEAD
    assert run.resume(run.record(), "m", "first-2", recovery=True) == 2
    assert run.record().cancel_requested
    assert run.state.run["recoveries"] == "1"
    assert run.state.live == {"first-2": f"q|c|{clock.now}"}  # the old attempt's messages are forgotten


def test_a_queued_message_is_dead_once_its_queue_emptied_without_it_starting() -> None:
    clock = Clock()
    run = Run(clock, "first")
    assert run.examine("c=9000").verdict is Liveness.ALIVE  # the queue was last empty before the message was sent
    clock.now += 2_500
    assert run.examine("c=12100").verdict is Liveness.ALIVE  # emptied since: some worker took it, give it time to start
    clock.now += 5_000
    examined = run.examine("c=12100")
    assert (examined.verdict, examined.detail) == ("dead", "task first left its queue and never started")


def test_a_message_its_worker_received_waits_for_a_slot_until_that_worker_dies() -> None:
    clock = Clock()
    run = Run(clock, "first")
    run.store.hold_messages("worker-1", [("first", run.run_id)], clock())
    run.store.hold_messages("worker-1", [("unknown", run.run_id)], clock())
    assert run.state.live == {"first": "q|c|10000|held 10000"}
    clock.now += 20_000
    assert run.examine("c=10500").verdict is Liveness.ALIVE  # not the empty-queue rule's: its worker has it
    assert run.store.mark_lost(run.run_id, ["first"]) == 1
    assert run.examine().detail == "the worker holding task first died"


def test_a_received_message_that_never_starts_is_dead_a_lease_later() -> None:
    clock = Clock()
    run = Run(clock, "first")
    run.store.hold_messages("worker-1", [("first", run.run_id)], clock())
    clock.now += 29_999
    assert run.examine().verdict is Liveness.ALIVE
    clock.now += 1
    assert run.examine().detail == "task first was received and never started"


def test_a_message_held_by_a_dead_worker_is_lost() -> None:
    run = Run(Clock(), "first")
    assert run.store.mark_lost(run.run_id, ["first", "unknown"]) == 1
    assert run.examine() == Examined("pending", 1, "lifecycle", Liveness.DEAD, "the worker holding task first died")
    other = running()
    assert other.store.mark_lost(other.run_id, ["pass-1"]) == 0  # a running message is judged by its own heartbeat


def test_finish_settles_and_fences_everything_after() -> None:
    run = running()
    store = run.store
    store.finish(run.run_id, 1, "default", "error", reason="exception", error="boom", can_resume=True,
                 message="Run failed: boom")  # fmt: skip
    assert run.state.live == {} and run.examine().verdict is Liveness.SETTLED
    record = run.record()
    assert (record.status, record.reason, record.can_resume, record.has_result) == ("error", "exception", True, False)
    assert run.system_records()[-1] == "Run failed: boom"
    # A settled, resumable run is cancelled at once.
    assert store.cancel(run.run_id, "default", "") == Requested(RequestVerdict.CANCELLED)
    cancelled = run.record()
    assert (cancelled.status, cancelled.epoch, cancelled.attempt) == ("cancelled", 2, 1)
    assert store.cancel(run.run_id, "default", "") == Requested(RequestVerdict.SETTLED, status="cancelled")
    assert store.pause(run.run_id, "default", "") == Requested(RequestVerdict.SETTLED, status="cancelled")


def test_finish_writes_the_passes_last_writes_first_or_hands_them_back_untouched() -> None:
    """``finish`` given a pass's ``LastWrites``: the step it held back and its
    buffered progress are journaled by the script that settles the run (one
    round trip for both). A cancel the settlement was decided without, or a
    step whose op conflicts with the journal, settles nothing and writes
    nothing: the pass writes them as one that does not settle, and decides again."""
    run = running()
    store, run_id = run.store, run.run_id
    journal = store.journal(run_id, 1, "default")
    journal.begin("m", BeginCall(step_key="only", step_row=RUNNING))
    records = [(position(1, 1), "log", "", "last words")]
    last = LastWrites("m", step(0, "only", ok(7)), BeginCall(records=records), knew_cancel=False)

    assert store.cancel(run_id, "default", "c-1").verdict is RequestVerdict.REQUESTED
    before = run.state
    assert store.finish(run_id, 1, "default", "completed", message="Run completed", last=last) is False
    assert run.state == before and run.record().status == "running"

    clash = dataclasses.replace(last, commit=step(0, "other", ok(7)), knew_cancel=True)
    journal.record("m", step(0, "only", ok(7)))  # the journal holds another op at m:0
    before = run.state
    assert store.finish(run_id, 1, "default", "cancelled", message="Run cancelled", last=clash) is False
    assert run.state == before and run.record().status == "running"


def test_finish_journals_the_step_and_the_progress_it_is_given_before_it_settles() -> None:
    run = running()
    store, run_id = run.store, run.run_id
    store.journal(run_id, 1, "default").begin("m", BeginCall(step_key="only", step_row=RUNNING))
    records = [(position(1, 1), "log", "", "last words")]
    last = LastWrites("m", step(0, "only", ok(7)), BeginCall(records=records), knew_cancel=False)
    assert store.finish(run_id, 1, "default", "completed", message="Run completed", last=last) is True
    state = run.state
    assert state.journal[schema.step_field("only")] == ok(7) and state.running == {}
    assert schema.StepRow.parse("only", state.steps["only"]).status == "completed"
    page = store.progress_page(run_id, "", "after", 0, 500)
    assert [r.message for r in page.records][-2:] == ["last words", "Run completed"]
    assert run.record().status == "completed"


def test_halt_stops_a_run_whose_attempt_died() -> None:
    clock = Clock()
    run = running(clock)
    assert run.store.halt(run.record()) is False  # its pass still renews its message
    clock.now += 60_000
    assert run.store.halt(run.record()) is True
    halted = run.record()
    assert (halted.status, halted.reason, halted.can_resume, halted.epoch, halted.attempt) == (
        "halted", "interrupted", True, 2, 1,
    )  # fmt: skip


def test_the_activation_lock_and_its_wake_flag() -> None:
    run = running()
    store, run_id = run.store, run.run_id
    store.client.hset(store.run_keys(run_id).live, "pass-2", "q|c|10000")
    # Busy: the holder is told to run once more; this message comes back when the lock would expire.
    assert store.activate(run_id, 1, "pass-2", "default", "pass-3") == 30_100
    assert run.state.live == {"pass-1": "x|40000", "pass-3": "q|c|40100"}
    assert store.release(run_id, "pass-1", 1) is True
    assert store.release(run_id, "pass-1", 1) is False
    assert run.state.live == {"pass-3": "q|c|40100"}
    assert store.activate(run_id, 1, "pass-3", "default", "pass-4") == Flags()


def test_an_activation_that_reads_the_run_checks_the_message_as_the_read_would() -> None:
    """``activate_unread``: a coordinator message that names its namespace
    takes the lock and gets the run in one script; what ``_load`` refused
    is refused by the script before it writes anything."""
    run = Run(Clock(), "pass-1")
    store, run_id = run.store, run.run_id
    before = store.client.hgetall(store.run_keys(run_id).run)
    assert store.activate_unread(run_id, 2, lifecycle.name, "default", "pass-1", "r") is NotRun.STALE
    assert store.activate_unread(run_id, 1, "another", "default", "pass-1", "r") is NotRun.FORGED
    # Another namespace named: nothing is refused, the pass reads the run and activates as before.
    assert store.activate_unread(run_id, 1, lifecycle.name, "other", "pass-1", "r") is NotRun.READ
    # A process that never met the run takes the message's word for its namespace (no read of its
    # own for the indexes' sake), and forgets it unless the script checked it.
    fresh = RunStore(store.settings, clock=run.clock)
    assert fresh.activate_unread(run_id, 1, lifecycle.name, "other", "pass-1", "r") is NotRun.READ
    assert fresh.indexes.known(run_id) is None
    unchanged = store.client.hgetall(store.run_keys(run_id).run)
    assert {k: v for k, v in unchanged.items() if k != "refused"} == before  # the stale one was counted only
    assert store.activate_unread(uuid.uuid4().hex, 1, lifecycle.name, "default", "x", "r") is NotRun.MISSING
    found = store.activate_unread(run_id, 1, lifecycle.name, "default", "pass-1", "r")
    assert isinstance(found, tuple)
    flags, record, tail = found
    assert flags == Flags()
    # The record as a read just before the lock would have found it: the attempt not yet started.
    assert (record.run_id, record.status, record.epoch, record.workflow) == (run_id, "pending", 1, lifecycle.name)
    assert record.started_at is None and run.record().status == "running"
    assert (tail.start, tail.entries) == (0, [])
    assert fresh.indexes.known(run_id) is None and store.indexes.known(run_id) == "default"
    assert run.state.live == {"pass-1": "x|40000"}
    # Busy for another message, as activate: the ms until its resend is due.
    store.client.hset(store.run_keys(run_id).live, "pass-2", "q|c|10000")
    assert store.activate_unread(run_id, 1, lifecycle.name, "default", "pass-2", "pass-3") == 30_100


def test_an_activation_that_reads_the_run_leaves_a_throttled_attempt_without_its_slot_to_the_read() -> None:
    run = Run(Clock(), "pass-1")
    store, run_id = run.store, run.run_id
    store.client.hset(store.run_keys(run_id).run, mapping={"throttle": "api", "slot": ""})
    assert store.activate_unread(run_id, 1, lifecycle.name, "default", "pass-1", "r") is NotRun.READ
    assert run.record().status == "pending"
    store.client.hset(store.run_keys(run_id).run, "slot", "1")
    assert isinstance(store.activate_unread(run_id, 1, lifecycle.name, "default", "pass-1", "r"), tuple)


def test_active_time_runs_only_while_a_message_is_in_flight() -> None:
    clock = Clock()
    run = running(clock, limits={"timeout_seconds": 60})
    store, run_id = run.store, run.run_id
    clock.now += 10_000
    assert store.release(run_id, "pass-1", 1) is False
    assert (run.state.run["active_ms"], run.state.run["active_since"]) == ("10000", "")
    clock.now += 3_600_000  # an hour with nothing in flight: a wait, not work
    # A wake-up (here a branch task, counted in flight as it is sent) starts the clock again.
    journal = store.journal(run_id, 1, "default")
    journal.dispatch("m", 0, "p|1", 1, "execution", schema.position(0, 0))
    journal.sending("m:0", ["branch-1"])
    started = store.branch_start(run_id, 1, lifecycle.name, "branch-1", "m:0", [0], [])
    assert not isinstance(started, Refusal) and started.flags == Flags()
    clock.now += 5_000
    store.task_end(run_id, 1, "branch-1")
    assert run.state.run["active_ms"] == "15000"
    assert store.heartbeat(run_id, 1, "gone", wake="wake-1") == Renewal(Flags())  # not in flight: not renewed
    assert run.state.live == {}
    journal.sending("m:0", ["branch-2"])
    assert not isinstance(store.branch_start(run_id, 1, lifecycle.name, "branch-2", "m:0", [0], []), Refusal)
    clock.now += 50_000
    # A ceiling newly reached by a task other than the coordinator wakes the coordinator.
    assert store.heartbeat(run_id, 1, "branch-2", wake="wake-2") == Renewal(Flags(limit="timeout_seconds"), wake=True)
    assert run.state.live["wake-2"] == f"q|c|{clock.now}"
    assert store.heartbeat(run_id, 1, "branch-2", wake="wake-3") == Renewal(Flags(limit="timeout_seconds"))


WAIT = TurnStart(TurnVerdict.WAIT)


def test_agent_turns_take_a_slot_under_the_concurrency_ceiling() -> None:
    run = running(limits={"max_total_subagents": 2, "max_concurrent_subagents": 1})
    store, run_id = run.store, run.run_id
    journal = store.journal(run_id, 1, "default")
    for index, agent in enumerate(("x" * 32, "y" * 32)):
        row = schema.queued_agent_row(agent, None, None, 1, 5)
        journal.agent_call("m", index, agent, '{"prompt":"p"}', "m", row, None, f"turn-{agent[0]}")
    assert store.agent_start(run_id, 1, "x" * 32, "turn-x", "", 0) == TurnStart(TurnVerdict.GO, '{"prompt":"p"}')
    assert store.agent_start(run_id, 1, "x" * 32, "again-x", "later-x", 200) == WAIT  # the same turn
    assert store.agent_start(run_id, 1, "y" * 32, "turn-y", "later-y", 200) == WAIT  # the ceiling
    assert {task: value[:2] for task, value in run.state.live.items() if task != "pass-1"} == {
        "turn-x": "x|", "later-x": "q|", "later-y": "q|",
    }  # fmt: skip
    assert run.state.live["later-y"] == "q|a|10200"
    assert store.agent_finish(run_id, 1, "x" * 32, 'o"ok"', "{}", (7, 1, 2), "turn-x", "woken").owners == ["m"]
    assert "turn-x" not in run.state.live and run.state.live["woken-1"] == "q|c|10000"
    assert store.agent_start(run_id, 1, "x" * 32, "later-x", "", 0) == TurnStart(TurnVerdict.DONE)
    assert store.agent_start(run_id, 1, "y" * 32, "later-y", "", 0).verdict is TurnVerdict.GO
    record = run.record()
    assert (record.agents_done, record.agents_running, record.credits_nano) == (1, 1, 7)


def test_progress_keeps_the_newest_records_when_bounded() -> None:
    run = running(progress_max=3)
    journal = run.store.journal(run.run_id, 1, "default")
    records = [(schema.position(0, n), "log", "", f"line {n}") for n in range(5)]
    journal.begin("m", BeginCall(records=records))
    page = run.store.progress_page(run.run_id, "", "newest", 0, 10)
    assert ([r.seq for r in page.records], page.oldest, page.newest, page.revision) == ([4, 5, 6], 4, 6, 6)
    before = run.store.progress_page(run.run_id, "", "before", 6, 1)
    assert [r.message for r in before.records] == ["line 3"]


def test_a_wait_for_a_signal_reads_only_the_signals_no_wait_has_taken() -> None:
    """take_signal walked every signal of the name the run ever received,
    Redis blocked meanwhile: 7.9 ms a wait after 1,000 (issue 25 item 8)."""
    run = running()
    store, run_id = run.store, run.run_id
    journal = store.journal(run_id, 1, "default")
    for n in range(300):
        assert store.signal(run_id, "default", "tick", str(n), f"s{n}").verdict == "ok"

    def take(index: int) -> str | None:
        result = journal.wait("m", index, schema.Identity.signal("tick"), "signal", "tick", None, "m")
        assert not isinstance(result, Conflict)
        return result.outcome

    for index in range(299):
        assert take(index) == f'{{"received":true,"index":{index + 1},"payload":{index}}}'
    before = store.client.info("commandstats")["cmdstat_hget"]["calls"]
    assert take(299) == '{"received":true,"index":300,"payload":299}'
    used = store.client.info("commandstats")["cmdstat_hget"]["calls"] - before
    assert used < 40, f"the 300th wait read {used} fields: it walked the signals taken before it"


def test_a_signal_to_a_settled_run_goes_with_the_runs_retention() -> None:
    clock = Clock()
    run = running(clock)
    store, keys = run.store, run.store.run_keys(run.run_id)
    clock.now += 60_000
    assert store.halt(run.record()) is True
    assert store.client.pttl(keys.run) > 0, "a halted run counts down its retention"
    assert store.signal(run.run_id, "default", "late", '"hello"', "s").verdict == "ok"
    # Absolute expiry times: two PTTL reads in a row differ by the time between them.
    expires = store.client.pexpiretime(keys.run)
    assert expires > 0
    assert 0 < store.client.pexpiretime(keys.signals) <= expires + 1
    assert 0 < store.client.pexpiretime(keys.history) <= expires + 1, "its history event goes with it too"


def test_messages_the_broker_refused_are_forgotten_and_what_was_recorded_for_them_undone() -> None:
    """unsent.lua (issue 25 item 2): counted in flight and never published, a
    message kept the run looking alive and its active-time clock running."""
    run = running()
    store, run_id = run.store, run.run_id
    journal = store.journal(run_id, 1, "default")
    journal.dispatch("m", 0, "p|2", 2, "execution", schema.position(0, 0))
    journal.sending("m:0", ["t0", "t1"])
    journal.hand_off("m:0", "t0", [1], ["t2"])
    assert journal.handed_off("m:0", "t0") == [1]
    journal.unsent(["t2"], call="m:0", giver="t0")
    assert "t2" not in run.state.live and journal.handed_off("m:0", "t0") == [], "t0 runs branch 1 itself"
    row = schema.StepRow.running(1, 1000, "m:1").encode()
    timed_out = schema.failure_outcome(1, StepFailed("render", "TaskTimeout", "late", found_by_engine=True)).encode()
    assert journal.call("m", 1, "render", "m", None, None, row, timed_out).verdict == "publish"
    assert journal.call("m", 1, "render", "m", None, None, row, timed_out).verdict == "pending"
    journal.unsent([], call_key="render")
    assert journal.call("m", 1, "render", "m", None, None, row, timed_out).verdict == "publish", "sent again"
    store.release(run_id, "pass-1", 1)
    journal.unsent(["t0", "t1", "unknown"])
    assert run.state.live == {} and run.state.run["active_since"] == "", "nothing in flight: no active time"


def test_a_look_at_a_queue_between_a_messages_count_and_its_publish_does_not_lose_it() -> None:
    """Counted at 10 000, published a moment later: a sweep that found the queue
    empty in between marked it gone, and the run was taken over 5 s later
    (issue 25 item 3). A look is taken against a message 2 s after it was due."""
    clock = Clock()
    run = Run(clock, "first")
    assert run.examine("c=10500").verdict == "alive"
    clock.now += 6_000
    assert run.examine("c=10500").verdict == "alive", "the look came before its publish"
    assert run.state.live["first"] == "q|c|10000"
    assert run.examine("c=12500").verdict == "alive"  # empty well after: some worker took it
    clock.now += 5_000
    assert run.examine("c=12500").detail == "task first left its queue and never started"


def test_a_request_with_nothing_in_flight_to_act_on_it_is_not_a_wait() -> None:
    """A cancel whose coordinator message was never sent, of a run waiting for a
    signal: waiting would leave it unheard, so the sweep takes the run over
    (and the take-over keeps the request)."""
    run = running()
    store, run_id = run.store, run.run_id
    journal = store.journal(run_id, 1, "default")
    journal.wait("m", 0, schema.Identity.signal("go"), "signal", "go", None, "m")
    store.release(run_id, "pass-1", 1)
    assert run.examine().verdict == "waiting"
    store.cancel(run_id, "default", "cancel-1")
    journal.unsent(["cancel-1"])
    examined = run.examine()
    assert examined.verdict == "dead"
    assert examined.detail == "a cancel it was asked for has nothing in flight to act on it"


def test_without_auto_recovery_a_lost_coordinator_message_is_sent_again_but_a_death_still_halts() -> None:
    """The sweep with auto_recover off (``examine_each(resend=True)``): a
    coordinator message lost before it started, or the one a cancel with
    nothing in flight lacks, is no death of the attempt: the main body is woken
    again at the same epoch in its place. A running message whose heartbeat
    stopped is a death, whichever entry the script reads first; so is a lost
    branch message, which only its sender could build again."""
    clock = Clock()
    run = running(clock)
    store, run_id = run.store, run.run_id
    store.journal(run_id, 1, "default").wait("m", 0, schema.Identity.signal("go"), "signal", "go", None, "m")
    store.release(run_id, "pass-1", 1)
    store.pause(run_id, "default", "pause-1")  # its caller died before it published the wake
    clock.now += 2_500
    assert run.examine("c=12100").verdict is Liveness.ALIVE  # found gone
    clock.now += 5_000
    assert run.examine("c=12100").detail == "task pause-1 left its queue and never started"  # the sweep's own view
    [again] = store.examine_each([run_id], "c=12100", ["w"], resend=True)
    assert isinstance(again, Examined)
    assert (again.verdict, again.epoch, again.woken) == (Liveness.ALIVE, 1, ["m"])
    assert run.state.live == {"w-1": f"q|c|{clock.now}"} and run.record().pause_requested

    asked = running()
    journal = asked.store.journal(asked.run_id, 1, "default")
    journal.wait("m", 0, schema.Identity.signal("go"), "signal", "go", None, "m")
    asked.store.release(asked.run_id, "pass-1", 1)
    asked.store.cancel(asked.run_id, "default", "cancel-1")
    journal.unsent(["cancel-1"])  # forgotten, as an engine with auto_recover on forgets a refused one
    [woken] = asked.store.examine_each([asked.run_id], "", ["w"], resend=True)
    assert isinstance(woken, Examined) and (woken.verdict, woken.woken) == (Liveness.ALIVE, ["m"])

    died = Run(Clock(), "first")  # queued, listed before the pass below
    died.store.activate(died.run_id, 1, "pass-2", "default", "resend")
    died.clock.now += 2_500
    died.examine("c=12100")
    died.clock.now += 30_000  # "first" lost, and pass-2's heartbeat stopped
    [dead] = died.store.examine_each([died.run_id], "c=12100", ["w"], resend=True)
    assert isinstance(dead, Examined)
    assert (dead.verdict, dead.detail, dead.woken) == (Liveness.DEAD, "its worker stopped renewing task pass-2", [])

    branch = Run(Clock(), "first")
    branch.store.client.hset(branch.store.run_keys(branch.run_id).live, "first", "q|s|10000")
    branch.clock.now += 2_500
    branch.examine("s=12100")
    branch.clock.now += 5_000
    [lost] = branch.store.examine_each([branch.run_id], "s=12100", ["w"], resend=True)
    assert isinstance(lost, Examined)
    assert (lost.verdict, lost.detail) == (Liveness.DEAD, "task first left its queue and never started")


def test_a_look_asked_for_while_the_sweep_looks_outlives_its_verdict() -> None:
    """The sweep claims a run, finds it waiting with nothing due, and drops it
    from its schedule (``looked.lua``): unless, meanwhile, a script that counts
    a wake had its look scheduled first (``look.lua``) — a signal's, whose
    caller may die before it publishes the wake."""
    run = Run(Clock(), "first")
    store, due = run.store, run.store.keys.sweep_due
    sweep_due = lambda: store.client.zscore(due, run.run_id)  # noqa: E731
    assert sweep_due() == 10_000 + store.lease_ms, "create_run had its look scheduled first"

    claimed = store.claim_due(10_000 + store.lease_ms, 10, 15_000)
    assert claimed.runs == [run.run_id]
    store.looked(claimed.claim, {}, [run.run_id])
    assert sweep_due() is None, "a run left as claimed takes the sweep's verdict"

    store.schedule_check(run.run_id, 0)
    claimed = store.claim_due(10_000, 10, 15_000)
    run.clock.now = 20_000
    store.look([run.run_id], run.clock.now + store.lease_ms)  # a signal's look, after the examine
    assert sweep_due() == 20_000 + store.lease_ms, "a look replaces a claim, though later than it"
    store.looked(claimed.claim, {}, [run.run_id])
    assert sweep_due() == 20_000 + store.lease_ms, "the stale verdict kept the look asked for"
    store.looked(claimed.claim, {run.run_id: 21_000}, [])
    assert sweep_due() == 21_000, "a verdict of a sooner look still takes the sooner one"
    store.look([run.run_id], 90_000)
    assert sweep_due() == 21_000, "a look never puts off a sooner one"


def test_a_script_that_ran_beside_a_look_not_yet_loaded_is_not_run_again() -> None:
    """A fresh Redis where another process loaded ``create_run`` but nobody
    yet ``look``: the pipelined look fails, the script runs; the store loads
    the look and keeps the script's answer, never running it a second time
    (which would answer that the run existed already)."""
    from celery_durable.local.redis_server import RedisServer

    with RedisServer() as server:
        settings = Settings(redis_url=server.url, key_prefix=f"l{uuid.uuid4().hex[:12]}")
        store = RunStore(settings, clock=Clock())
        store.client.script_load(store._scripts["create_run"].script)
        run_id = uuid.uuid4().hex
        fields = schema.new_run_fields(
            run_id=run_id, workflow=lifecycle.name, namespace="default", args_json="{}",
            limits_json=jsonvalue.dumps(merge_limits({}, None)), code_hash=lifecycle.code_hash,
            created_ms=10_000, lease_ms=store.lease_ms, idempotency_key=None, progress_max=0,
            ceilings=ceiling_fields(merge_limits({}, None)),
        )  # fmt: skip
        assert store.create_run(run_id, fields, "first") is True
        assert store.client.zscore(store.keys.sweep_due, run_id) == 10_000 + store.lease_ms
