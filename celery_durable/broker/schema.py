"""Every stored format, built and parsed here: the one owner of what Redis holds.

The Lua scripts in ``lua/`` read and change the same layout; each names the
fields it touches with the literals below, and ``tests/test_schema.py``
checks that every literal a script uses is one this module documents. Keys
themselves are built in ``keys.py``.

**Run hash** (``P:{R}:run``), one field per line of ``RUN_FIELDS``.

**Journal hash** (``P:{R}:journal``), one run's history:

===================  =========================================================
``n:<seq>``          ops recorded in sequence ``<seq>``
``o:<seq>:<i>``      op ``i`` of ``<seq>``: ``"<epoch>:<identity>"``
``v:<key>``          outcome of the step (or call) ``<key>`` (``Outcome``)
``x:<seq>:<i>``      value of op ``i``: now()/uuid4() text, a wait's outcome
``wd:<seq>:<i>``     due time (ms) of wait op ``i``, fixed when first reached
``r:<call>:<j>``     outcome of branch ``j`` of fan-out ``<call>``
``c:<call>``         branches of ``<call>`` still outstanding
``d:<call>``         ``"<epoch>:<execution>"`` that dispatched them
``s:<call>``         epoch whose dispatch finished sending them
``h:<seq>``          progress high-water mark (a position, see ``position``)
``k:<seq>``          cut ``"<epoch>:<op index>"``: older attempts' later ops are dead
``a:<id>``           outcome of agent turn ``<id>``
``q:<id>``/``qe:<id>``  agent turn request JSON / the epoch that asked for it
``w:<id>``           owners waiting for the turn, space separated
===================  =========================================================

A *sequence* ``<seq>`` is one ordered stream of calls: ``m`` is the main
body; ``m.3.7`` is branch 7 of the fan-out that was op 3 of ``m``. A *call*
``<seq>:<i>`` names a fan-out op. An *owner* is whom a finished wait wakes:
``m`` (the coordinator) or ``<call>/<j>`` (the branch task of a top-level
branch). Op identities: ``s|<key>`` step, ``p|<n>``/``l|<n>`` parallel /
pipeline of n, ``t|`` now(), ``u|`` uuid4(), ``a|<id>`` agent turn, ``z|``
sleep, ``g|<name>`` signal wait, ``c|<key>`` task call.

**Step rows** (``P:{R}:steps`` settled, ``P:{R}:running`` running, by key)
and **agent rows** (``P:{R}:agents`` by ``"<agent id>@<epoch>"``) are JSON
objects (``StepRow``/``agent_row``); Lua changes only their ``status``.

**Outcomes** (``v:``, ``r:``, ``a:`` fields): ``o<json>`` a value;
``e<epoch>|<json>`` an ordinary failure and ``f<epoch>|<json>`` a fatal one,
tagged with the attempt that saw them, so failures replay identically within
that attempt and are retried after it (SPEC §4). One-character tags let Lua
tell them apart without decoding JSON.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_durable.broker.records import STATUSES, RunRecord
from celery_durable.errors import StepFailed, StorageCorruptError, WorkflowLimitReached, fatal_from_code

_dumps = functools.partial(json.dumps, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""Compact, exact JSON, as ``workflows.jsonvalue.dumps`` writes it; values
reach this module already checked and plain (no ``JSON_NULL``)."""

# -- the run hash ---------------------------------------------------------------

