"""Child runs (``ctx.child``) and sagas in storage: child.lua, child_done.lua, compensable.lua."""

from __future__ import annotations

import json

import pytest

from celery_durable.broker import schema
from celery_durable.broker.child_types import ChildCall, ChildDone, DoneVerdict
from celery_durable.broker.journal import Conflict, Flags, Journal
from celery_durable.broker.schema import Identity
from celery_durable.errors import StaleAttemptError
from tests.contract.conftest import BackendFactory
from tests.support.contract import started

pytestmark = pytest.mark.topologies("redis", "cluster")  # the journal on one Redis and on a Redis Cluster

NO_FLAGS = Flags()
DONE = schema.value_outcome({"rooms": 2})


def child(journal: Journal, key: str, *, seq: str = "m", index: int = 0, owner: str = "m", due: int | None = None,
          workflow: str = "hotel", wait: bool = True, cut: str | None = None) -> ChildCall | Conflict:
    return journal.child(seq, index, key, owner, due, cut, kid(key), workflow, wait=wait)


def kid(key: str) -> str:
    return schema.child_run_id("parent", key)


def failed(epoch: int, status: str = "error") -> str:
    outcome = schema.child_outcome("k", kid("k"), "hotel", status, "exception", "boom", None)
    return f"e{epoch}|" + schema.outcome_payload(outcome)[1]


