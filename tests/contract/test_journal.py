"""The ``Journal`` contract: ``RedisJournal``'s typed results for every call, on
the real scripts on a real redis-server (and on a Redis Cluster:
the ``topologies`` mark runs these tests there too).
"""

from __future__ import annotations

import pytest

from celery_durable.broker import schema
from celery_durable.broker.journal import (
    AgentCall,
    Began,
    BeginCall,
    Conflict,
    Dispatch,
    Flags,
    HeldBranch,
    PendingCommit,
    Recorded,
    Winner,
)
from celery_durable.broker.replies.shape import Refusal
from celery_durable.broker.schema import Identity, SequenceHistory, cut_argument, position
from celery_durable.errors import StaleAttemptError
from tests.contract.conftest import PHASE_ID, Backend, BackendFactory, RedisBackend
from tests.support.contract import AGENT, OTHER, RUNNING, agent_row, ask, failed, ok, step

pytestmark = pytest.mark.topologies("redis", "cluster")  # the journal on one Redis and on a Redis Cluster

NO_FLAGS = Flags()


def finish_turn(backend: Backend, agent_id: str, outcome: str) -> None:
    """What agent_finish.lua leaves in the journal: the outcome, the request gone."""
    backend.write("journal", {f"a:{agent_id}": outcome, f"q:{agent_id}": None, f"qe:{agent_id}": None})
    backend.write("journal", {f"w:{agent_id}": None})


# -- ops: new, hit, conflict -------------------------------------------------------------


