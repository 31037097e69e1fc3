"""Child runs (SPEC §5b): the children hash, a child's link to its parent,
and how a child's end is journaled in its parent.

**Children hash** (``P:{R}:children``), one field per child key of run R,
written by ``child.lua`` when the parent first reaches the call: a JSON
object (``ChildEntry``) ``{"run_id", "workflow", "mode", "at"?, "warned"?, "timed_out"?}``
where ``mode`` is ``"wait"`` (``ctx.child``: the parent waits for it, and
cancelling the parent cancels it) or ``"start"`` (``ctx.start_child``:
detached), ``at`` the ``"<seq>:<i>"`` of the op that waits for it (its
entry in the waits hash), ``warned`` a workflow name the parent asked for
under the key after it had started another (said once, by a ``system``
progress record), ``timed_out`` the ``at`` of the op whose time-out passed
(set by ``child.lua`` when it first answers ``due``; absent on entries
written before it existed, which read as not timed out): while it equals
``at``, the parent ends the call itself, by the time-out, and the child's
settling journals nothing (``child_done.lua``).

**A child's run hash** names its parent (``parent_run_id``, ``parent_key``):
when the child settles, its end is told to the parent (``child_done.lua``),
which journals it under the key. The child's id is derived from the
parent's and the key, so every attempt of the parent finds the same child.

**In the parent's journal** the op is ``k|<key>`` (``ctx.child``, its
outcome in ``v:<key>`` as a step's) or ``d|<key>`` (``ctx.start_child``,
its value ``x:<seq>:<i>`` the child's run id, written once the child
exists). A child that completed is a value outcome, its result (or None);
one that ended ``error`` or ``cancelled`` an ordinary failure of type
``ChildWorkflowFailed`` whose ``detail`` is ``{"run_id", "status",
"reason"}`` as JSON, tagged with the parent's attempt that learned it (a
later attempt looks at the child again).
"""

from __future__ import annotations

import builtins
import json
import sys
import uuid
from dataclasses import dataclass
from typing import Any

from celery_durable.broker.schema.outcomes import Outcome, value_outcome
from celery_durable.errors import ChildWorkflowFailed, StepFailed, StorageCorruptError

CHILD_FIELDS: dict[str, str] = {
    "<key>": "the child run started under <key>: JSON {run_id, workflow, mode 'wait'|'start', at?, warned?, "
    "timed_out?}",
}
"""The children hash's one kind of field (see the module docstring)."""

CHILD_NAMESPACE = uuid.UUID("a3d5c1e4-7f62-4b0e-9c8d-2e1f0b7a6c54")
"""uuid5 of ``"<parent run id>:<key>"`` in this namespace is the child's run id."""

CHILD_FAILED = "ChildWorkflowFailed"
CHILD_TIMEOUT = "ChildTimeout"
SETTLED_FOR_PARENT = frozenset({"completed", "error", "cancelled"})
"""How a child ends its parent's wait; ``paused`` and ``halted`` keep it waiting."""


def child_run_id(parent_run_id: str, key: str) -> str:
    """The child's run id: the same on every attempt of the parent, a valid run id (32 hex)."""
    return uuid.uuid5(CHILD_NAMESPACE, f"{parent_run_id}:{key}").hex


def parent_fields(parent_run_id: str, key: str) -> dict[str, str]:
    """The run hash fields that link a child to its parent (``new_run_fields`` adds them)."""
    return {"parent_run_id": parent_run_id, "parent_key": key}


@dataclass(frozen=True, slots=True)
class ChildEntry:
    """One field of the children hash."""

    key: str
    run_id: str
    workflow: str
    mode: str

    @property
    def waited_for(self) -> bool:
        return self.mode == "wait"


