"""Durable waits: ``Journal.wait`` (wait.lua), delivering a signal (signal.lua)
and firing due timers (examine.lua).

Time passes through ``Backend.pass_time``: the store's clock moves on, and
every script is told the later time.
"""

from __future__ import annotations

import pytest

from celery_durable.broker.connection import now_ms
from celery_durable.broker.journal import BeginCall, Conflict, Flags, Journal, WaitResult
from celery_durable.broker.replies.control import Signalled, SignalVerdict
from celery_durable.broker.schema import Identity, cut_argument, position
from celery_durable.errors import StaleAttemptError
from tests.contract.conftest import Backend, BackendFactory
from tests.support.contract import RUNNING, failed, ok, started, step
from tests.support.index_check import disagreements

pytestmark = pytest.mark.topologies("redis", "cluster")  # the journal on one Redis and on a Redis Cluster

NO_FLAGS = Flags()
HOUR = 3_600_000
FIRED = '{"fired":true}'
TIMED_OUT = '{"received":false,"payload":null}'


def received(index: int, payload: str) -> str:
    return f'{{"received":true,"index":{index},"payload":{payload}}}'


def sleep(journal: Journal, seq: str, index: int, due: int | None, owner: str = "m") -> WaitResult | Conflict:
    return journal.wait(seq, index, Identity.SLEEP, "timer", "", due, owner)


def wait_for(
    journal: Journal, seq: str, index: int, name: str, due: int | None = None, owner: str = "m"
) -> WaitResult | Conflict:
    return journal.wait(seq, index, Identity.signal(name), "signal", name, due, owner)


def fire(backend: Backend, prefix: str = "fire") -> list[str]:
    """The sweep's look at the run: the owners whose timers fired."""
    return backend.examine(fire_prefix=prefix).woken


# -- timers ---------------------------------------------------------------------------------


def test_the_sweep_fires_a_batch_of_runs_timers_in_one_pipeline_as_it_would_one_by_one(
    make_backend: BackendFactory,
) -> None:
    """``examine_each``: one script per run (each in its own slot), one round
    trip; each run's wakes named by its own prefix, a run gone answered None."""
    first, second = started(make_backend), started(make_backend)
    due = now_ms() + HOUR
    for backend in (first, second):
        assert sleep(backend.journal(1), "m", 0, due) == WaitResult(False, NO_FLAGS, due=due)
    first.pass_time(HOUR)  # the store that sweeps: its clock has both timers due
    store = first.store  # type: ignore[attr-defined]
    gone = "0" * 32
    looks = store.examine_each([first.run_id, second.run_id, gone], "", ["a", "b", "c"])
    assert [look.woken if look else look for look in looks] == [["m"], ["m"], None]
    assert all(look.verdict == "alive" for look in looks[:2])
    assert first.live()["a-1"].startswith("q|c|") and second.live()["b-1"].startswith("q|c|")
    assert first.waits() == {} and second.waits() == {}
    # Each fired timer ended its run's wait, and the namespace's indexes say so too (run_index.py).
    again = store.examine_each([first.run_id, second.run_id], "", ["d", "e"])
    assert [look.woken for look in again] == [[], []], "fired once"



def test_a_batch_of_fired_timers_takes_its_runs_out_of_the_waiting_index(make_backend: BackendFactory) -> None:
    """``examine_each`` ends waits as ``examine`` does, so each run's index sync
    follows it (run_index.py) in the same transaction: no run the listing
    finds waiting is past its timer."""
    backend = started(make_backend)
    due = now_ms() + HOUR
    sleep(backend.journal(1), "m", 0, due)
    store = backend.store  # type: ignore[attr-defined]
    index = store.keys.namespace(backend.record().namespace).index

    def waiting() -> list[str]:
        return [m for m in store.client.zrange(index, 0, -1) if m.startswith("a|") and backend.run_id in m]

    assert waiting()
    backend.pass_time(HOUR)
    assert [look.woken for look in store.examine_each([backend.run_id], "", ["a"])] == [["m"]]
    assert backend.record().waiting_for is None and waiting() == []
    assert disagreements(store, backend.record().namespace) == []


