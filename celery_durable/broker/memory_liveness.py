"""The last two sections of ``lua/_prelude.lua``, ported: liveness and durable waits.

Like ``memory_prelude`` (whose conventions hold here: Lua's names, string
fields, ``is None`` where Lua tests ``nil``), one function per prelude
function, over a ``RunState``:

- *Liveness*: the live hash (``RunState.live``), one entry per Celery message
  of the current attempt that has not finished; the active-time clock runs
  while it is non-empty, so time spent waiting is not active time (SPEC §6),
  and ``liveness`` judges from it whether the attempt is alive.
- *Durable waits*: what sequences wait for (``RunState.waits``), the summary
  the run hash shows (``refresh_waiting``), the signals kept per name in
  arrival order (``RunState.signals``) and who took which (``take_signal``),
  and waking the owners of waits that ended (``wake_waits``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery_durable.broker.memory_prelude import RunState, entry_alive

START_MARGIN_MS = 5000
"""``START_MARGIN_MS``: a message found gone from its queue this long ago and
still not started died with the worker that took it."""

_QUEUED = re.compile(r"q\|([A-Za-z])\|(\d+)(.*)", re.DOTALL)
_GONE = re.compile(r"\|gone (\d+)", re.DOTALL)
_HELD = re.compile(r"\|held (\d+)", re.DOTALL)
_EMPTY = re.compile(r"([A-Za-z])=(\d+)")


def lua_number(value: Any) -> int | float | None:
    """What Lua's ``type(x) == 'number'`` accepts of a decoded JSON value."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _decode(raw: str) -> dict[str, Any] | None:
    """``pcall(cjson.decode, raw)`` keeping only tables with keys."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _encode(value: Mapping[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# -- liveness: the run's work in flight ---------------------------------------------


def clock_start(state: RunState, now: int) -> None:
    """``clock_start()``: a running run's active time runs from ``now``."""
    run = state.run
    if run.get("status") == "running" and not run.get("active_since"):
        run["active_since"] = str(now)


def clock_stop(state: RunState, now: int) -> None:
    """``clock_stop()``: the time since ``active_since`` is added to ``active_ms``."""
    run = state.run
    since = run.get("active_since")
    if since:
        run["active_ms"] = str(int(run.get("active_ms") or "0") + int(now) - int(since))
        run["active_since"] = ""


def token_queued(state: RunState, task_id: str, kind: str, due: int, now: int) -> None:
    """``token_queued()``: message ``task_id`` is sent to queue ``kind``, due at ``due``."""
    if task_id == "":
        return
    if not state.live:
        clock_start(state, now)
    state.live[task_id] = f"q|{kind}|{due}"


def token_running(state: RunState, task_id: str, expiry: int, now: int) -> None:
    """``token_running()``: message ``task_id`` runs, its heartbeat due before ``expiry``."""
    if task_id == "":
        return
    if not state.live:
        clock_start(state, now)
    state.live[task_id] = f"x|{expiry}"
    if int(expiry) > int(state.run.get("lease_until") or "0"):
        state.run["lease_until"] = str(expiry)


def token_done(state: RunState, task_id: str, now: int) -> None:
    """``token_done()``: message ``task_id`` finished; the last one out stops the clock."""
    if task_id == "":
        return
    if state.live.pop(task_id, None) is not None and not state.live:
        clock_stop(state, now)


def tokens_clear(state: RunState, now: int) -> None:
    """``tokens_clear()``: the attempt's work is all gone (settled, or taken over)."""
    clock_stop(state, now)
    state.live.clear()
    state.waits.clear()
    state.run["waiting"] = ""


def owner_kind(owner: str) -> str:
    """``owner_kind()``: the coordinator's queue ('c') or a branch's ('s')."""
    return "c" if owner == "m" else "s"


def mark_received(state: RunState, task_ids: Sequence[str], now: int) -> int:
    """``received.lua``: queued messages a worker received are '|held <now>'."""
    marked = 0
    for task_id in task_ids:
        queued = _QUEUED.fullmatch(state.live.get(task_id) or "")
        if queued:
            state.live[task_id] = f"q|{queued.group(1)}|{queued.group(2)}|held {now}"
            marked += 1
    return marked


def _queued(
    state: RunState, task_id: str, value: str, now: int, lease_ms: int, empty: Mapping[str, str]
) -> tuple[str, int]:
    """A queued message in ``liveness()``: why it is dead ('' if it is not), and when to look again."""
    queued = _QUEUED.fullmatch(value)
    kind, due, rest = queued.groups() if queued else (None, "0", "")
    due_ms = int(due)
    held = _HELD.fullmatch(rest)
    if held:
        since = max(int(held.group(1)), due_ms)
        if now - since >= lease_ms:
            return f"task {task_id} was received and never started", 0
        return "", since + lease_ms
    gone_match = _GONE.fullmatch(rest)
    gone = int(gone_match.group(1)) if gone_match else None
    if gone is not None and now - gone >= START_MARGIN_MS:
        return f"task {task_id} left its queue and never started", 0
    if gone is None and int(empty.get(kind or "") or "0") > due_ms:
        gone = now
        state.live[task_id] = f"q|{kind}|{due_ms}|gone {now}"
    return "", gone + START_MARGIN_MS if gone is not None else max(due_ms, now + lease_ms)


