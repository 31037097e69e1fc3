"""Task calls (``ctx.call``): call.lua and call_done.lua."""

from __future__ import annotations

import pytest

from celery_durable.broker import schema
from celery_durable.broker.connection import now_ms
from celery_durable.broker.journal import Conflict, Flags, TaskCall
from celery_durable.broker.schema import Identity, StepRow
from celery_durable.errors import StaleAttemptError
from tests.contract.conftest import BackendFactory
from tests.support.contract import CALL_RUNNING as RUNNING
from tests.support.contract import TIMED_OUT, call, ok
from tests.support.contract import call_failed as failed

pytestmark = pytest.mark.topologies("redis", "cluster")  # the journal on one Redis and on a Redis Cluster

NO_FLAGS = Flags()


def test_a_call_is_published_once_per_attempt_then_answered_from_the_journal(make_backend: BackendFactory) -> None:
    backend = make_backend()
    first = backend.journal(1)
    assert call(first, "render") == TaskCall("publish", NO_FLAGS)
    assert backend.step_rows()["render"] == RUNNING
    assert call(first, "render") == TaskCall("pending", NO_FLAGS), "in flight: waited for, not sent again"
    assert backend.waits()["m:0"] == {"owner": "m", "kind": "call", "name": "render"}
    assert backend.record().waiting_for is None, "a call is work of the fleet, not a wait for the outside"
    assert backend.call_done(1, "render", ok({"png": 1})) == ["m"]
    assert call(first, "render") == TaskCall("hit", NO_FLAGS, ok({"png": 1}))
    assert backend.waits() == {}
    assert backend.call_done(1, "render", ok("again"), prefix="again") is None, "a second answer is late"
    assert StepRow.parse("render", backend.step_rows()["render"]).status == "completed"
    assert first.read_sequence("m").live_entries() == [(Identity.call("render"), ok({"png": 1}))]