def test_a_timer_waits_before_its_due_time_and_ends_after_it(make_backend: BackendFactory) -> None:
    backend = started(make_backend)
    journal = backend.journal(1)
    due = now_ms() + HOUR
    assert sleep(journal, "m", 0, due) == WaitResult(False, NO_FLAGS, due=due)
    assert journal.read_sequence("m").live_entries() == [("z|", None)]
    assert backend.waits() == {"m:0": {"owner": "m", "kind": "timer", "name": "", "until": due}}
    assert backend.record().waiting_for == {"kind": "timer", "name": "", "until": due}
    # Reached again before it is due (a replay): it still waits, and the sweep fires nothing.
    assert sleep(journal, "m", 0, due) == WaitResult(False, NO_FLAGS, due=due)
    assert fire(backend) == []

    backend.pass_time(HOUR)
    examined = backend.examine(fire_prefix="fire")
    assert (examined.woken, examined.verdict) == (["m"], "alive")
    assert backend.live()["fire-1"].startswith("q|c|")  # the coordinator's wake-up is in flight
    assert backend.waits() == {} and backend.record().waiting_for is None
    # The sweep journaled the timer's end: the woken pass reads it with its
    # lock (activate.lua's tail) and makes no round trip for the wait.
    assert journal.read_sequence("m").live_entries() == [("z|", FIRED)]
    assert fire(backend, "again") == []  # fired once
    assert sleep(journal, "m", 0, due) == WaitResult(True, NO_FLAGS, outcome=FIRED)
    assert [event for event in backend.events() if event[0] == "timer_fired"] == [("timer_fired", "m:0")]
    assert journal.read_sequence("m").live_entries() == [("z|", FIRED)]
    # A timer already due when first reached ends there and then, never registered.
    assert sleep(journal, "m", 1, now_ms() - 1) == WaitResult(True, NO_FLAGS, outcome=FIRED)
    assert backend.waits() == {}


