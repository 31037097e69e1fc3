"""``lua/_prelude.lua``, ported to a run held in memory.

The in-memory journal must answer exactly as the Lua scripts do, so it keeps
the same layout — every Redis hash of a run is a ``dict[str, str]`` with the
same field names (``schema.py``), the progress stream a dict keyed by seq —
and each function here is the prelude function of the same name, line for
line. Where Lua's truthiness differs from Python's (``''`` is true in Lua),
the port tests ``is None`` as Lua tests ``nil``.

Arguments that Lua receives as ARGV strings (epochs, cut indices) stay
strings here, so comparisons are the same string comparisons.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from celery_durable.broker import schema
from celery_durable.broker.journal import BeginCall, Flags, PendingCommit

INCARNATION = "memory"
"""The "Redis run_id" of every in-memory run: memory has no restarts, so
``next_epoch`` never jumps."""

ACCEPTS_WORK = ("running", "pending", "paused")
TRIM_BATCH = 100


@dataclass(slots=True)
class RunState:
    """One run's keys as Redis holds them (``keys.RunKeys``), hashes as dicts."""

    run: dict[str, str]
    journal: dict[str, str] = field(default_factory=dict)
    progress: dict[int, dict[str, str]] = field(default_factory=dict)
    """The progress stream: seq -> entry fields, in ascending seq. The phase
    index is not kept apart: it is the entries with a phase id."""
    steps: dict[str, str] = field(default_factory=dict)
    running: dict[str, str] = field(default_factory=dict)
    agents: dict[str, str] = field(default_factory=dict)
    live: dict[str, str] = field(default_factory=dict)
    """The attempt's Celery messages in flight, by task id (``memory_liveness``)."""
    waits: dict[str, str] = field(default_factory=dict)
    """What the run's sequences wait for, by "<seq>:<i>" (JSON entries)."""
    signals: dict[str, str] = field(default_factory=dict)
    """Signals sent to the run, per name, in arrival order (``take_signal``)."""


def hincrby(hash_: dict[str, str], name: str, amount: int) -> int:
    """HINCRBY: a missing field counts from 0."""
    value = int(hash_.get(name) or 0) + amount
    hash_[name] = str(value)
    return value


def fence(state: RunState, epoch: str) -> str | None:
    """``fence()``: None when ``epoch`` owns the run and it accepts work, else the refusal."""
    current = state.run.get("epoch")
    if current is None:
        return "missing"
    if current != epoch:
        hincrby(state.run, "refused", 1)
        return "stale"
    if state.run.get("status") not in ACCEPTS_WORK:
        return "settled"
    return None


def flags(state: RunState) -> Flags:
    """``flags()``: what every fenced write returns after its verdict."""
    run = state.run
    return Flags(cancel=run.get("cancel", "0") == "1", pause=run.get("pause", "0") == "1", limit=run.get("limit", ""))


def active_ms(state: RunState, now: int) -> int:
    """``active_ms()``."""
    run = state.run
    total = int(run.get("active_ms") or "0")
    since = run.get("active_since")
    if run.get("status") == "running" and since:
        total += now - int(since)
    return total


def check_limits(state: RunState, now: int) -> str:
    """``check_limits()``: marks and returns the first ceiling reached ('' for none)."""
    run = state.run
    if run.get("limit"):
        return run["limit"]
    reached = ""
    timeout, credits = run.get("lim_timeout_ms"), run.get("lim_credits_nano")
    if timeout and active_ms(state, now) > int(timeout):
        reached = "timeout_seconds"
    elif credits and int(run.get("credits_nano") or "0") > int(credits):
        reached = "max_ai_credits"
    if reached:
        run["limit"] = reached
    return reached


def trim_progress(state: RunState, newest: int, *, indexed: bool) -> None:
    """``trim_progress()``: keep the newest ``progress_max`` records. A script
    without the phase index key stops at the first record of a phase."""
    keep = int(state.run.get("progress_max") or "0")
    if keep <= 0 or newest <= keep:
        return
    last = None
    for scanned, seq in enumerate(state.progress):  # ascending seq, as XRANGE reads the stream
        if seq > newest - keep or scanned >= TRIM_BATCH:
            break
        if state.progress[seq]["phase_id"] != "" and not indexed:
            break
        last = seq
    if last is not None:
        bound = last
        for seq in list(itertools.takewhile(lambda seq: seq <= bound, state.progress)):
            del state.progress[seq]