def test_a_call_past_its_time_out_fails_and_a_late_answer_is_refused(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    due = now_ms() + 60_000
    assert call(journal, "slow", due=due).verdict == "publish"
    backend.pass_time(120_000)
    assert call(journal, "slow", due=due) == TaskCall("hit", NO_FLAGS, TIMED_OUT)
    row = StepRow.parse("slow", backend.step_rows()["slow"])
    assert (row.status, row.error) == ("failed", "TaskTimeout: did not finish within 5 s")
    assert backend.call_done(1, "slow", ok("too late")) is None


def test_an_answer_for_an_older_attempt_is_refused_by_the_fence(make_backend: BackendFactory) -> None:
    backend = make_backend()
    assert call(backend.journal(1), "render").verdict == "publish"
    epoch = backend.take_over()
    with pytest.raises(StaleAttemptError):
        backend.call_done(1, "render", ok("old"))
    assert call(backend.journal(epoch), "render").verdict == "publish", "the new attempt publishes again"
    with pytest.raises(StaleAttemptError):
        backend.call_done(1, "render", ok("old"))
    assert backend.call_done(epoch, "render", ok("new")) == ["m"]


def test_a_failed_call_is_retried_by_the_next_attempt(make_backend: BackendFactory) -> None:
    backend = make_backend()
    assert call(backend.journal(1), "flaky").verdict == "publish"
    boom = failed(1, "KeyError", "'x'")
    assert backend.call_done(1, "flaky", boom, "KeyError: 'x'") == ["m"]
    assert call(backend.journal(1), "flaky") == TaskCall("hit", NO_FLAGS, boom)
    epoch = backend.take_over()
    second = backend.journal(epoch)
    assert isinstance(second.call("m", 0, "flaky", "m", None, "0:0", RUNNING, TIMED_OUT), TaskCall)
    assert call(second, "flaky").verdict in ("publish", "pending")


def test_a_call_that_timed_out_gets_a_due_time_of_its_own_from_the_attempt_that_calls_again(
    make_backend: BackendFactory,
) -> None:
    """SPEC 4, 5a: a resumed run calls a timed-out call again; attempt 1's due time,
    long past, is not the new attempt's (it would fail the call at once, unsent)."""
    backend = make_backend()
    start = now_ms()
    assert call(backend.journal(1), "slow", due=start + 60_000).verdict == "publish"
    backend.pass_time(120_000)
    assert call(backend.journal(1), "slow", due=start + 60_000) == TaskCall("hit", NO_FLAGS, TIMED_OUT)
    epoch = backend.take_over()
    second = backend.journal(epoch)
    own = start + 120_000 + 60_000
    timed_out = failed(epoch, "TaskTimeout", "did not finish within 5 s")
    assert second.call("m", 0, "slow", "m", own, "0:0", RUNNING, timed_out) == TaskCall("publish", NO_FLAGS)
    assert backend.waits()["m:0"]["until"] == own
    assert StepRow.parse("slow", backend.step_rows()["slow"]).status == "running"
    backend.pass_time(30_000)
    later = own + 30_000
    assert second.call("m", 0, "slow", "m", later, "0:0", RUNNING, timed_out) == TaskCall("pending", NO_FLAGS)
    assert backend.waits()["m:0"]["until"] == own, "a later pass of the attempt keeps the due time it fixed"
    backend.pass_time(30_000)
    assert second.call("m", 0, "slow", "m", later, None, RUNNING, timed_out) == TaskCall("hit", NO_FLAGS, timed_out)


def test_a_failed_call_called_again_is_timed_from_the_new_attempt(make_backend: BackendFactory) -> None:
    """A call whose task raised, past its time-out when the run is resumed: the
    new attempt sends it again rather than fail it as timed out."""
    backend = make_backend()
    start = now_ms()
    assert call(backend.journal(1), "flaky", due=start + 60_000).verdict == "publish"
    boom = failed(1, "KeyError", "'x'")
    assert backend.call_done(1, "flaky", boom, "KeyError: 'x'") == ["m"]
    backend.pass_time(120_000)
    epoch = backend.take_over()
    timed_out = failed(epoch, "TaskTimeout", "did not finish within 5 s")
    own = start + 120_000 + 60_000
    assert backend.journal(epoch).call("m", 0, "flaky", "m", own, "0:0", RUNNING, timed_out).verdict == "publish"
    assert backend.call_done(epoch, "flaky", ok("fine"), prefix="again") == ["m"]
    assert call(backend.journal(epoch), "flaky") == TaskCall("hit", NO_FLAGS, ok("fine"))


def test_a_call_where_the_journal_holds_another_op_is_a_conflict(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    assert call(journal, "a").verdict == "publish"
    assert call(journal, "b") == Conflict(Identity.call("a"))


def test_an_activation_reads_the_tail_a_kept_body_checks(make_backend: BackendFactory) -> None:
    """A pass woken for a body kept parked at a call takes the lock and reads
    the journal from that call on in one script: what read_sequence would say."""
    backend = make_backend()
    journal = backend.journal(1)
    assert call(journal, "render").verdict == "publish"
    assert backend.call_done(1, "render", ok({"png": 1})) == ["m"]
    activation = backend.activate_reading("pass-1", "m", 0)
    assert activation == (NO_FLAGS, journal.read_sequence("m", start=0))
    assert not isinstance(activation, int)
    assert activation[1].entries == [(1, Identity.call("render"), ok({"png": 1}))]
    assert backend.field("run", "lock") == "pass-1"
    busy = backend.activate_reading("pass-2", "m", 1)
    assert isinstance(busy, int) and 0 < busy <= 30_100, "the lock is busy: nothing read"
    assert backend.release("pass-1"), "the busy activation asked the holder to run once more"


def test_an_answer_that_wakes_the_main_body_alone_takes_its_pass_in_the_same_script(
    make_backend: BackendFactory,
) -> None:
    """``call_done`` asked to run the main body's pass here: the answer is
    journaled, and its wake's lock is taken and the tail read, as
    ``activate_reading`` would after it; a busy lock says so instead."""
    backend = make_backend()
    journal = backend.journal(1)
    assert call(journal, "render").verdict == "publish"
    done = backend.call_done_here("render", ok({"png": 1}), "wake-1", "m", 0)
    assert done is not None and done.owners == ["m"]
    assert done.activation == (NO_FLAGS, journal.read_sequence("m", start=0))
    assert backend.field("run", "lock") == "wake-1"
    assert backend.live()["wake-1"].startswith("x|"), "the wake's message is running, as activate marks it"
    second = journal.call("m", 1, "resize", "m", None, None, RUNNING, TIMED_OUT)
    assert isinstance(second, TaskCall) and second.verdict == "publish"
    busy = backend.call_done_here("resize", ok(2), "next-1", "m", 1)
    assert busy is not None and busy.owners == ["m"]
    assert isinstance(busy.activation, int) and 0 < busy.activation <= 30_100, "the lock is busy"
    assert "next-1" not in backend.live() and backend.live()["resend"].startswith("q|c|"), "its message comes later"
    assert backend.release("wake-1"), "the holder runs once more"
    again = journal.call("m", 1, "resize", "m", None, None, RUNNING, TIMED_OUT)
    assert again == TaskCall("hit", NO_FLAGS, ok(2)), "the answer was journaled all the same"


def test_an_answer_waiting_for_a_pass_of_its_own_process_leaves_a_busy_lock_alone(
    make_backend: BackendFactory,
) -> None:
    """Soft: the pass holding the lock runs in the answer's process, which
    waits for it and activates after; nothing asks that pass to run again."""
    backend = make_backend()
    journal = backend.journal(1)
    assert backend.activate("pass-1") == NO_FLAGS
    assert call(journal, "render").verdict == "publish"
    done = backend.call_done_here("render", ok(1), "wake-1", "m", 0, soft=True)
    assert done is not None and (done.owners, done.activation) == (["m"], None), "journaled, no pass taken"
    assert backend.field("run", "lock") == "pass-1"
    assert backend.field("run", "wake") in (None, "", "0"), "the holder is not asked to run again"
    assert backend.live()["wake-1"].startswith("q|c|"), "the wake is still to come, and no resend is queued"
    assert "resend" not in backend.live()
    assert not backend.release("pass-1")
    assert backend.activate_reading("wake-1", "m", 0) == (NO_FLAGS, journal.read_sequence("m", start=0))


def test_a_wake_sent_home_and_not_started_goes_to_the_coordinator_queue_once(make_backend: BackendFactory) -> None:
    """The home worker did not start the wake in time: its entry is replaced
    by the new message's, queued now, so liveness judges that one; a wake
    that started, another attempt's, or a paused run's is left alone."""
    backend = make_backend()
    journal = backend.journal(1)
    assert backend.activate("pass-1") == NO_FLAGS
    assert call(journal, "render").verdict == "publish"
    assert not backend.release("pass-1")
    assert backend.call_done(1, "render", ok(1), prefix="home") == ["m"]
    assert backend.live()["home-1"].startswith("q|c|")
    assert not backend.requeue(2, "home-1", "again"), "another attempt's wake"
    backend.settle("paused")
    assert not backend.requeue(1, "home-1", "again"), "a paused run waits for no wake"
    backend.settle("running")
    assert backend.requeue(1, "home-1", "again")
    assert "home-1" not in backend.live() and backend.live()["again"].startswith("q|c|")
    assert not backend.requeue(1, "home-1", "twice"), "redirected once"
    assert backend.activate("again") == NO_FLAGS
    assert not backend.requeue(1, "again", "late"), "started: nothing to redirect"
    assert backend.live()["again"].startswith("x|") and "late" not in backend.live()


def test_an_answer_takes_no_pass_for_a_paused_run_or_a_branch(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    fanout = schema.call_id("m", 5)
    seq, owner = schema.branch_seq_of(fanout, 0), schema.branch_owner(fanout, 0)
    assert journal.call(seq, 0, "leaf", owner, None, None, RUNNING, TIMED_OUT).verdict == "publish"
    done = backend.call_done_here("leaf", ok(1), "wake-1", "m", 0)
    assert done is not None and (done.owners, done.activation) == ([owner], None)
    assert call(journal, "render").verdict == "publish"
    backend.settle("paused")
    paused = backend.call_done_here("render", ok(2), "wake2-1", "m", 0)
    assert paused is not None and (paused.owners, paused.activation) == (["m"], None)
    assert backend.field("run", "lock") in (None, ""), "no lock taken"
    assert backend.call_done_here("render", ok(3), "wake3-1", "m", 0) is None, "a second answer is late"