def test_the_due_time_is_fixed_when_the_wait_is_first_reached(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    first = now_ms() + HOUR
    assert sleep(journal, "m", 0, first) == WaitResult(False, NO_FLAGS, due=first)
    # A replay computes its due time again, later: the first one stands.
    assert sleep(journal, "m", 0, first + HOUR) == WaitResult(False, NO_FLAGS, due=first)
    assert backend.waits()["m:0"]["until"] == first
    assert wait_for(journal, "m", 1, "approval", first + 2 * HOUR) == WaitResult(False, NO_FLAGS, due=first + 2 * HOUR)
    assert wait_for(journal, "m", 1, "approval", first + 5 * HOUR) == WaitResult(False, NO_FLAGS, due=first + 2 * HOUR)
    # The run shows the wait due first.
    assert backend.record().waiting_for == {"kind": "timer", "name": "", "until": first}


def test_the_run_shows_the_wait_due_first_and_a_signal_without_timeout_last(make_backend: BackendFactory) -> None:
    backend = started(make_backend)
    journal = backend.journal(1)
    due = now_ms() + HOUR
    wait_for(journal, "m.0.0", 0, "go", owner="m:0/0")
    assert backend.record().waiting_for == {"kind": "signal", "name": "go", "until": None}
    sleep(journal, "m.0.1", 0, due + HOUR, owner="m:0/1")
    wait_for(journal, "m.0.2", 0, "stop", due, owner="m:0/2")
    assert backend.record().waiting_for == {"kind": "signal", "name": "stop", "until": due}
    backend.pass_time(HOUR)
    assert fire(backend) == ["m:0/2"]
    assert backend.live()["fire-1"].startswith("q|s|")  # a branch's wake-up goes to the steps queue
    assert backend.record().waiting_for is not None and backend.record().waiting_for["kind"] == "timer"


# -- signals ------------------------------------------------------------------------------------


def test_a_signal_sent_before_the_wait_is_kept_and_consumed_by_it(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    assert backend.signal("approval", '{"approved":true}') == Signalled(SignalVerdict.OK, epoch=1)
    assert backend.progress() == [("system", None, "Signal approval received")]
    outcome = received(1, '{"approved":true}')
    assert wait_for(journal, "m", 0, "approval") == WaitResult(True, NO_FLAGS, outcome=outcome)
    assert journal.read_sequence("m").live_entries() == [("g|approval", outcome)]
    # Consumed: the next wait for it waits.
    assert wait_for(journal, "m", 1, "approval") == WaitResult(False, NO_FLAGS)
    assert backend.waits() == {"m:1": {"owner": "m", "kind": "signal", "name": "approval"}}
    # A replay of the first wait gets the same signal back, whatever arrived since.
    backend.signal("approval", '"late"')
    assert wait_for(journal, "m", 0, "approval") == WaitResult(True, NO_FLAGS, outcome=outcome)


def test_two_signals_are_consumed_in_order_by_two_waits(make_backend: BackendFactory) -> None:
    backend = started(make_backend)
    journal = backend.journal(1)
    backend.signal("step", "1")
    backend.signal("other", "0")
    backend.signal("step", "2")
    assert wait_for(journal, "m", 0, "step") == WaitResult(True, NO_FLAGS, outcome=received(1, "1"))
    assert wait_for(journal, "m", 1, "step") == WaitResult(True, NO_FLAGS, outcome=received(2, "2"))
    assert wait_for(journal, "m", 2, "step") == WaitResult(False, NO_FLAGS)
    assert backend.record().waiting_for == {"kind": "signal", "name": "step", "until": None}
    # One arriving now is taken for the waiting op, whose owner is woken to find it journaled.
    assert backend.signal("step", "3", prefix="sig") == Signalled(SignalVerdict.OK, epoch=1, owners=["m"])
    assert backend.live()["sig-1"].startswith("q|c|")
    assert backend.waits() == {} and backend.record().waiting_for is None
    assert journal.read_sequence("m").live_entries()[2] == ("g|step", received(3, "3"))
    assert wait_for(journal, "m", 2, "step") == WaitResult(True, NO_FLAGS, outcome=received(3, "3"))


def test_a_signal_is_taken_by_one_wait_for_it_whose_owner_alone_is_woken(make_backend: BackendFactory) -> None:
    """``signal.lua`` takes the signal for a wait of its name as that wait's
    ``wait.lua`` would (the woken pass finds it journaled, no round trip of
    its own); a wait left with no signal to take waits on, unwoken."""
    backend = started(make_backend)
    journal = backend.journal(1)
    wait_for(journal, "m.0.0", 0, "go", owner="m:0/0")
    wait_for(journal, "m.0.1", 0, "go", owner="m:0/1")
    answer = backend.signal("go", '"once"', prefix="sig")
    assert len(answer.owners) == 1
    taker, other = answer.owners[0], ({"m:0/0", "m:0/1"} - set(answer.owners)).pop()
    seq_of = {"m:0/0": "m.0.0", "m:0/1": "m.0.1"}
    assert {task for task in backend.live() if task.startswith("sig-")} == {"sig-1"}
    assert journal.read_sequence(seq_of[taker]).live_entries() == [("g|go", received(1, '"once"'))]
    assert wait_for(journal, seq_of[taker], 0, "go", owner=taker) == WaitResult(True, NO_FLAGS, received(1, '"once"'))
    assert list(backend.waits()) == [f"{seq_of[other]}:0"]
    assert wait_for(journal, seq_of[other], 0, "go", owner=other) == WaitResult(False, NO_FLAGS)
    # The next one is the other wait's.
    assert backend.signal("go", '"twice"', prefix="again").owners == [other]
    assert journal.read_sequence(seq_of[other]).live_entries() == [("g|go", received(2, '"twice"'))]
    assert backend.waits() == {} and backend.record().waiting_for is None


def test_a_signal_wait_with_a_timeout_ends_not_received(make_backend: BackendFactory) -> None:
    backend = started(make_backend)
    journal = backend.journal(1)
    due = now_ms() + HOUR
    assert wait_for(journal, "m", 0, "approval", due) == WaitResult(False, NO_FLAGS, due=due)
    assert backend.record().waiting_for == {"kind": "signal", "name": "approval", "until": due}
    backend.pass_time(HOUR)
    assert fire(backend) == ["m"]
    # Woken, not ended, by the sweep: its owner's wait.lua takes a signal that came meanwhile first.
    assert journal.read_sequence("m").live_entries() == [("g|approval", None)]
    assert wait_for(journal, "m", 0, "approval", due) == WaitResult(True, NO_FLAGS, outcome=TIMED_OUT)
    # A signal sent after the time-out is not that wait's: the next one takes it.
    assert backend.signal("approval", "null") == Signalled(SignalVerdict.OK, epoch=1)
    assert wait_for(journal, "m", 0, "approval", due) == WaitResult(True, NO_FLAGS, outcome=TIMED_OUT)
    assert wait_for(journal, "m", 1, "approval", due) == WaitResult(True, NO_FLAGS, outcome=received(1, "null"))


def test_what_a_run_that_cannot_continue_does_with_a_signal(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    wait_for(journal, "m", 0, "go")
    backend.settle("paused")
    # Kept, not woken: the resumed attempt's replay takes it.
    assert backend.signal("go", "1") == Signalled(SignalVerdict.OK, epoch=1)
    for status in ("completed", "cancelled"):
        backend.settle(status)
        assert backend.signal("go", "2") == Signalled(SignalVerdict.REFUSED, status=status)
    backend.settle("error")
    backend.write("run", {"can_resume": "0"})
    assert backend.signal("go", "3") == Signalled(SignalVerdict.REFUSED, status="error")
    backend.write("run", {"can_resume": "1"})
    assert backend.signal("go", "4").verdict == "ok"
    assert [message for _, _, message in backend.progress()] == ["Signal go received"] * 2


# -- non-determinism, fencing, cuts -----------------------------------------------------------------


def test_a_wait_where_the_journal_holds_another_op_is_a_conflict(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    backend.signal("go", "1")
    journal.record("m", step(0, "a", ok(1)))
    assert wait_for(journal, "m", 0, "go") == Conflict("s|a")
    due = now_ms() + HOUR
    assert sleep(journal, "m", 1, due) == WaitResult(False, NO_FLAGS, due=due)
    assert wait_for(journal, "m", 1, "go") == Conflict("z|")
    assert wait_for(journal, "m", 2, "go") == WaitResult(True, NO_FLAGS, received(1, "1"))
    assert wait_for(journal, "m", 2, "stop") == Conflict("g|go")  # a signal's name is part of the op
    assert list(backend.waits()) == ["m:1"]


def test_waits_of_an_older_epoch_are_fenced(make_backend: BackendFactory) -> None:
    backend = started(make_backend)
    old = backend.journal(1)
    due = now_ms() + HOUR
    assert sleep(old, "m", 0, due) == WaitResult(False, NO_FLAGS, due=due)
    new = backend.journal(backend.take_over())
    backend.pass_time(HOUR)
    for write in (lambda: sleep(old, "m", 0, due), lambda: wait_for(old, "m", 1, "go")):
        with pytest.raises(StaleAttemptError, match=r"\(stale\)"):
            write()
    assert backend.refused() == 2
    assert old.read_sequence("m").live_entries() == [("z|", None)]  # the old attempt ended nothing
    assert sleep(new, "m", 0, due + HOUR) == WaitResult(True, NO_FLAGS, outcome=FIRED)  # the first due time holds
    backend.settle("completed")
    with pytest.raises(StaleAttemptError, match=r"\(settled\)"):
        wait_for(new, "m", 1, "go")


YES = received(1, '"yes"')


def abandon(backend: Backend, wait_at: str = "m") -> Journal:
    """Attempt 1 fails step a, then a wait at op 1 of ``wait_at`` (the main body,
    or the branch of a fan-out at op 1) takes the signal "yes"; attempt 2 runs
    a again, which cuts the main body after it. Returns attempt 2's journal."""
    first = backend.journal(1)
    first.record("m", step(0, "a", failed(1)))
    backend.signal("approval", '"yes"')
    if wait_at == "m":
        assert wait_for(first, "m", 1, "approval") == WaitResult(True, NO_FLAGS, outcome=YES)
    else:
        first.dispatch("m", 1, "p|1", 1, "x1", position(1, 0))
        assert wait_for(first, wait_at, 0, "approval", owner="m:1/0") == WaitResult(True, NO_FLAGS, outcome=YES)
    second = backend.journal(backend.take_over())
    second.begin("m", BeginCall(cut=cut_argument(0, position(0, 0)), step_key="a", step_row=RUNNING))
    # Until the new attempt writes over it, what followed the failure is dead.
    assert second.read_sequence("m").live_entries() == [("s|a", failed(1))]
    second.record("m", step(0, "a", ok("a")))
    return second


def test_a_wait_abandoned_by_a_cut_gives_its_signal_back(make_backend: BackendFactory) -> None:
    second = abandon(make_backend())
    second.record("m", step(1, "b", ok("b")))  # the new path: another op where the wait stood
    assert wait_for(second, "m", 2, "approval") == WaitResult(True, NO_FLAGS, outcome=YES)


def test_a_wait_in_a_fanout_a_cut_abandoned_gives_its_signal_back(make_backend: BackendFactory) -> None:
    second = abandon(make_backend(), wait_at="m.1.0")
    second.record("m", step(1, "b", ok("b")))  # where the fan-out stood: its branches are forgotten
    assert second.read_sequence("m.1.0").live_entries() == []
    assert wait_for(second, "m", 2, "approval") == WaitResult(True, NO_FLAGS, outcome=YES)


def test_a_wait_abandoned_by_a_cut_gives_its_signal_back_to_the_wait_in_its_place(
    make_backend: BackendFactory,
) -> None:
    second = abandon(make_backend())
    # The same path again: the wait stands where the abandoned one stood.
    assert wait_for(second, "m", 1, "approval") == WaitResult(True, NO_FLAGS, outcome=YES)


def test_a_timer_a_cut_abandoned_is_woken_but_not_ended_by_the_sweep(make_backend: BackendFactory) -> None:
    """The sweep journals a due timer's end only where the sleep op is alive:
    what a cut abandoned is left to the replay that reaches that index."""
    backend = started(make_backend)
    first = backend.journal(1)
    first.record("m", step(0, "a", failed(1)))
    due = now_ms() + HOUR
    assert sleep(first, "m", 1, due) == WaitResult(False, NO_FLAGS, due=due)
    second = backend.journal(backend.take_over())
    second.begin("m", BeginCall(cut=cut_argument(0, position(0, 0)), step_key="a", step_row=RUNNING))
    backend.pass_time(HOUR)
    assert fire(backend) == ["m"]
    assert backend.field("journal", "x:m:1") is None
    assert "timer_fired" not in [kind for kind, _ in backend.events()]
    second.record("m", step(0, "a", ok("a")))
    assert second.read_sequence("m").live_entries() == [("s|a", ok("a"))]


def test_a_wait_a_cancelled_pass_stepped_over_is_woken_but_never_ended_by_the_sweep_or_a_signal(
    make_backend: BackendFactory,
) -> None:
    """An op a cancelled pass stepped over has no answer, ever (``step_over.lua``):
    neither a due timer nor a signal ends it, and a signal stays untaken."""
    backend = started(make_backend)
    journal = backend.journal(1)
    due = now_ms() + HOUR
    assert sleep(journal, "m", 0, due) == WaitResult(False, NO_FLAGS, due=due)
    assert wait_for(journal, "m", 1, "approval") == WaitResult(False, NO_FLAGS)
    journal.step_over("m", 0)
    journal.step_over("m", 1)
    backend.pass_time(HOUR)
    assert fire(backend) == ["m"]
    assert backend.signal("approval", '"yes"', prefix="sig").owners == ["m"]
    assert backend.field("journal", "x:m:0") is None and backend.field("journal", "x:m:1") is None
    assert "timer_fired" not in [kind for kind, _ in backend.events()]


def test_the_waits_of_a_run_asked_to_cancel_are_woken_not_ended(make_backend: BackendFactory) -> None:
    """Its pass never reaches a wait again (``check_cancelled`` comes first),
    so nothing ends one for it: as before waits were ended by their wakes."""
    backend = started(make_backend)
    journal = backend.journal(1)
    due = now_ms() + HOUR
    assert sleep(journal, "m.0.0", 0, due, owner="m:0/0") == WaitResult(False, NO_FLAGS, due=due)
    assert wait_for(journal, "m.0.1", 0, "approval", owner="m:0/1") == WaitResult(False, NO_FLAGS)
    backend.write("run", {"cancel": "1"})
    backend.pass_time(HOUR)
    assert fire(backend) == ["m:0/0"]
    assert backend.signal("approval", '"yes"', prefix="sig").owners == ["m:0/1"]
    assert backend.field("journal", "x:m.0.0:0") is None and backend.field("journal", "x:m.0.1:0") is None


def test_a_wait_whose_journal_entry_cannot_be_read_is_woken_and_the_sweep_goes_on(
    make_backend: BackendFactory,
) -> None:
    """The pass that replays it settles the run corrupt, as before: the
    sweep's look at the run (its liveness, its other timers) is not lost."""
    backend = started(make_backend)
    journal = backend.journal(1)
    due = now_ms() + HOUR
    assert sleep(journal, "m", 0, due) == WaitResult(False, NO_FLAGS, due=due)
    backend.write("journal", {"k:m": "garbage"})  # a cut no script wrote
    backend.pass_time(HOUR)
    examined = backend.examine(fire_prefix="fire")
    assert (examined.woken, examined.verdict) == (["m"], "alive")
    assert backend.field("journal", "x:m:0") is None


# -- liveness: waiting is not active time ----------------------------------------------------------


def test_waiting_with_nothing_in_flight_stops_the_active_clock(make_backend: BackendFactory) -> None:
    backend = make_backend()
    (first,) = backend.live()  # the run's first coordinator message
    assert backend.activate(first) == NO_FLAGS
    assert backend.field("run", "active_since")  # the clock runs while the pass does
    journal = backend.journal(1)
    due = now_ms() + HOUR
    sleep(journal, "m", 0, due)
    assert backend.release(first) is False
    assert backend.live() == {}
    assert backend.field("run", "active_since") == "" and int(backend.field("run", "active_ms") or "-1") >= 0
    examined = backend.examine()
    assert (examined.verdict, examined.next_check) == ("waiting", due)
    backend.pass_time(HOUR)
    assert fire(backend) == ["m"]
    assert backend.field("run", "active_since")  # the wake-up is work in flight: the clock runs again
    assert backend.examine().verdict == "alive"