def append_progress(state: RunState, kind: str, phase_id: str, message: str, at: int, *, indexed: bool) -> int:
    """``append_progress()``: the next seq's record; ``indexed`` says the script
    has the phase index key (only system records come without it)."""
    if phase_id != "" and not indexed:
        raise RuntimeError("append_progress: a record of a phase needs the phase index key")
    seq = hincrby(state.run, "next_seq", 1)
    attempt = state.run.get("attempt") or "1"
    state.progress[seq] = {"kind": kind, "phase_id": phase_id, "message": message, "attempt": attempt, "at": str(at)}
    trim_progress(state, seq, indexed=indexed)
    return seq


def is_stale_failure(outcome: str | None, epoch: str) -> bool:
    """``is_stale_failure()``: no outcome, or a failure another attempt saw."""
    if outcome is None:
        return True
    if outcome[:1] not in ("e", "f"):
        return False
    bar = outcome.find("|", 1)
    if bar < 0:
        return False
    return outcome[1:bar] != epoch


def entry_alive(state: RunState, seq: str, index: int, raw: str) -> bool:
    """``entry_alive()``: an entry past the sequence's cut, written by an older attempt, is dead."""
    cut = state.journal.get(f"k:{seq}")
    if cut is None:
        return True
    cut_epoch, _, cut_index = cut.partition(":")
    return not (index > int(cut_index) and int(raw.partition(":")[0]) < int(cut_epoch))


def sequence_reply(state: RunState, seq: str, start: int) -> list[str | None]:
    """sequence_reply in _prelude.lua: sequence ``seq`` from index ``start`` on."""
    journal = state.journal
    reply: list[str | None] = [journal.get(f"k:{seq}", ""), journal.get(f"h:{seq}", "")]
    for i in range(start, int(journal.get(f"n:{seq}") or "0")):
        entry = journal.get(schema.op_field(seq, i), "0:")
        ident = entry.partition(":")[2]
        value = None
        if ident[:1] in ("s", "c"):  # a step, or a task call (its outcome under its key)
            value = journal.get(schema.step_field(ident[2:]))
        elif ident[:1] == "a":
            value = journal.get(f"a:{ident[2:]}")
        elif ident[:1] in ("t", "u", "z", "g"):
            # now()/uuid4() values, and how a wait ended (None while it has not)
            value = journal.get(schema.value_field(seq, i))
        reply += [entry, value]
    return reply


def sequence_replies(state: RunState, seqs: Sequence[str], budget: int) -> list[list[str | None]]:
    """sequence_replies in _prelude.lua: whole sequences, until one spends the budget of entries."""
    replies: list[list[str | None]] = []
    for seq in seqs:
        replies.append(sequence_reply(state, seq, 0))
        budget -= (len(replies[-1]) - 2) // 2
        if budget <= 0:
            break
    return replies


def forget_fanout(state: RunState, seq: str, index: int, width: int, epoch: str) -> None:
    """``forget_fanout()``: an abandoned fan-out's outcomes, counters and histories go."""
    journal = state.journal
    call = schema.call_id(seq, index)
    for j in range(width):
        branch = schema.branch_seq(seq, index, j)
        journal.pop(schema.branch_field(call, j), None)
        journal.pop(f"h:{branch}", None)
        journal[f"k:{branch}"] = f"{epoch}:-1"
    for prefix in ("c:", "d:", "s:"):
        journal.pop(prefix + call, None)


def record_op(state: RunState, seq: str, index: int, ident: str, epoch: str) -> tuple[str | None, str | None]:
    """``record_op()``: (the live identity that conflicts, the dead identity replaced)."""
    journal = state.journal
    name = schema.op_field(seq, index)
    existing = journal.get(name)
    if existing is not None:
        old = existing.partition(":")[2]
        if entry_alive(state, seq, index, existing):
            return (old, None) if old != ident else (None, None)
        journal[name] = f"{epoch}:{ident}"
        if old[:1] in ("p", "l"):
            forget_fanout(state, seq, index, int(old[2:]), epoch)
        return None, old
    journal[name] = f"{epoch}:{ident}"
    if index + 1 > int(journal.get(f"n:{seq}") or "0"):
        journal[f"n:{seq}"] = str(index + 1)
    return None, None


def cut_sequence(state: RunState, seq: str, index: str, epoch: str, position: str) -> None:
    """``cut_sequence()``: older attempts' entries after ``index`` are dead;
    progress from ``position`` on is new."""
    journal = state.journal
    journal[f"k:{seq}"] = f"{epoch}:{index}"
    limit = int(position) - 1
    if int(journal.get(f"h:{seq}") or "-1") > limit:
        journal[f"h:{seq}"] = str(limit)


