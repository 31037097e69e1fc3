"""Each script's reply is parsed by one function named after it
(``broker/replies/``): a reply of a shape the script never sends is
corruption naming the script and the run, and every verdict the parse
functions know is one their script sends.

The contract tests hold the parse functions to what the scripts really
send on Redis; these hold them to what the scripts never send.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from enum import StrEnum
from importlib import resources
from typing import Any

import pytest

from celery_durable.broker.child_types import ChildCall, ChildDone, ChildVerdict, DoneVerdict
from celery_durable.broker.journal import (
    AgentVerdict,
    Began,
    CallVerdict,
    Conflict,
    Dispatch,
    Flags,
    Recorded,
    TaskCall,
    WaitResult,
    Winner,
)
from celery_durable.broker.ops import SCRIPT_NAMES
from celery_durable.broker.replies import children, control, fleet, history, index, journal, run, schedules, throttles
from celery_durable.broker.replies.control import Finished, Requested, RequestVerdict, Signalled, SignalVerdict
from celery_durable.broker.replies.fleet import DeadWorker, DueRuns, Examined, Liveness
from celery_durable.broker.replies.run import CallDone, Renewal, Requeued, TurnStart, TurnVerdict
from celery_durable.broker.replies.shape import Refusal
from celery_durable.broker.schema.history import StoredEvent
from celery_durable.errors import StaleAttemptError, StorageCorruptError

MODULES = (journal, run, control, fleet, children, history, index, schedules, throttles)
LUA = resources.files("celery_durable.broker") / "lua"
FLAGS = ["1", "0", "timeout_seconds"]
RAISED = Flags(cancel=True, limit="timeout_seconds")


def parser(name: str) -> Callable[..., Any]:
    found: list[Callable[..., Any]] = [getattr(module, name) for module in MODULES if hasattr(module, name)]
    assert len(found) == 1, f"{name}: {len(found)} parse functions"
    return found[0]


def lua(name: str) -> str:
    return (LUA / f"{name}.lua").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_script_has_one_parse_function_that_names_it_as_its_header_says_what_it_returns(name: str) -> None:
    assert f"{name}.lua" in (parser(name).__doc__ or "")
    header = "\n".join(line for line in lua(name).splitlines() if line.startswith("--"))
    assert "Returns" in header or "sequence_reply" in header, f"{name}.lua's header does not say what it returns"


@pytest.mark.parametrize(
    ("enum", "script"),
    [
        (CallVerdict, "call"),
        (AgentVerdict, "agent_call"),
        (TurnVerdict, "agent_start"),
        (RequestVerdict, "cancel"),
        (SignalVerdict, "signal"),
        (Liveness, "_prelude"),
        (Refusal, "branch_start"),
        (ChildVerdict, "child"),
        (DoneVerdict, "child_done"),
    ],
)
def test_every_verdict_is_one_its_script_sends(enum: type[StrEnum], script: str) -> None:
    sent = set(re.findall(r"'([a-z]*)'", lua(script)))
    assert {member.value for member in enum} - {""} <= sent


GOOD: list[tuple[str, tuple[Any, ...], Any, Any]] = [
    ("begin_op", (), ["ok", *FLAGS, ""], Began(RAISED)),
    ("commit_begin", (), ["winner", "v"], Winner("v")),
    ("record_op", (), ["ok", *FLAGS, "first"], Recorded(RAISED, "first")),
    ("dispatch", (), ["dispatch", 1, 0, 2], Dispatch(cut=True, indices=[0, 2])),
    ("dispatch", (), ["pending", 3], Dispatch(pending=True, in_flight=3)),
    ("complete_branch", (True,), ["conflict", "s|a"], Conflict("s|a")),
    ("complete_begin", (), ["ok", *FLAGS, "", 1], Began(RAISED, woke=True)),
    ("wait", (), ["wait", *FLAGS, "1500"], WaitResult(False, RAISED, due=1500)),
    ("call", (), ["publish", *FLAGS], TaskCall(CallVerdict.PUBLISH, RAISED)),
    ("activate", (), ["busy", 30100], 30100),
    ("heartbeat", (), ["ok", *FLAGS, 1], Renewal(RAISED, wake=True)),
    ("branch_start", (1, []), ["forged"], Refusal.FORGED),
    ("task_end", (), ["ok", 0], False),
    ("agent_start", (), ["go", "{}"], TurnStart(TurnVerdict.GO, "{}")),
    ("call_done", (None,), ["late"], None),
    ("call_done", (None,), ["settled"], Refusal.SETTLED),
    ("call_done", (None,), ["ok", "0", "m", "m.2.0"], CallDone(["m", "m.2.0"], throttled=False)),
    ("call_done", (None,), ["ok", "1"], CallDone([], throttled=True)),
    ("finish", (), ["ok", "order-42", "0"], Finished("order-42", throttled=False)),
    ("finish", (), ["ok", "", "1"], Finished("", throttled=True)),
    ("halt", (), ["changed"], None),
    ("cancel", (), ["cancelled", ""], Requested(RequestVerdict.CANCELLED)),
    ("requeue", (), [1, 0, 750], Requeued(sent=True, first=False, delay_ms=750)),
    ("unsent", (), ["ok", 2], 2),
    ("resume", (), ["changed", "2", "running"], None),
    ("cancel", (), ["settled", "completed"], Requested(RequestVerdict.SETTLED, status="completed")),
    ("pause", (), ["settled"], Requested(RequestVerdict.SETTLED)),
    ("signal", (), ["ok", 2, "m", "m.0.1"], Signalled(SignalVerdict.OK, epoch=2, owners=["m", "m.0.1"])),
    ("claim_due", (), ["", "1700000015000.5", "r1"], DueRuns(["r1"], None, "1700000015000.5")),
    (
        "claim_dead_workers",
        (),
        ["w1", "t1|r1 t2|r1 a1|r2@tag-1", "w2", ""],
        {"w1": DeadWorker({"r1": ["t1", "t2"]}, ["tag-1"]), "w2": DeadWorker()},
    ),
    ("look", (), 1, 1),
    ("looked", (), 0, 0),
    ("examine", (), ["paused", "2", "w", "", ""], Examined("paused", 2, "w", Liveness.SETTLED, "")),
    ("child", (), ["pending", *FLAGS, "leaf", ""], ChildCall(ChildVerdict.PENDING, RAISED, "leaf")),
    ("child", (), ["hit", *FLAGS, "leaf", "o1"], ChildCall(ChildVerdict.HIT, RAISED, "leaf", "o1")),
    ("child_done", (), ["ok", 3, "parent", "o1", "0", "m"], ChildDone(DoneVerdict.OK, 3, "parent", "o1", "m", False)),
    ("child_done", (), ["ok", 3, "parent", "o1", "1"], ChildDone(DoneVerdict.OK, 3, "parent", "o1", None, True)),
    ("agent_finish", (), ["ok", "m m.2.0", "0"], CallDone(["m", "m.2.0"], throttled=False)),
    ("agent_finish", (), ["ok", "", "1"], CallDone([], throttled=True)),
    ("child_done", (), ["late", 3, "parent", "o1"], ChildDone(DoneVerdict.LATE, 3, "parent", "o1")),
    ("child_done", (), ["settled"], ChildDone(DoneVerdict.SETTLED)),
    ("compensable", (), ["ok", *FLAGS], RAISED),
    ("note", (), ["said"], False),
    ("read_history", (), [], None),
    (
        "read_history",
        (),
        ["2", [["2-0", ["k", "patched", "y", "p1", "a", "1", "t", "5", "d", '{"op":"m:1"}']]]],
        (2, [StoredEvent(2, "patched", "p1", 1, 5, {"op": "m:1"})]),
    ),
]


@pytest.mark.parametrize(("name", "extra", "reply", "parsed"), GOOD)
def test_a_reply_parses_as_its_type(name: str, extra: tuple[Any, ...], reply: Any, parsed: Any) -> None:
    takes_run = "run_id" in inspect.signature(parser(name)).parameters
    assert parser(name)(reply, *(("r-1",) if takes_run else ()), *extra) == parsed


BAD: list[tuple[str, tuple[Any, ...], Any]] = [
    ("begin_op", (), ["ok", "0"]),  # flags cut short
    ("begin_op", (), ["conflict", "s|a"]),  # begin_op never conflicts
    ("commit_begin", (), ["maybe"]),
    ("dispatch", (), ["dispatch", 0, "x"]),
    ("complete_branch", (False,), ["winner", "v"]),  # no held step: no winner
    ("complete_branch", (True,), ["ok", 2]),
    ("agent_call", (), ["hit", *FLAGS]),  # a hit without its outcome
    ("call", (), ["sent", *FLAGS]),
    ("read_sequences", (["m"],), [["", ""], ["", ""]]),  # more sequences than asked
    ("activate", (), ["ok", "0"]),
    ("activate", (), "ok"),
    ("heartbeat", (), ["ok", *FLAGS]),
    ("branch_start", (1, ["m"]), ["ok", *FLAGS, ["status"], False, [], []]),  # an odd run hash
    ("agent_start", (), ["later"]),
    ("call_done", (None,), ["here", "0", "ok", *FLAGS]),  # 'here' for a caller that runs no pass
    ("call_done", (None,), ["ok", "yes", "m"]),  # whether the run was throttled not said
    ("create_run", (), "1"),
    ("index_run", (), None),
    ("finish", (), ["ok"]),  # no idempotency key said
    ("finish", (), ["ok", "order-42"]),  # whether it was throttled not said
    ("requeue", (), [1]),
    ("read_progress", (), ["3", "", "", ["1-0", ["kind"]]]),
    ("resume", (), ["ok", "two", 2]),
    ("halt", (), ["done"]),
    ("cancel", (), ["requested"]),
    ("pause", (), ["cancelled"]),  # a pause never cancels
    ("signal", (), ["ok"]),
    ("claim_due", (), ["soon", "1.5", "r1"]),
    ("claim_due", (), ["", "r1"]),  # no claim score
    ("look", (), ["1"]),
    ("claim_dead_workers", (), ["w1", "t1 t2|r1"]),
    ("examine", (), ["sleeping", "1", "w", "", ""]),
    ("examine", (), ["running", "1", "w", "undead", ""]),
    ("child", (), ["started", *FLAGS, "leaf", ""]),
    ("child", (), ["hit", *FLAGS]),  # a hit without its workflow and outcome
    ("child_done", (), ["ok", "three", "parent", "o1"]),
    ("child_done", (), ["ok", 3, "parent", "o1"]),  # whether the parent was throttled not said
    ("agent_finish", (), ["ok", "m"]),  # whether the run was throttled not said
    ("child_done", (), ["woken"]),
    ("note", (), ["written"]),
    # a kind no script records; data that is no JSON object
    ("read_history", (), ["1", [["1-0", ["k", "invented", "y", "", "a", "1", "t", "5", "d", ""]]]]),
    ("read_history", (), ["1", [["1-0", ["k", "patched", "y", "", "a", "1", "t", "5", "d", "[1]"]]]]),
]


@pytest.mark.parametrize(("name", "extra", "reply"), BAD)
def test_a_reply_of_a_shape_its_script_never_sends_is_corruption(name: str, extra: tuple[Any, ...], reply: Any) -> None:
    takes_run = "run_id" in inspect.signature(parser(name)).parameters
    with pytest.raises(StorageCorruptError, match=f"{name}.lua replied in a shape it never sends") as info:
        parser(name)(reply, *(("r-1",) if takes_run else ()), *extra)
    assert ("Run r-1: " in str(info.value)) is takes_run


@pytest.mark.parametrize("refusal", ["stale", "settled"])
def test_a_fenced_script_raises_the_fences_refusal(refusal: str) -> None:
    with pytest.raises(StaleAttemptError, match=f"r-1.*{refusal}"):
        journal.begin_op([refusal], "r-1")
    with pytest.raises(StorageCorruptError, match="Run record r-1 is missing"):
        journal.begin_op(["missing"], "r-1")