def parse_children(run_id: str, raw: dict[str, str]) -> list[ChildEntry]:
    """The children hash as stored, in key order."""
    entries = []
    for key in sorted(raw):
        try:
            data = json.loads(raw[key])
            entries.append(ChildEntry(key, str(data["run_id"]), str(data["workflow"]), str(data["mode"])))
        except (ValueError, KeyError, TypeError):
            error = f"Run {run_id}: child entry {key[:80]!r} is not one celery-durable wrote"
            raise StorageCorruptError(error) from None
    return entries


def child_outcome(
    key: str, child_run_id: str, workflow: str, status: str, reason: str | None, error: str | None, result: Any
) -> Outcome:
    """How a settled child ends its parent's call: its result, or ``ChildWorkflowFailed``
    (the epoch is the parent attempt's that journals it: see ``outcome_payload``)."""
    if status == "completed":
        return value_outcome(result)
    detail = json.dumps({"run_id": child_run_id, "status": status, "reason": reason}, separators=(",", ":"))
    said = f" ({reason})" if reason else ""
    message = f"Child run {child_run_id} of workflow {workflow!r} (key {key!r}) ended {status}{said}: {error or status}"
    return Outcome("e", 0, error_type=CHILD_FAILED, message=message, found_by_engine=True, detail=detail)


def outcome_payload(outcome: Outcome) -> tuple[str, str]:
    """(tag, payload) for ``child_done.lua``, which tags a failure with the
    parent's epoch itself: ``"o"`` and the value's JSON, or ``"e"`` and the
    failure's body."""
    encoded = outcome.encode()
    if outcome.kind == "o":
        return "o", encoded[1:]
    return outcome.kind, encoded.split("|", 1)[1]


def child_status(outcome: Outcome) -> str:
    """The status a child ended with, as its journaled outcome says (for the history)."""
    if outcome.kind == "o":
        return "completed"
    try:
        return str(json.loads(outcome.detail)["status"])
    except (ValueError, KeyError, TypeError):
        return "error"


def slot_error(outcome: Outcome, slot: str) -> Exception:
    """The exception a failed ``parallel``/``pipeline`` slot stands for
    (``errors="return"``/``"raise"``), the same on every replay: a step's
    failure as ``StepFailed`` (a child's as ``ChildWorkflowFailed``); the
    thunk's own exception as its own type with its message, where that type
    is a builtin or defined in a module this process has loaded (the
    workflow's code raised it, so its module is; nothing is imported by
    name); else ``StepFailed`` keyed ``slot`` that names the type."""
    if outcome.key:
        if outcome.error_type == CHILD_FAILED and outcome.detail:
            return child_error(outcome.key, outcome)
        return StepFailed(outcome.key, outcome.error_type, outcome.message, found_by_engine=outcome.found_by_engine)
    own = _loaded_type(outcome.origin) if outcome.origin else getattr(builtins, outcome.error_type, None)
    if isinstance(own, type) and issubclass(own, Exception):
        try:
            return own(*outcome.args) if outcome.args is not None else own(outcome.message)
        except Exception:  # a type whose constructor wants other arguments
            pass
    return StepFailed(slot, outcome.error_type, outcome.message, found_by_engine=outcome.found_by_engine)


def _loaded_type(origin: str) -> object:
    """The object ``module:qualname`` names, looked up in loaded modules only."""
    module_name, _, qualname = origin.partition(":")
    found: object = sys.modules.get(module_name)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found


def child_error(key: str, outcome: Outcome) -> StepFailed:
    """The failure a child call raises for a journaled failure outcome."""
    if outcome.error_type != CHILD_FAILED:
        return StepFailed(key, outcome.error_type, outcome.message, found_by_engine=outcome.found_by_engine)
    try:
        detail = json.loads(outcome.detail)
        return ChildWorkflowFailed(key, str(detail["run_id"]), str(detail["status"]), detail["reason"], outcome.message)
    except (ValueError, KeyError, TypeError):
        raise StorageCorruptError(f"Journal entry of child {key!r} is not one celery-durable wrote") from None