def liveness(state: RunState, now: int, lease_ms: int, empty: Mapping[str, str]) -> tuple[str, str | int]:
    """``liveness()``: ('alive', ms to look again), ('waiting', due ms or ''), or ('dead', why)."""
    next_check: int | None = None
    for task_id, value in list(state.live.items()):
        if value[:2] == "l|":
            return "dead", f"the worker holding task {task_id} died"
        if value[:2] == "x|":
            expiry = _int_or_zero(value[2:])
            if expiry <= now:
                return "dead", f"its worker stopped renewing task {task_id}"
            check = expiry
        else:
            dead, check = _queued(state, task_id, value, now, lease_ms, empty)
            if dead:
                return "dead", dead
        if next_check is None or check < next_check:
            next_check = check
    waits = list(state.waits.values())
    due_first: int | float | None = None
    for raw in waits:
        wait = _decode(raw)
        until = lua_number(wait.get("until")) if wait is not None else None
        if until is not None and (due_first is None or until < due_first):
            due_first = until
    if next_check is not None:
        if due_first is not None and due_first < next_check:
            next_check = int(due_first)
        return "alive", next_check
    if not waits:
        lease_until = int(state.run.get("lease_until") or "0")
        if lease_until > now:
            return "alive", lease_until
        return "dead", "nothing of it is in flight"
    return "waiting", "" if due_first is None else int(due_first)


def _int_or_zero(text: str) -> int:
    """``tonumber(text) or 0``."""
    try:
        return int(float(text))
    except ValueError:
        return 0


def parse_empty(text: str) -> dict[str, str]:
    """``parse_empty()``: "c=<ms>,s=<ms>,a=<ms>" as {kind: ms}."""
    return dict(_EMPTY.findall(text or ""))


# -- durable waits: timers and signals -----------------------------------------------


def refresh_waiting(state: RunState) -> None:
    """``refresh_waiting()``: the run hash's ``waiting`` sums the waits up: the
    one due first, a wait without a time only when none has one."""
    best: dict[str, Any] | None = None
    best_due: int | float | None = None
    for raw in state.waits.values():
        wait = _decode(raw)
        # A task call (kind 'call') is work of the fleet, not a wait for the
        # outside world: it has its own step row, and no place in waiting_for.
        if wait is None or wait.get("kind") == "call":
            continue
        due = lua_number(wait.get("until"))
        if best is None or (due is not None and (best_due is None or due < best_due)):
            best, best_due = wait, due
    if best is None:
        state.run["waiting"] = ""
        return
    summary = {name: best[name] for name in ("kind", "name") if best.get(name) is not None}
    if best_due is not None:
        summary["until"] = best_due
    state.run["waiting"] = _encode(summary)


def claim_alive(state: RunState, at: str, name: str, k: int) -> bool:
    """``claim_alive()``: op ``at`` still stands as a live wait for ``name``
    whose outcome names signal ``k``."""
    seq, colon, index = at.rpartition(":")
    if not colon:
        return False
    entry = state.journal.get(f"o:{at}")
    if entry is None:
        return False
    ident = entry.partition(":")[2]
    if ident != f"g|{name}" or not entry_alive(state, seq, int(index), entry):
        return False
    outcome = state.journal.get(f"x:{at}")
    return outcome is not None and f'"index":{k},' in outcome


def take_signal(state: RunState, name: str, at: str) -> str | None:
    """``take_signal()``: the first signal of ``name`` no live wait has taken,
    claimed for the wait op ``at``; its outcome JSON, or None."""
    signals = state.signals
    for k in range(1, int(signals.get(f"n:{name}") or "0") + 1):
        claim = signals.get(f"k:{name}:{k}")
        if claim is None or claim == at or not claim_alive(state, claim, name, k):
            signals[f"k:{name}:{k}"] = at
            payload = signals.get(f"p:{name}:{k}") or "null"
            return f'{{"received":true,"index":{k},"payload":{payload}}}'
    return None


def wake_call_wait(
    state: RunState, prefix: str, now: int, at: str, match: Callable[[dict[str, Any]], bool]
) -> list[str] | None:
    """``wake_call_wait()``: ``wake_waits`` for a call's one wait at ``at``
    (no 'waiting' summary to refresh); None when no matching wait is there."""
    raw = state.waits.get(at) if at else None
    wait = _decode(raw) if raw is not None else None
    if wait is None or not match(wait):
        return None
    del state.waits[at]
    owner = _lua_tostring(wait.get("owner"))
    token_queued(state, f"{prefix}-1", owner_kind(owner), now, now)
    return [owner]


def wake_waits(state: RunState, prefix: str, now: int, match: Callable[[dict[str, Any]], bool]) -> list[str]:
    """``wake_waits()``: removes the waits ``match`` picks and queues one message
    "<prefix>-<n>" per owner; the owners, in the order of their messages."""
    owners: list[str] = []
    summarized = False
    for at, raw in list(state.waits.items()):
        wait = _decode(raw)
        if wait is not None and match(wait):
            del state.waits[at]
            summarized = summarized or wait.get("kind") != "call"
            owner = _lua_tostring(wait.get("owner"))
            if owner not in owners:
                owners.append(owner)
                token_queued(state, f"{prefix}-{len(owners)}", owner_kind(owner), now, now)
    if summarized:
        refresh_waiting(state)
    return owners


def _lua_tostring(value: Any) -> str:
    """``tostring()`` of a decoded value, for the string owners it is given."""
    return "nil" if value is None else str(value)