def next_epoch(state: RunState, now: int) -> int:
    """``next_epoch()``; the jump after a restart is kept for fidelity, though
    an in-memory run never meets one."""
    run = state.run
    seen = run.get("incarnation")
    step = 1
    if seen is not None and seen != INCARNATION:
        step = max(1000, now - int(run["epoch"]))
    run["incarnation"] = INCARNATION
    hincrby(run, "attempt", 1)
    return hincrby(run, "epoch", step)


def _with_status(raw: str, status: str) -> str | None:
    """A JSON row with another status, or None when it does not decode to an object."""
    try:
        row = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(row, dict):
        return None
    row["status"] = status
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False)


def interrupt_steps(state: RunState) -> None:
    """``interrupt_steps()``: running rows become interrupted; a corrupt row moves as it is."""
    for key, raw in state.running.items():
        state.steps[key] = _with_status(raw, "interrupted") or raw
    state.running.clear()
    state.run["steps_running"] = "0"


def interrupt_agents(state: RunState) -> None:
    """``interrupt_agents()``: queued or running turns become interrupted."""
    for key, raw in list(state.agents.items()):
        try:
            row = json.loads(raw)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("status") in ("running", "queued"):
            state.agents[key] = _with_status(raw, "interrupted") or raw


def made_progress(state: RunState) -> None:
    """``made_progress()``."""
    state.run.pop("recoveries", None)


def commit_call(state: RunState, epoch: str, seq: str, commit: PendingCommit) -> tuple[str, str]:
    """``commit_call()``: ('conflict', identity), ('winner', value) or ('ok', '')."""
    run, journal = state.run, state.journal
    conflict, replaced = record_op(state, seq, commit.index, commit.identity, epoch)
    if conflict is not None:
        return "conflict", conflict
    winner = ""
    if commit.value_field != "":
        current = journal.get(commit.value_field)
        is_step = commit.value_field[:2] == "v:"
        # A now()/uuid4() value of an abandoned op is not this op's value.
        if current is not None and not is_step and replaced is not None:
            current = None
        if current is not None and not (is_step and is_stale_failure(current, epoch)):
            winner = current
        else:
            journal[commit.value_field] = commit.value
            made_progress(state)
            if commit.step_key != "" and commit.value[:1] == "o":
                hincrby(run, "steps_done", 1)
    if commit.step_key != "":
        if state.running.pop(commit.step_key, None) is not None:
            hincrby(run, "steps_running", -1)
        if commit.step_row == "":
            state.steps.pop(commit.step_key, None)
        else:
            state.steps[commit.step_key] = commit.step_row
    if winner != "":
        return "winner", winner
    return "ok", ""


def begin_call(state: RunState, epoch: str, now: int, seq: str, call: BeginCall) -> str:
    """``begin_call()``: flush progress (dropping what an earlier replay wrote),
    show the step running; returns its live outcome journaled elsewhere, or ''."""
    run, journal = state.run, state.journal
    if call.cut:
        cut_index, _, cut_position = call.cut.partition(":")
        cut_sequence(state, seq, cut_index, epoch, cut_position)
    hwm_field = f"h:{seq}"
    hwm = int(journal.get(hwm_field) or "-1")
    start = hwm
    for position, kind, phase_id, message in call.records:
        if int(position) > hwm:
            append_progress(state, kind, phase_id, message, now, indexed=True)
            if kind == "phase":
                previous = run.get("phase_id")
                if previous and previous != phase_id:
                    run[f"pe:{previous}"] = str(now)
                run["phase"], run["phase_id"] = message, phase_id
                run.setdefault(f"ps:{phase_id}", str(now))
            hwm = int(position)
    if hwm != start:
        journal[hwm_field] = str(hwm)
    step_key = call.step_key
    # A pause stops the main body before its next step: that step does not show as running.
    if seq == schema.MAIN and step_key != "" and run.get("pause") == "1":
        step_key = ""
    outcome = ""
    if step_key != "":
        current = journal.get(schema.step_field(step_key))
        if current is not None and not is_stale_failure(current, epoch):
            outcome = current
    if step_key != "" and outcome == "":
        if step_key not in state.running:
            hincrby(run, "steps_running", 1)
        state.running[step_key] = call.step_row
    # (PUBLISH of "<run> progress": nobody listens to an in-memory run.)
    check_limits(state, now)
    return outcome


def settle_row(raw: str, status: str, now: int, error: str | None) -> str:
    """A step row of a call, settled: as call.lua and call_done.lua patch it (cjson)."""
    try:
        row = json.loads(raw)
    except ValueError:
        row = {}
    if not isinstance(row, dict):
        row = {}
    row.update(status=status, finished_at=now)
    if error is not None:
        row["error"] = error
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False)