RUN_FIELDS: dict[str, str] = {
    "id": "the run id (scripts publish it on the events channel)",
    "workflow": "workflow name",
    "namespace": "namespace the run is listed in",
    "status": "pending, running, completed, halted, paused, cancelled or error",
    "epoch": "the fencing token: every write of an attempt names it",
    "attempt": "attempts users see (the epoch may jump after a Redis restart)",
    "incarnation": "Redis run_id under which the epoch was last bumped",
    "reason": "stable code of a settled run's status, or ''",
    "error": "human-readable error of a settled run, or ''",
    "can_resume": "'1' when resume is allowed",
    "args": "JSON arguments",
    "limits": "JSON limits in force",
    "has_result": "'1' when result holds the run's JSON result",
    "result": "JSON result",
    "code_hash": "hash of the workflow's code and meta",
    "idempotency_key": "the start's idempotency key, or ''",
    "created_at": "ms",
    "started_at": "ms, or '' before the first activation",
    "finished_at": "ms, or '' while the run can still run",
    "updated_at": "ms of the last status change",
    "phase": "title of the current phase",
    "phase_id": "id of the current phase",
    "ps:": "ps:<phase id>: ms the phase began",
    "pe:": "pe:<phase id>: ms the phase ended",
    "next_seq": "last progress seq handed out: the run's progress revision",
    "progress_max": "progress records kept (0: all)",
    "steps_done": "steps journaled as completed",
    "steps_running": "rows in the running hash",
    "agents_running": "agent turns holding a concurrency slot",
    "agents_done": "agent turns finished",
    "subagents_used": "agent turns dispatched (max_total_subagents counts these)",
    "credits_nano": "AI credits used, in nano-credits",
    "prompt_tokens": "agent prompt tokens used",
    "completion_tokens": "agent completion tokens used",
    "lim_concurrent": "max_concurrent_subagents ceiling, or ''",
    "lim_total": "max_total_subagents ceiling, or ''",
    "lim_credits_nano": "max_ai_credits ceiling in nano-credits, or ''",
    "lim_timeout_ms": "timeout_seconds ceiling in ms, or ''",
    "limit": "name of the ceiling reached, or ''",
    "active_ms": "active time of attempts that ended",
    "active_since": "ms the running attempt's active time began, or ''",
    "cancel": "'1' once cancellation was requested",
    "pause": "'1' once a pause was requested",
    "lock": "token of the coordinator pass holding the activation lock, or ''",
    "lock_until": "ms the lock expires",
    "wake": "'1' when an activation arrived while the lock was held",
    "lease_until": "ms the attempt's lease runs out",
    "recoveries": "take-overs since the run last journaled something",
    "refused": "writes the fence refused (stale epochs), for operators",
    "waiting": "JSON summary of what the run waits for (snapshot.waiting_for), or ''",
}
"""Every field of the run hash and what it holds; prefixes end with ':'."""


def new_run_fields(
    *,
    run_id: str,
    workflow: str,
    namespace: str,
    args_json: str,
    limits_json: str,
    code_hash: str,
    created_ms: int,
    lease_ms: int,
    idempotency_key: str | None,
    progress_max: int,
    ceilings: Mapping[str, str],
) -> dict[str, str]:
    """The run hash of a run that was just started (``create_run.lua`` adds
    ``incarnation`` and ``attempt``)."""
    return {
        "id": run_id,
        "workflow": workflow,
        "namespace": namespace,
        "status": "pending",
        "epoch": "1",
        "args": args_json,
        "limits": limits_json,
        "code_hash": code_hash,
        "created_at": str(created_ms),
        # A pending run is given one lease to be picked up before the
        # recovery sweep considers its coordinator message lost.
        "lease_until": str(created_ms + lease_ms),
        "started_at": "",
        "finished_at": "",
        "can_resume": "0",
        "has_result": "0",
        "next_seq": "0",
        "idempotency_key": idempotency_key or "",
        "progress_max": str(progress_max),
        **ceilings,
    }