def test_a_new_step_then_a_hit(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    assert journal.begin("m", BeginCall(step_key="a", step_row=RUNNING)) == Began(NO_FLAGS, None)
    assert backend.step_rows() == {"a": RUNNING}
    assert journal.record("m", step(0, "a", ok({"x": 1}))) == Recorded(NO_FLAGS, None)
    assert journal.read_sequence("m") == SequenceHistory(cut=None, high_water=-1, entries=[(1, "s|a", 'o{"x":1}')])
    assert schema.StepRow.parse("a", backend.step_rows()["a"]).status == "completed"
    assert backend.field("run", "steps_done") == "1"
    assert backend.field("run", "steps_running") == "0"
    # Another sequence reaching the key is told its outcome instead of running it...
    assert journal.begin("m.1.0", BeginCall(step_key="a", step_row=RUNNING)) == Began(NO_FLAGS, 'o{"x":1}')
    assert journal.record("m.1.0", PendingCommit(0, "s|a")) == Recorded(NO_FLAGS, None)
    assert journal.read_sequence("m.1.0").live_entries() == [("s|a", 'o{"x":1}')]
    # ... and one that ran it anyway loses: the first write wins.
    assert journal.record("m.2.0", step(0, "a", ok({"x": 2}))) == Recorded(NO_FLAGS, 'o{"x":1}')
    assert backend.field("run", "steps_done") == "1"
    # Several sequences read at once are what each read alone says (an unknown one is empty).
    seqs = ["m", "m.1.0", "m.2.0", "m.9.9"]
    assert journal.read_sequences(seqs) == [journal.read_sequence(seq) for seq in seqs]
    assert journal.read_sequences(seqs)[3] == SequenceHistory(cut=None, high_water=-1, entries=[])
    assert journal.read_sequences([]) == []


def test_a_conflicting_identity_is_reported_by_every_op(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    assert journal.record("m", step(0, "a", ok(1))) == Recorded(NO_FLAGS, None)
    assert journal.record("m", step(0, "b", ok(2))) == Conflict("s|a")
    assert journal.commit_begin("m", step(0, "b", ok(2)), BeginCall(step_key="c", step_row=RUNNING)) == Conflict("s|a")
    assert journal.dispatch("m", 0, "p|2", 2, "execution", position(0, 0)) == Conflict("s|a")
    assert ask(journal, "m", 0) == Conflict("s|a")
    assert journal.read_sequence("m").entries == [(1, "s|a", "o1")]
    assert backend.field("journal", "v:b") is None
    assert "c" not in backend.step_rows()


def test_a_patch_marker_is_an_op_without_a_value(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    assert journal.record("m", PendingCommit(0, Identity.patch("fraud-check"))) == Recorded(NO_FLAGS)
    journal.record("m", step(1, "a", ok(1)))
    assert journal.read_sequence("m").live_entries() == [("v|fraud-check", None), ("s|a", ok(1))]
    assert journal.record("m", step(0, "b", ok(2))) == Conflict("v|fraud-check")
    assert journal.record("m", PendingCommit(1, Identity.patch("fraud-check"))) == Conflict("s|a")


def test_a_pass_notes_the_code_hash_it_runs(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    assert backend.field("run", "attempt_code_hash") is None
    journal.note_code("0123456789abcdef")
    assert backend.field("run", "attempt_code_hash") == "0123456789abcdef"


def test_now_and_uuid_values_are_journaled_with_their_op(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    first = PendingCommit(0, Identity.NOW, schema.value_field("m", 0), "2030-01-01T00:00:00+00:00")
    assert journal.record("m", first) == Recorded(NO_FLAGS, None)
    again = PendingCommit(0, Identity.NOW, schema.value_field("m", 0), "2031-01-01T00:00:00+00:00")
    assert journal.record("m", again) == Recorded(NO_FLAGS, "2030-01-01T00:00:00+00:00")
    assert journal.record("m", PendingCommit(1, Identity.UUID, schema.value_field("m", 1), "u-1")) == Recorded(
        NO_FLAGS, None
    )
    assert journal.read_sequence("m").live_entries() == [("t|", "2030-01-01T00:00:00+00:00"), ("u|", "u-1")]


# -- fencing ----------------------------------------------------------------------------------


def test_every_write_of_an_older_epoch_is_fenced_and_counted(make_backend: BackendFactory) -> None:
    backend = make_backend()
    old = backend.journal(1)
    old.record("m", step(0, "a", ok(1)))
    old.dispatch("m", 1, "p|1", 1, "execution", position(1, 0))
    assert backend.take_over() == 2
    writes = [
        lambda: old.begin("m", BeginCall(step_key="b", step_row=RUNNING)),
        lambda: old.commit_begin("m", step(2, "b", ok(2)), BeginCall()),
        lambda: old.record("m", step(2, "b", ok(2))),
        lambda: old.dispatch("m", 2, "p|1", 1, "execution", position(2, 0)),
        lambda: old.sending("m:1", ["task"]),
        lambda: old.mark_sent("m:1"),
        lambda: old.complete_branch("m:1", 0, ok(0), "wake"),
        lambda: old.hand_off("m:1", "task", [0], ["handed"]),
        lambda: ask(old, "m", 2),
        lambda: old.note_code("0123456789abcdef"),
    ]
    for write in writes:
        with pytest.raises(StaleAttemptError, match=r"\(stale\)"):
            write()
    assert backend.refused() == len(writes)
    # Reads are not fenced: an old attempt may still look.
    assert old.read_sequence("m").live_entries() == [("s|a", "o1"), ("p|1", None)]
    assert old.branch_outcomes("m:1", 1) == [None]
    assert backend.field("journal", "v:b") is None and backend.step_rows() == {"a": backend.step_rows()["a"]}


def test_a_settled_run_takes_no_more_writes(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    journal.record("m", step(0, "a", ok(1)))
    backend.settle("completed")
    with pytest.raises(StaleAttemptError, match=r"\(settled\)"):
        journal.begin("m", BeginCall(step_key="b", step_row=RUNNING))
    with pytest.raises(StaleAttemptError, match=r"\(settled\)"):
        journal.record("m", step(1, "b", ok(2)))
    assert backend.refused() == 0  # only a stale epoch counts as refused
    for status in ("paused", "pending", "running"):
        backend.settle(status)
        assert journal.begin("m.0.0", BeginCall()) == Began(NO_FLAGS, None)


def test_every_fenced_write_returns_the_flags(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    backend.write("run", {"cancel": "1", "limit": "max_ai_credits"})
    flags = Flags(cancel=True, limit="max_ai_credits")
    assert journal.begin("m", BeginCall(step_key="a", step_row=RUNNING)) == Began(flags, None)
    assert journal.record("m", step(0, "a", ok(1))) == Recorded(flags, None)
    backend.write("run", {"cancel": "0", "limit": "", "pause": "1"})
    # A pause holds the main body's next step back: it does not show as running.
    paused = Flags(pause=True)
    assert journal.begin("m", BeginCall(step_key="b", step_row=RUNNING)) == Began(paused, None)
    assert "b" not in backend.step_rows()
    # A branch's step is work in flight: it runs on.
    assert journal.begin("m.1.0", BeginCall(step_key="c", step_row=RUNNING)) == Began(paused, None)
    assert "c" in backend.step_rows()
    assert ask(journal, "m", 1) == AgentCall("dispatch", paused)


# -- held-back commits: commit_begin ---------------------------------------------------------


def test_commit_begin_journals_the_last_step_and_begins_the_next(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    journal.begin("m", BeginCall(step_key="a", step_row=RUNNING))
    records = [(position(1, 0), "log", PHASE_ID, "between")]
    began = journal.commit_begin("m", step(0, "a", ok(1)), BeginCall(step_key="b", step_row=RUNNING, records=records))
    assert began == Began(NO_FLAGS, None)
    rows = backend.step_rows()
    assert schema.StepRow.parse("a", rows["a"]).status == "completed" and rows["b"] == RUNNING
    assert backend.progress() == [("log", PHASE_ID, "between")]
    assert journal.read_sequence("m") == SequenceHistory(None, position(1, 0), [(1, "s|a", "o1")])


def test_commit_begin_that_loses_a_first_write_race_begins_nothing(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    assert journal.record("m.0.0", step(0, "c", ok("theirs"))) == Recorded(NO_FLAGS, None)
    nothing = BeginCall(step_key="d", step_row=RUNNING, records=[(position(1, 0), "log", PHASE_ID, "never")])
    assert journal.commit_begin("m", step(0, "c", ok("mine")), nothing) == Winner('o"theirs"')
    assert "d" not in backend.step_rows()
    assert backend.progress() == []
    assert journal.read_sequence("m").live_entries() == [("s|c", 'o"theirs"')]


def test_commit_begin_hands_back_a_step_journaled_meanwhile(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    journal.record("m.0.0", step(0, "b", ok("elsewhere")))
    began = journal.commit_begin("m", step(0, "a", ok(1)), BeginCall(step_key="b", step_row=RUNNING))
    assert began == Began(NO_FLAGS, 'o"elsewhere"')
    assert backend.step_rows()["b"] != RUNNING  # its settled row stays: nothing runs it here


# -- failures and cuts ---------------------------------------------------------------------------


def test_a_failure_of_an_older_attempt_is_run_again_and_cuts_what_followed(make_backend: BackendFactory) -> None:
    backend = make_backend()
    first = backend.journal(1)
    first.record("m", step(0, "a", ok("a")))
    first.record("m", step(1, "b", failed(1)))
    first.record("m", step(2, "c", ok("c")))  # the older attempt went on past the failure
    assert first.dispatch("m", 3, "p|2", 2, "x1", position(3, 0)) == Dispatch(indices=[0, 1])
    first.complete_branch("m:3", 0, ok(0), "")
    first.complete_branch("m:3", 1, ok(1), "")
    logs = [(position(2, 0), "log", PHASE_ID, "after b"), (position(3, 0), "log", "", "x")]
    first.begin("m", BeginCall(records=logs))
    first.begin("m.3.0", BeginCall(records=[(position(0, 0), "log", PHASE_ID, "in branch 0")]))
    # Within its attempt the failure is the history: every replay sees it.
    assert first.begin("m", BeginCall(step_key="b", step_row=RUNNING)) == Began(NO_FLAGS, failed(1))

    second = backend.journal(backend.take_over())
    assert second.read_sequence("m").live_entries() == [
        ("s|a", 'o"a"'), ("s|b", failed(1)), ("s|c", 'o"c"'), ("p|2", None),
    ]  # fmt: skip
    cut = cut_argument(1, position(1, 0))
    assert second.begin("m", BeginCall(cut=cut, step_key="b", step_row=RUNNING)) == Began(NO_FLAGS, None)
    history = second.read_sequence("m")
    assert history.cut == (2, 1)
    assert history.high_water == position(1, 0) - 1
    assert history.live_entries() == [("s|a", 'o"a"'), ("s|b", failed(1))]  # c and the fan-out are abandoned
    assert second.record("m", step(1, "b", ok("b"))) == Recorded(NO_FLAGS, None)
    # The new attempt takes another path where the abandoned future stood: no conflict.
    assert second.record("m", step(2, "d", ok("d"))) == Recorded(NO_FLAGS, None)
    assert second.dispatch("m", 3, "l|3", 3, "x2", position(3, 0)) == Dispatch(indices=[0, 1, 2])
    assert second.branch_outcomes("m:3", 3) == [None, None, None]
    assert second.read_sequence("m.3.0") == SequenceHistory(cut=(2, -1), high_water=-1, entries=[])
    assert second.read_sequence("m").live_entries() == [
        ("s|a", 'o"a"'), ("s|b", 'o"b"'), ("s|d", 'o"d"'), ("l|3", None),
    ]  # fmt: skip
    # Progress from the cut on is new again; before it, still written once.
    logs = [(position(0, 0), "log", PHASE_ID, "dup"), (position(2, 0), "log", "", "again")]
    second.begin("m", BeginCall(records=logs))
    assert [message for _, _, message in backend.progress()] == ["after b", "x", "in branch 0", "again"]


def test_a_value_op_of_an_abandoned_future_is_not_the_new_ops_value(make_backend: BackendFactory) -> None:
    backend = make_backend()
    first = backend.journal(1)
    first.record("m", step(0, "a", failed(1)))
    first.record("m", PendingCommit(1, Identity.NOW, schema.value_field("m", 1), "then"))
    second = backend.journal(backend.take_over())
    second.begin("m", BeginCall(cut=cut_argument(0, position(0, 0)), step_key="a", step_row=RUNNING))
    second.record("m", step(0, "a", ok(1)))
    now = PendingCommit(1, Identity.NOW, schema.value_field("m", 1), "now")
    assert second.record("m", now) == Recorded(NO_FLAGS, None)
    # Op 0 was re-run under the same identity, so its entry keeps the epoch that wrote it.
    assert second.read_sequence("m").entries == [(1, "s|a", "o1"), (2, "t|", "now")]


# -- fan-out: dispatch, mark_sent, complete_branch -------------------------------------------------


def test_dispatch_sends_each_branch_once_per_execution_and_again_after_a_failure(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    at = position(0, 0)
    assert journal.dispatch("m", 0, "p|3", 3, "x1", at) == Dispatch(indices=[0, 1, 2])
    # Pending: with the run's messages in flight (here the first coordinator message).
    assert journal.dispatch("m", 0, "p|3", 3, "x1", at) == Dispatch(pending=True, in_flight=1)
    # Another execution before the first said it sent them: it died halfway, send again.
    assert journal.dispatch("m", 0, "p|3", 3, "x2", at) == Dispatch(indices=[0, 1, 2])
    journal.sending("m:0", ["t0", "t1", "t2"])
    journal.mark_sent("m:0")
    live = backend.live()
    assert len(live) == 4 and all(live[task].startswith("q|s|") for task in ("t0", "t1", "t2"))
    assert journal.dispatch("m", 0, "p|3", 3, "x3", at) == Dispatch(pending=True, in_flight=4)
    assert journal.complete_branch("m:0", 0, ok(0), "w0") is False
    assert journal.complete_branch("m:0", 1, failed(1), "w1") is False
    assert journal.complete_branch("m:0", 2, ok(2), "w2") is True  # the last one out wakes
    assert journal.complete_branch("m:0", 2, ok("late"), "w3") is True  # redelivered: wakes again, keeps the first
    assert journal.branch_outcomes("m:0", 3) == [ok(0), failed(1), ok(2)]
    assert journal.branch_outcomes("m:0", 3, only=[2, 0]) == [ok(2), ok(0)]  # a branch task reads its own
    assert journal.branch_outcomes("m:0", 3, only=[]) == []
    assert backend.field("journal", "c:m:0") == "0"

    second = backend.journal(backend.take_over())
    assert second.dispatch("m", 0, "p|3", 3, "x4", at) == Dispatch(cut=True, indices=[1])
    assert second.read_sequence("m").cut == (2, 0)
    assert second.complete_branch("m:0", 1, ok(1), "w5") is True
    assert second.branch_outcomes("m:0", 3) == [ok(0), ok(1), ok(2)]
    assert second.dispatch("m", 0, "p|3", 3, "x5", at) == Dispatch(indices=[])  # all done: nothing to send


def test_the_messages_the_journal_is_told_about_are_counted_in_flight(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    (first,) = backend.live()  # the run's first coordinator message, queued at creation
    journal.dispatch("m", 0, "p|2", 2, "x", position(0, 0))
    journal.sending("m:0", ["b0", "b1"])
    journal.mark_sent("m:0")
    assert journal.complete_branch("m:0", 0, ok(0), "w0") is False
    assert journal.complete_branch("m:0", 1, ok(1), "w1") is True
    assert ask(journal, "m", 1, message="turn") == AgentCall("dispatch", NO_FLAGS)
    live = backend.live()
    # Only the wake-up that is sent counts; each sits in its queue ('c', 's', 'a').
    assert sorted(live) == sorted([first, "b0", "b1", "w1", "turn"])
    assert [live[task][:4] for task in (first, "b0", "w1", "turn")] == ["q|c|", "q|s|", "q|c|", "q|a|"]
    assert journal.dispatch("m", 0, "p|2", 2, "y", position(0, 0)) == Dispatch(pending=True, in_flight=5)


def test_a_hand_off_counts_the_new_tasks_in_flight_and_is_remembered_for_its_giver(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    journal.dispatch("m", 0, "p|4", 4, "x", position(0, 0))
    journal.sending("m:0", ["b0"])
    journal.mark_sent("m:0")
    assert journal.handed_off("m:0", "b0") == []
    journal.hand_off("m:0", "b0", [1, 2, 3], ["h1", "h2"])
    assert journal.handed_off("m:0", "b0") == [1, 2, 3]  # a redelivery of b0 leaves them to h1 and h2
    assert journal.handed_off("m:0", "h1") == []
    live = backend.live()
    assert [live[task][:4] for task in ("b0", "h1", "h2")] == ["q|s|"] * 3
    second = backend.journal(backend.take_over())
    assert second.handed_off("m:0", "b0") == []  # another attempt's hand-off binds nobody
    with pytest.raises(StaleAttemptError, match=r"\(stale\)"):
        second.hand_off("m:0", "b0", [1], ["h3"])  # this attempt never dispatched m:0


def test_a_fatal_branch_wakes_at_once_and_all_done_dispatches_nothing(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    journal.dispatch("m", 0, "l|3", 3, "x", position(0, 0))
    assert journal.complete_branch("m:0", 1, failed(1, "cancelled", fatal=True), "w") is True
    assert journal.complete_branch("m:0", 0, ok(0), "w") is False
    assert journal.complete_branch("m:0", 2, ok(2), "w") is True
    assert journal.dispatch("m", 0, "l|3", 3, "y", position(0, 0)) == Dispatch(indices=[])


def test_a_branch_of_a_fanout_this_attempt_never_dispatched_is_refused(make_backend: BackendFactory) -> None:
    backend = make_backend()
    first = backend.journal(1)
    first.dispatch("m", 0, "p|1", 1, "x", position(0, 0))
    second = backend.journal(backend.take_over())
    with pytest.raises(StaleAttemptError, match=r"\(stale\)"):
        second.complete_branch("m:0", 0, ok(0), "w")
    with pytest.raises(StaleAttemptError):
        second.complete_branch("m:7", 0, ok(0), "w")
    assert backend.refused() == 0
    assert second.branch_outcomes("m:0", 1) == [None]
    assert second.branch_outcomes("m:0", 0) == []


# -- progress -----------------------------------------------------------------------------------------


def test_progress_is_written_once_across_replays(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    first = [(position(0, 0), "phase", PHASE_ID, "Work"), (position(0, 1), "log", PHASE_ID, "one")]
    assert journal.begin("m", BeginCall(records=first)) == Began(NO_FLAGS, None)
    replayed = [*first, (position(0, 2), "log", PHASE_ID, "two")]
    journal.begin("m", BeginCall(records=replayed))
    journal.begin("m", BeginCall(records=replayed))
    assert journal.read_sequence("m").high_water == position(0, 2)
    # Each sequence has its own high-water mark.
    journal.begin("m.0.0", BeginCall(records=[(position(0, 0), "log", PHASE_ID, "branch")]))
    assert backend.progress() == [
        ("phase", PHASE_ID, "Work"), ("log", PHASE_ID, "one"), ("log", PHASE_ID, "two"), ("log", PHASE_ID, "branch"),
    ]  # fmt: skip
    assert backend.field("run", "phase") == "Work"
    assert backend.field("run", "phase_id") == PHASE_ID
    assert backend.field("run", f"ps:{PHASE_ID}") is not None
    assert backend.field("run", "next_seq") == "4"


# -- agent turns ------------------------------------------------------------------------------------------


def test_agent_turns_dispatch_wait_hit_and_stop_at_the_ceiling(make_backend: BackendFactory) -> None:
    backend = make_backend(limits={"max_total_subagents": 1})
    journal = backend.journal(1)
    assert ask(journal, "m", 0, message="q-1") == AgentCall("dispatch", NO_FLAGS)
    assert backend.agent_rows() == {f"{AGENT}@1": agent_row(AGENT)}
    assert backend.field("run", "subagents_used") == "1"
    # The same turn asked for by a branch while it runs: that branch waits too.
    assert ask(journal, "m.1.0", 0, owner="m:1/0") == AgentCall("pending", NO_FLAGS)
    assert ask(journal, "m.1.0", 0, owner="m:1/0") == AgentCall("pending", NO_FLAGS)
    assert backend.field("journal", f"w:{AGENT}") == "m m:1/0"
    # Another turn: the ceiling stops it, and every later answer carries the limit.
    limited = Flags(limit="max_total_subagents")
    assert ask(journal, "m", 1, OTHER) == AgentCall("limit", limited)
    assert backend.field("run", "subagents_used") == "1"
    finish_turn(backend, AGENT, ok({"verdict": "fine"}))
    # Memoized: the finished turn is a hit, ceiling or not.
    assert ask(journal, "m", 0) == AgentCall("hit", limited, ok({"verdict": "fine"}))
    assert journal.read_sequence("m").live_entries() == [
        (f"a|{AGENT}", ok({"verdict": "fine"})), (f"a|{OTHER}", None),
    ]  # fmt: skip


def test_a_failed_turn_is_the_same_failure_within_its_attempt_and_asked_again_after(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    first = backend.journal(1)
    ask(first, "m", 0)
    finish_turn(backend, AGENT, failed(1, "runner down"))
    assert ask(first, "m", 0) == AgentCall("hit", NO_FLAGS, failed(1, "runner down"))
    second = backend.journal(backend.take_over())
    assert ask(second, "m", 0, cut=cut_argument(0, position(0, 0))) == AgentCall("dispatch", NO_FLAGS)
    assert second.read_sequence("m").cut == (2, 0)
    assert sorted(backend.agent_rows()) == [f"{AGENT}@1", f"{AGENT}@2"]
    assert backend.field("run", "subagents_used") == "2"


def test_a_branch_task_starts_and_reads_what_it_opens_first_in_one_script(make_backend: BackendFactory) -> None:
    """branch_start: the message checked against the run and counted running,
    and the run record, the branches' outcomes, what an earlier delivery
    handed on and the first sequences, as the separate reads give them."""
    backend = make_backend()
    backend.write("run", {"status": "running"})  # its coordinator ran, and reached the fan-out
    journal = backend.journal(1)
    assert journal.dispatch("m", 0, "p|3", 3, "x1", position(0, 0)) == Dispatch(indices=[0, 1, 2])
    journal.sending("m:0", ["t0", "t1", "t2"])
    journal.mark_sent("m:0")
    assert journal.record("m.0.1", step(0, "b0", ok("b"))).winner is None
    assert journal.complete_branch("m:0", 0, ok(0), "w0") is False
    journal.hand_off("m:0", "t1", [2], ["t3"])
    seqs = ["m", "m.0.1", "m.0.2"]
    started = backend.branch_start(1, "t1", "m:0", [1, 0, 2], seqs)
    assert not isinstance(started, Refusal)
    assert started.record == backend.record()
    assert started.flags == Flags()
    assert started.outcomes == journal.branch_outcomes("m:0", 3, only=[1, 0, 2]) == [None, ok(0), None]
    assert started.handed_off == journal.handed_off("m:0", "t1") == [2]
    assert started.sequences == dict(zip(seqs, journal.read_sequences(seqs), strict=True))
    assert started.sequences["m.0.1"].entries == [(1, Identity.step("b0"), ok("b"))]
    assert backend.live()["t1"].startswith("x|"), "its message is running, its lease from now"
    assert backend.branch_start(1, "t2", "m:0", [2], [], workflow="other") is Refusal.FORGED
    assert backend.branch_start(2, "t2", "m:0", [2], []) is Refusal.STALE
    assert backend.live()["t2"].startswith("q|"), "a refused start leaves its message as it was"
    backend.settle("cancelled")
    assert backend.branch_start(1, "t2", "m:0", [2], []) is Refusal.SETTLED


def test_a_branch_message_the_run_did_not_send_is_refused_and_changes_nothing(make_backend: BackendFactory) -> None:
    """Flower shows every branch task's id and arguments: a message copied
    from it with other branches, or one made up, is refused before it runs
    (a branch index past the width would have failed the real branch)."""
    backend = make_backend()
    backend.write("run", {"status": "running"})
    journal = backend.journal(1)
    journal.dispatch("m", 0, "p|2", 2, "x1", position(0, 0))
    journal.sending("m:0", ["t0", "t1"])
    before = backend.live()
    assert backend.branch_start(1, "made-up", "m:0", [0], []) == "unknown"
    assert backend.branch_start(1, "t0", "m:0", [0, 2], []) == "forged", "branch 2 of a fan-out of 2"
    assert backend.branch_start(1, "t0", "m:1", [0], []) == "forged", "a fan-out the run never made"
    assert backend.branch_start(1, "t0", "m:00", [0], []) == "forged"
    assert backend.live() == before and journal.branch_outcomes("m:0", 2) == [None, None]
    assert not isinstance(backend.branch_start(1, "t0", "m:0", [1, 0], []), str)


def test_the_last_branch_a_task_holds_ends_its_message_where_its_outcome_is_journaled(
    make_backend: BackendFactory,
) -> None:
    """complete_branch with ``ending``: the outcome, then what task_end does
    (the message is no longer in flight), unless the coordinator must be
    woken (the last one out, or a pause asked for): then the message stays
    running until its task has sent the wake and ends it itself."""
    backend = make_backend()
    backend.write("run", {"status": "running"})
    journal = backend.journal(1)
    assert journal.dispatch("m", 0, "p|3", 3, "x1", position(0, 0)) == Dispatch(indices=[0, 1, 2])
    journal.sending("m:0", ["t0", "t1", "t2"])
    journal.mark_sent("m:0")
    assert journal.complete_branch("m:0", 0, ok(0), "w0", ending="t0") is False
    assert "t0" not in backend.live() and "w0" not in backend.live()
    backend.write("run", {"pause": "1"})
    assert journal.complete_branch("m:0", 1, ok(1), "w1", ending="t1") is True, "a pause waits for each end"
    live = backend.live()
    assert "t1" in live and live["w1"].startswith("q|c|"), "in flight until its wake is sent"
    backend.write("run", {"pause": None})
    assert journal.complete_branch("m:0", 2, ok(2), "w2", ending="t2") is True, "the last one out wakes"
    assert "t2" in backend.live()


def test_a_branch_outcome_takes_its_held_step_along_unless_another_write_came_first(
    make_backend: BackendFactory,
) -> None:
    """complete_held: the branch's last step (record_op's write), then its
    outcome, in one script; when the step's key holds a live value already,
    or another op stands at its index, nothing of the branch is written."""
    backend = make_backend()
    backend.write("run", {"status": "running"})
    journal = backend.journal(1)
    assert journal.dispatch("m", 0, "p|3", 3, "x1", position(0, 0)) == Dispatch(indices=[0, 1, 2])
    assert journal.complete_held("m:0", 0, ok(1), "w0", "", "m.0.0", step(0, "a", ok(1))) is False
    assert journal.read_sequence("m.0.0").entries == [(1, Identity.step("a"), ok(1))]
    assert "a" in backend.step_rows()
    assert journal.branch_outcomes("m:0", 3) == [ok(1), None, None]
    assert backend.record().steps_done == 1
    assert journal.record("m.0.1", step(0, "b", ok("first"))).winner is None  # a second delivery wrote first
    assert journal.complete_held("m:0", 1, ok("mine"), "w1", "", "m.0.1", step(0, "b", ok("mine"))) == Winner(
        ok("first")
    )
    assert journal.branch_outcomes("m:0", 3) == [ok(1), None, None], "nothing of the branch written"
    assert backend.field("journal", "c:m:0") == "2"
    assert journal.complete_held("m:0", 2, ok(3), "w2", "", "m.0.2", step(0, "c", ok(3))) is False
    assert journal.complete_held("m:0", 2, ok(3), "w2", "", "m.0.2", step(0, "d", ok(3))) == Conflict(
        Identity.step("c")
    )
    # Run again, the branch replays the step (a hit: nothing held) and completes the fan-out.
    assert journal.complete_branch("m:0", 1, ok("first"), "w1") is True


def test_a_branch_completion_travels_with_the_next_branchs_begin(make_backend: BackendFactory) -> None:
    """complete_begin: a finished branch's held step and outcome, then the
    next branch's begin, in one script; it wakes the coordinator when that
    outcome was the last one out; a lost first write writes nothing at all,
    not even the begin; and an outcome of another attempt's fan-out is refused."""
    backend = make_backend()
    backend.write("run", {"status": "running"})
    journal = backend.journal(1)
    assert journal.dispatch("m", 0, "p|3", 3, "x1", position(0, 0)) == Dispatch(indices=[0, 1, 2])
    begin_b = BeginCall(step_key="b", step_row=RUNNING)
    began = journal.complete_begin("m.0.1", HeldBranch("m:0", 0, ok(1), "m.0.0", step(0, "a", ok(1)), "w0"), begin_b)
    assert isinstance(began, Began) and (began.existing, began.woke) == (None, False)
    assert journal.read_sequence("m.0.0").entries == [(1, Identity.step("a"), ok(1))]
    assert journal.branch_outcomes("m:0", 3) == [ok(1), None, None]
    assert backend.step_rows()["b"] == RUNNING and "a" in backend.step_rows()
    assert "w0" not in backend.live()

    assert journal.record("m.0.1", step(0, "b", ok("first"))).winner is None  # a second delivery wrote first
    rows = backend.step_rows()
    held_b = HeldBranch("m:0", 1, ok("mine"), "m.0.1", step(0, "b", ok("mine")), "w1")
    lost = journal.complete_begin("m.0.2", held_b, BeginCall(step_key="c", step_row=RUNNING))
    assert lost == Winner(ok("first"))
    assert journal.branch_outcomes("m:0", 3) == [ok(1), None, None] and backend.step_rows() == rows, "nothing written"

    assert journal.complete_branch("m:0", 2, ok(3), "w2") is False
    # Run again, the branch replays b (a hit) and holds the step after it.
    held_again = HeldBranch("m:0", 1, ok("first"), "m.0.1", step(1, "b2", ok(2)), "w1")
    woke = journal.complete_begin("m.1.0", held_again, BeginCall())
    assert isinstance(woke, Began) and woke.woke is True, "the last outcome in wakes the coordinator"
    assert backend.live()["w1"].startswith("q|c|")

    later = backend.journal(backend.take_over())
    with pytest.raises(StaleAttemptError, match=r"\(stale\)"):
        later.complete_begin("m.0.2", HeldBranch("m:0", 2, ok(3), "m.0.2", step(0, "c", ok(3)), ""), BeginCall())


def test_reading_sequences_ahead_stops_once_its_budget_of_entries_is_spent(
    make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of many sequences holds Redis for a bounded time: after the one
    that spends the budget it stops, and the caller reads the rest later."""
    from celery_durable.broker import redis_journal

    monkeypatch.setattr(redis_journal, "READ_ENTRIES_BUDGET", 3)
    backend = make_backend()
    journal = backend.journal(1)
    for i in range(2):
        assert journal.record("m.0.0", step(i, f"a{i}", ok(i))).winner is None
        assert journal.record("m.0.1", step(i, f"b{i}", ok(i))).winner is None
    read = journal.read_sequences(["m.0.0", "m.0.1", "m.0.2"])
    assert read == [journal.read_sequence("m.0.0"), journal.read_sequence("m.0.1")], "2 + 2 entries spend 3"
    assert len(journal.read_sequences(["m.0.2", "m.0.3", "m.0.0", "m.0.1"])) == 4, "empty ones cost nothing"


def test_a_fanout_journaled_afresh_reads_no_branch_outcome(make_backend: BackendFactory) -> None:
    """Its outcomes cannot be there yet (a replaced op's go with it): the
    script reads none of them, so a fan-out of n costs n reads less."""
    backend = make_backend()
    assert isinstance(backend, RedisBackend)
    journal = backend.journal(1)
    raw = backend.store.client

    def hgets() -> int:
        return int(raw.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))

    before = hgets()
    assert journal.dispatch("m", 0, "p|64", 64, "x1", position(0, 0)) == Dispatch(indices=list(range(64)))
    assert hgets() - before < 8
    # Dispatched again by the same execution: read, and found dispatched already.
    assert journal.dispatch("m", 0, "p|64", 64, "x1", position(0, 0)).pending


def test_a_compensation_is_named_as_its_sequence_last_until_a_cut_abandons_it(make_backend: BackendFactory) -> None:
    backend = make_backend()
    first = backend.journal(1)
    first.record("m", step(0, "a", failed(1)))
    assert first.read_sequence("m").compensated is None  # no compensation: the journal names none
    first.record("m", step(1, "undo-b", ok(1)), compensation=True)
    assert first.read_sequence("m").compensated == (1, 1)
    assert first.read_sequence("m").last_compensation() == 1
    second = backend.journal(backend.take_over())
    assert second.read_sequence("m").last_compensation() == 1
    second.begin("m", BeginCall(cut=cut_argument(0, position(0, 0)), step_key="a", step_row=RUNNING))
    assert second.read_sequence("m").last_compensation() == -1  # cut away with what followed the failure