def test_a_child_is_entered_once_waited_for_and_its_end_wakes_the_waiter_once(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    assert child(journal, "k") == ChildCall("pending", NO_FLAGS, "hotel")
    entry = json.loads(backend.store.client.hget(backend.keys.children, "k"))
    assert entry == {"run_id": kid("k"), "workflow": "hotel", "mode": "wait", "at": "m:0"}
    assert backend.waits()["m:0"] == {"owner": "m", "kind": "child", "name": kid("k")}
    assert backend.record().waiting_for == {"kind": "child", "name": kid("k"), "until": None}
    assert backend.record().children == 1
    assert child(journal, "k") == ChildCall("pending", NO_FLAGS, "hotel"), "waited for again, entered once"
    assert backend.record().children == 1

    told = backend.tell("k", kid("k"), DONE)
    assert told == ChildDone(DoneVerdict.OK, 1, "contract", DONE.encode(), "m", throttled=False)
    assert backend.live()["told-1"].startswith("q|c|"), "the wake is counted in flight before it is sent"
    assert backend.waits() == {} and backend.record().waiting_for is None
    assert backend.tell("k", kid("k"), DONE) == told, "its reply lost: the same answer, nothing counted twice"
    assert backend.tell("k", kid("k"), DONE, prefix="sweep") == ChildDone(
        DoneVerdict.LATE, 1, "contract", DONE.encode()
    ), "told again by the sweep: late, no one woken"
    assert child(journal, "k") == ChildCall("hit", NO_FLAGS, "hotel", DONE.encode())
    assert journal.read_sequence("m").live_entries() == [(Identity.child("k"), DONE.encode())]


def test_a_childs_failure_is_tagged_with_the_parents_epoch_and_retried_after_it(make_backend: BackendFactory) -> None:
    backend = make_backend()
    assert child(backend.journal(1), "k").verdict == "pending"
    outcome = schema.child_outcome("k", kid("k"), "hotel", "error", "exception", "boom", None)
    assert backend.tell("k", kid("k"), outcome).outcome == failed(1)
    epoch = backend.take_over()
    journal = backend.journal(epoch)
    assert child(journal, "k", cut="0:0").verdict == "pending", "a later attempt looks at the child again"
    done = journal.child_done("k", kid("k"), outcome)
    assert (done.verdict, done.outcome, done.owner) == (DoneVerdict.OK, failed(epoch), None)
    with pytest.raises(StaleAttemptError):
        backend.journal(1).child_done("k", kid("k"), outcome)


def test_the_waiting_summary_follows_child_waits_without_reading_them_all(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    for j in range(3):
        assert child(journal, f"k{j}", seq=f"m.0.{j}", owner=f"m:0/{j}").verdict == "pending"
    assert backend.record().waiting_for == {"kind": "child", "name": kid("k0"), "until": None}
    assert child(journal, "timed", seq="m.0.3", owner="m:0/3", due=10_000_000_000_000).verdict == "pending"
    assert backend.record().waiting_for == {"kind": "child", "name": kid("timed"), "until": 10_000_000_000_000}
    assert backend.tell("k1", kid("k1"), DONE, prefix="one").owner == "m:0/1"
    assert backend.record().waiting_for["name"] == kid("timed"), "not the summary's wait: left as it was"
    assert backend.tell("timed", kid("timed"), DONE, prefix="two").owner == "m:0/3"
    assert backend.record().waiting_for["name"] in (kid("k0"), kid("k2")), "the summary's wait ended: read again"


def test_a_time_out_is_due_once_passed_and_fixed_the_first_time(make_backend: BackendFactory) -> None:
    backend = started(make_backend)
    journal = backend.journal(1)
    due = backend.store.now_ms() + 60_000
    assert child(journal, "slow", due=due).verdict == "pending"
    assert child(journal, "slow", due=due + 999_999).verdict == "pending"
    backend.pass_time(61_000)
    assert backend.examine(fire_prefix="fire").woken == ["m"], "the sweep fires the time-out: its owner replays"
    assert child(journal, "slow").verdict == "due"


def test_start_child_a_key_reused_and_what_nothing_waits_for(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    assert child(journal, "loose", wait=False) == ChildCall("start", NO_FLAGS, "hotel")
    assert json.loads(backend.store.client.hget(backend.keys.children, "loose"))["mode"] == "start"
    assert backend.tell("loose", kid("loose"), DONE).verdict == DoneVerdict.DETACHED
    assert backend.tell("nobody", kid("nobody"), DONE).verdict == DoneVerdict.UNKNOWN
    assert backend.tell("loose", kid("other"), DONE).verdict == DoneVerdict.UNKNOWN, "another run under the key"
    # Waited for later, under the same key and another workflow: the journaled child, and a warning once.
    assert child(journal, "loose", index=1, workflow="car") == ChildCall("pending", NO_FLAGS, "hotel")
    assert child(journal, "loose", index=1, workflow="car").workflow == "hotel"
    warnings = [m for kind, _, m in backend.progress() if kind == "system" and "Child key loose" in m]
    assert warnings == [
        f"Child key loose already names run {kid('loose')} of workflow hotel: that child is used, "
        "and workflow car is not started"
    ]
    assert isinstance(child(journal, "other", index=1), Conflict), "the journal holds another op there"


def test_a_settled_parent_is_told_nothing_and_a_saga_marks_its_run(make_backend: BackendFactory) -> None:
    backend = make_backend()
    assert backend.journal(1).mark_compensable() == NO_FLAGS
    assert backend.record().compensates
    assert child(backend.journal(1), "k").verdict == "pending"
    backend.settle("cancelled")
    assert backend.tell("k", kid("k"), DONE).verdict == DoneVerdict.SETTLED
    with pytest.raises(StaleAttemptError):
        backend.journal(1).mark_compensable()


def test_a_cancelled_run_that_compensates_wakes_the_branches_that_wait(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    for j in (0, 2):
        journal.wait(f"m.0.{j}", 0, Identity.signal("go"), "signal", "go", None, f"m:0/{j}")
    journal.wait("m.1.0", 0, Identity.signal("go"), "signal", "go", None, "m:1/0")
    assert child(journal, "k", seq="m.0.5", owner="m:0/5").verdict == "pending"
    assert sorted(journal.wake_branches("m:0")) == [0, 2, 5]
    assert set(backend.waits()) == {"m.1.0:0"}, "another fan-out's branch waits on"
    assert backend.record().waiting_for == {"kind": "signal", "name": "go", "until": None}
    assert journal.wake_branches("m:0") == [], "woken once: their waits are gone"
    with pytest.raises(StaleAttemptError):
        backend.journal(backend.take_over() - 1).wake_branches("m:1")


def test_an_op_a_cancelled_pass_stepped_over_stays_unanswered_and_its_answer_is_late(
    make_backend: BackendFactory,
) -> None:
    """A cancelled pass steps over a child it waits for, and its saga journals
    an undo after it; the pass dies before it settles. The child's end then
    arrives: it must be late and hidden from every later replay, or the next
    pass would find the op answered, go on past it and diverge from the undo
    journaled after it (nondeterminism) instead of settling cancelled."""
    backend = make_backend()
    journal = backend.journal(1)
    assert child(journal, "k").verdict == "pending"
    assert journal.read_sequence("m").entries[0][2] is None
    assert journal.step_over("m", 0) == NO_FLAGS
    assert backend.tell("k", kid("k"), DONE).verdict == DoneVerdict.LATE, "the end of a stepped-over child is late"
    assert backend.field("journal", "v:k") is None, "and changes nothing"
    backend.write("journal", {"v:k": "o" + json.dumps({"rooms": 2})})  # an answer journaled before the mark
    assert journal.read_sequence("m").entries[0][2] is None, "a replay never sees an answer of it"
    # An op that replaces it there (a cut by a newer attempt) is not stepped over.
    backend.write("journal", {"o:m:0": "2:k|k"})
    assert journal.read_sequence("m").entries[0][2] is not None
    backend.settle("cancelled")
    with pytest.raises(StaleAttemptError):
        journal.step_over("m", 0)