def parse_run(run_id: str, raw: Mapping[str, str]) -> RunRecord:
    """A run hash as a ``RunRecord``; anything that does not fit is corruption, said as such."""
    try:
        phase_times: dict[str, tuple[int | None, int | None]] = {}
        for name, value in raw.items():
            if name.startswith(("ps:", "pe:")):
                start, end = phase_times.get(name[3:], (None, None))
                if name.startswith("ps:"):
                    start = int(value)
                else:
                    end = int(value)
                phase_times[name[3:]] = (start, end)
        status = raw["status"]
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        has_result = raw.get("has_result") == "1"
        limits = json.loads(raw.get("limits") or "{}")
        if not isinstance(limits, dict):
            raise ValueError("limits is not a JSON object")
        return RunRecord(
            run_id=run_id,
            workflow=raw["workflow"],
            namespace=raw["namespace"],
            status=status,
            epoch=int(raw["epoch"]),
            attempt=int(raw.get("attempt") or raw["epoch"]),
            reason=raw.get("reason") or None,
            error=raw.get("error") or None,
            can_resume=raw.get("can_resume") == "1",
            args=json.loads(raw["args"]),
            limits=limits,
            has_result=has_result,
            result=json.loads(raw["result"]) if has_result else None,
            code_hash=raw.get("code_hash", ""),
            created_at=int(raw["created_at"]),
            started_at=_optional_int(raw.get("started_at")),
            finished_at=_optional_int(raw.get("finished_at")),
            phase=raw.get("phase") or None,
            phase_id=raw.get("phase_id") or None,
            steps_done=int(raw.get("steps_done") or 0),
            steps_running=max(0, int(raw.get("steps_running") or 0)),
            cancel_requested=raw.get("cancel") == "1",
            pause_requested=raw.get("pause") == "1",
            lease_until=int(raw.get("lease_until") or 0),
            lock_until=int(raw.get("lock_until") or 0),
            idempotency_key=raw.get("idempotency_key") or None,
            phase_times=phase_times,
            agents_running=max(0, int(raw.get("agents_running") or 0)),
            agents_done=int(raw.get("agents_done") or 0),
            subagents_used=int(raw.get("subagents_used") or 0),
            credits_nano=int(raw.get("credits_nano") or 0),
            limit_reached=raw.get("limit") or None,
            waiting_for=_waiting(raw.get("waiting")),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise StorageCorruptError(f"Run record {run_id} is corrupt: {exc!r}") from None


def _optional_int(value: str | None) -> int | None:
    return int(value) if value else None


def _waiting(raw: str | None) -> dict[str, Any] | None:
    """snapshot.waiting_for as stored: {"kind", "name", "until" (ms, or absent)}."""
    if not raw:
        return None
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("kind") not in ("timer", "signal"):
        raise ValueError(f"waiting {raw[:80]!r}")
    until = data.get("until")
    return {"kind": data["kind"], "name": str(data.get("name") or ""), "until": _optional_ms(until)}


def wait_outcome(raw: str) -> dict[str, Any]:
    """A wait op's journaled outcome (wait.lua): {"fired": true} for a timer,
    {"received": bool, "payload": ..., "index"?: k} for a signal."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise TypeError("not an object")
        return data
    except (ValueError, TypeError) as exc:
        raise StorageCorruptError(f"Journal entry is not a wait outcome celery-durable wrote: {raw[:80]!r}") from exc


# -- journal fields ----------------------------------------------------------------

JOURNAL_FIELDS: dict[str, str] = {
    "n:": "n:<seq>: ops recorded in the sequence",
    "o:": "o:<seq>:<i>: op identity, '<epoch>:<identity>'",
    "v:": "v:<key>: outcome of a step or task call",
    "x:": "x:<seq>:<i>: value of a now()/uuid4()/wait op",
    "r:": "r:<call>:<j>: outcome of a branch",
    "c:": "c:<call>: branches outstanding",
    "d:": "d:<call>: '<epoch>:<execution>' that dispatched the branches",
    "s:": "s:<call>: epoch whose dispatch finished sending",
    "h:": "h:<seq>: progress high-water mark",
    "k:": "k:<seq>: cut '<epoch>:<op index>'",
    "a:": "a:<id>: agent turn outcome",
    "q:": "q:<id>: agent turn request",
    "qe:": "qe:<id>: epoch that asked for the turn",
    "w:": "w:<id>: owners waiting for the turn",
    "wd:": "wd:<seq>:<i>: due time (ms) of a wait or call op, fixed when first reached ('' for none)",
    "ce:": "ce:<key>: the epoch that published the task call <key>",
}
"""Every field prefix of the journal hash (see the module docstring)."""

SIGNAL_FIELDS: dict[str, str] = {
    "n:": "n:<name>: how many signals <name> arrived",
    "p:": "p:<name>:<k>: the k-th one's JSON payload",
    "t:": "t:<name>:<k>: when it arrived (ms)",
    "k:": "k:<name>:<k>: the wait op '<seq>:<i>' that took it",
}
"""Every field prefix of a run's signals hash (``take_signal`` in ``_prelude.lua``)."""


def op_field(seq: str, index: int) -> str:
    return f"o:{seq}:{index}"


def step_field(key: str) -> str:
    return f"v:{key}"


def value_field(seq: str, index: int) -> str:
    return f"x:{seq}:{index}"


def branch_field(call: str, branch: int) -> str:
    return f"r:{call}:{branch}"


def call_id(seq: str, index: int) -> str:
    """The id of fan-out op ``index`` of ``seq``: its branches' outcomes and counters hang off it."""
    return f"{seq}:{index}"


def branch_seq(seq: str, index: int, branch: int) -> str:
    return f"{seq}.{index}.{branch}"


def branch_owner(call: str, branch: int) -> str:
    return f"{call}/{branch}"


MAIN = "m"
"""The main body's sequence, and the coordinator as an owner."""

POSITION_STRIDE = 1 << 20
"""Progress positions are ``ops_before * STRIDE + n``: the n-th record logged
after the sequence's ops_before-th op. Replays log the same records at the
same positions, which is how they are recognised and not written twice."""


def position(ops_before: int, logs_since_op: int) -> int:
    return ops_before * POSITION_STRIDE + logs_since_op


def cut_argument(index: int, at_position: int) -> str:
    """The ``cut`` ARGV of the scripts that can re-run an older attempt's failure."""
    return f"{index}:{at_position}"


class Identity:
    """Op identities as the journal keeps them (``o:`` fields)."""

    @staticmethod
    def step(key: str) -> str:
        return f"s|{key}"

    @staticmethod
    def fanout(kind: str, width: int) -> str:
        return f"{kind}|{width}"

    NOW = "t|"
    UUID = "u|"
    SLEEP = "z|"

    @staticmethod
    def agent(agent_id: str) -> str:
        return f"a|{agent_id}"

    @staticmethod
    def signal(name: str) -> str:
        return f"g|{name}"

    @staticmethod
    def call(key: str) -> str:
        return f"c|{key}"


def describe(identity: str) -> str:
    """An op identity as users read it in errors."""
    kind, _, rest = identity.partition("|")
    return {
        "s": rest,
        "p": f"parallel({rest})",
        "l": f"pipeline({rest})",
        "t": "now()",
        "u": "uuid4()",
        "a": f"agent turn {rest}",
        "z": "sleep()",
        "g": f"wait_for_signal({rest!r})",
        "c": f"call {rest}",
    }.get(kind, identity)


@dataclass(frozen=True, slots=True)
class SequenceHistory:
    """One sequence as journaled: entries are (epoch, identity, value)."""

    cut: tuple[int, int] | None
    high_water: int
    entries: list[tuple[int, str, str | None]]

    def live_entries(self) -> list[tuple[str, str | None]]:
        """The history replay must follow: entries up to the first dead one."""
        live: list[tuple[str, str | None]] = []
        for index, (epoch, identity, value) in enumerate(self.entries):
            if self.cut is not None and index > self.cut[1] and epoch < self.cut[0]:
                break
            live.append((identity, value))
        return live


def parse_sequence(run_id: str, seq: str, reply: Sequence[Any]) -> SequenceHistory:
    """The reply of ``read_sequence.lua``: cut, high-water mark, then entry/value pairs."""
    try:
        cut: tuple[int, int] | None = None
        if reply[0]:
            cut_epoch, cut_index = str(reply[0]).split(":", 1)
            cut = (int(cut_epoch), int(cut_index))
        entries: list[tuple[int, str, str | None]] = []
        for i in range(2, len(reply), 2):
            epoch, identity = str(reply[i]).split(":", 1)
            value = reply[i + 1]
            entries.append((int(epoch), identity, str(value) if value else None))
        return SequenceHistory(cut=cut, high_water=int(reply[1]) if reply[1] else -1, entries=entries)
    except (ValueError, IndexError, TypeError) as exc:
        raise StorageCorruptError(f"Journal of run {run_id} is corrupt in sequence {seq}: {exc!r}") from None


# -- outcomes --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """A journaled outcome: a value, or a failure tagged with its attempt.

    ``error_type`` is the original exception's class name for an ordinary
    failure and the error's stable code for a fatal one; ``detail`` is the
    one extra field a fatal error needs (the limit's name).
    """

    kind: str  # "o" value, "e" ordinary failure, "f" fatal failure
    epoch: int
    value: Any = None
    error_type: str = ""
    message: str = ""
    found_by_engine: bool = False
    detail: str = ""

    def is_live(self, epoch: int) -> bool:
        """A value always is; a failure only within the attempt that saw it."""
        return self.kind == "o" or self.epoch == epoch

    def encode(self) -> str:
        if self.kind == "o":
            return "o" + _dumps(self.value)
        body: dict[str, Any] = {"type": self.error_type, "message": self.message}
        if self.found_by_engine:
            body["engine"] = True
        if self.detail:
            body["detail"] = self.detail
        return f"{self.kind}{self.epoch}|{_dumps(body)}"

    def step_result(self, key: str) -> Any:
        """The value, or the failure raised as the workflow sees it."""
        if self.kind == "o":
            return self.value
        if self.kind == "f":
            raise self.fatal_error()
        raise StepFailed(key, self.error_type, self.message, found_by_engine=self.found_by_engine)

    def fatal_error(self) -> Exception:
        return fatal_from_code(self.error_type, self.message, self.detail)

    @property
    def result(self) -> Any:
        """What a branch, an agent turn or a fan-out slot yields: the value, or None for a failure."""
        return self.value if self.kind == "o" else None


def value_outcome(result: Any) -> Outcome:
    """A value outcome of a plain JSON value (already checked; ``JSON_NULL`` already None)."""
    return Outcome("o", 0, value=result)


def failure_outcome(epoch: int, error: BaseException, *, fatal: bool = False) -> Outcome:
    """An exception as a journaled failure: a fatal one by its stable code."""
    if fatal:
        code = getattr(error, "code", None) or type(error).__name__
        detail = error.limit if isinstance(error, WorkflowLimitReached) else ""
        return Outcome("f", epoch, error_type=str(code), message=str(error), detail=detail)
    if isinstance(error, StepFailed):
        return Outcome(
            "e", epoch, error_type=error.error_type, message=error.error_message, found_by_engine=error.found_by_engine
        )
    return Outcome("e", epoch, error_type=type(error).__name__, message=str(error))


def decode_outcome(raw: str) -> Outcome:
    try:
        kind = raw[0]
        if kind == "o":
            return Outcome("o", 0, value=json.loads(raw[1:]))
        if kind in ("e", "f"):
            epoch, body = raw[1:].split("|", 1)
            data = json.loads(body)
            return Outcome(
                kind,
                int(epoch),
                error_type=str(data["type"]),
                message=str(data["message"]),
                found_by_engine=bool(data.get("engine", False)),
                detail=str(data.get("detail", "")),
            )
    except (IndexError, ValueError, KeyError, TypeError):
        pass
    raise StorageCorruptError(f"Journal entry is not an outcome celery-durable wrote: {raw[:80]!r}")


# -- step rows -----------------------------------------------------------------------------

STEP_STATUSES = frozenset({"running", "completed", "failed", "interrupted"})


@dataclass(frozen=True, slots=True)
class StepRow:
    """What the run detail lists of one step: running, or how it settled."""

    status: str
    attempt: int
    started_at: int | None
    finished_at: int | None
    error: str | None
    op: str = ""
    """Where the step stands, "<seq>:<index>": it orders steps begun in the same ms."""

    def encode(self) -> str:
        return _dumps(
            {
                "status": self.status,
                "attempt": self.attempt,
                "started_at": self.started_at,
                "finished_at": self.finished_at,
                "error": self.error,
                "op": self.op,
            }
        )

    @classmethod
    def running(cls, attempt: int, now: int, op: str = "") -> StepRow:
        return cls("running", attempt, now, None, None, op)

    def settled(self, outcome: Outcome, now: int) -> StepRow:
        if outcome.kind == "o":
            return StepRow("completed", self.attempt, self.started_at, now, None, self.op)
        error = f"{outcome.error_type}: {outcome.message}"
        return StepRow("failed", self.attempt, self.started_at, now, error, self.op)

    def order(self) -> tuple[int, int, tuple[int, ...]]:
        """Begun first, first: by start time, then by position (``op``), numerically."""
        seq, _, index = self.op.rpartition(":")
        position = tuple(int(part) for part in [*seq.split(".")[1:], index] if part.isdigit())
        return (self.started_at is None, self.started_at or 0, position)

    @classmethod
    def parse(cls, key: str, raw: str) -> StepRow:
        try:
            row = json.loads(raw)
            status = row["status"]
            if status not in STEP_STATUSES:
                raise ValueError(f"status {status!r}")
            return cls(
                status=status,
                attempt=int(row["attempt"]),
                started_at=_optional_ms(row.get("started_at")),
                finished_at=_optional_ms(row.get("finished_at")),
                error=None if row.get("error") is None else str(row["error"]),
                op=str(row.get("op") or ""),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StorageCorruptError(
                f"The row of step {key[:200]!r} is not one celery-durable wrote ({exc!r:.80}): {raw[:80]!r}"
            ) from None


def _optional_ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"time {value!r}")
    return int(value)


# -- agent rows ------------------------------------------------------------------------------

AGENT_STATUSES = frozenset({"queued", "running", "completed", "failed", "interrupted"})


def agent_row_key(agent_id: str, epoch: int) -> str:
    """One row per turn and attempt: a turn interrupted with its attempt keeps its row."""
    return f"{agent_id}@{epoch}"


def queued_agent_row(agent_id: str, label: str | None, model: str | None, attempt: int, now: int) -> str:
    return _dumps(
        {
            "agent_id": agent_id,
            "label": label,
            "model": model,
            "status": "queued",
            "attempt": attempt,
            "queued_at": now,
            "started_at": None,
            "completed_at": None,
            "active_ms": 0,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "ai_credits": 0.0},
            "error": None,
        }
    )


def finished_agent_row(
    current: str | None, *, failed: bool, started_at: int, completed_at: int, active_ms: int,
    usage: Mapping[str, Any], error: str | None,
) -> str:
    """The queued row of a turn, settled; the fields the turn did not change are kept."""
    try:
        row = json.loads(current) if current else {}
    except ValueError:
        row = {}
    if not isinstance(row, dict):
        row = {}
    row.update(
        status="failed" if failed else "completed",
        started_at=started_at,
        completed_at=completed_at,
        active_ms=active_ms,
        usage=dict(usage),
        error=error,
    )
    return _dumps(row)


def parse_agent_row(raw: str) -> dict[str, Any]:
    """An agent row as stored (timestamps in ms); corruption said as such."""
    try:
        row = json.loads(raw)
        if not isinstance(row, dict):
            raise TypeError("not an object")
        status = row.get("status")
        if status not in AGENT_STATUSES:
            raise ValueError(f"status {status!r}")
        usage = row.get("usage") or {}
        if not isinstance(usage, dict):
            raise TypeError("usage is not an object")
        return {
            "agent_id": row.get("agent_id"),
            "label": row.get("label"),
            "model": row.get("model"),
            "status": status,
            "started_at": _optional_ms(row.get("started_at")),
            "completed_at": _optional_ms(row.get("completed_at")),
            "active_ms": int(row.get("active_ms") or 0),
            "usage": usage,
            "error": row.get("error"),
            "attempt": row.get("attempt"),
        }
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        raise StorageCorruptError(f"An agent row is not one celery-durable wrote: {exc!r:.200}") from None
