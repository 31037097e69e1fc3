"""Every storage operation, one row each: the one place a reader looks to
learn what a script takes, what it answers, and which rules its callers
must honour.

A row names the script's KEYS by role (attributes of the key owner it is
called on: ``keys.RunKeys`` for a run's scripts, ``ThrottleKeys``,
``ScheduleKeys``, ``NamespaceKeys``; ``*`` is every other key of that owner,
in its order; a role ending in ``?`` is a key the caller adds when it has
one), its reply's parser (``replies``), and four columns:

- ``fenced``: ``True`` when the prelude's fence rule (``_prelude.lua``, its
  last lines) refuses the script unless ARGV[1], the caller's epoch, owns
  the run in KEYS[1]; otherwise why not (the script's own rule, or none);
- ``indexed``: the script may change a run's status or waiting summary, so
  its namespace's indexes are synced after it (``run_index.py``);
- ``reads_only``: the script writes nothing;
- ``wakes``: the script may count a wake (a message counted in flight before
  it is published); with ``watched``, why its caller is one the sweep
  already watches the run for, else the run's look is scheduled first
  (``store_core.LOOK_FIRST``).

Every list of scripts that do a thing is derived from these rows; the
tests check each column against the Lua (``tests/unit/test_ops_table.py``), so
a new operation is its row and its script. One call path builds KEYS from
the row (``StoreCore.call``).

A row's ``request`` is its script's ARGV as named fields, in ARGV order
(``Request``), for the scripts whose ARGV is long enough to get wrong by
position: ``StoreCore.call`` takes one in place of a list and checks it is
its row's. A field that is itself a request, or a sequence, spreads; a bool
is sent as 0/1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, field, fields
from typing import Any

from celery_durable.broker.replies import children, control, fleet, history, index, journal, run, schedules, throttles
from celery_durable.broker.schema import Outcome, child_status, outcome_payload


@dataclass(frozen=True)
class Op:
    parse: Callable[..., Any]
    roles: str
    """KEYS by role, in order, separated by spaces."""
    fenced: bool | str = True
    indexed: bool = False
    reads_only: bool = False
    wakes: bool = False
    watched: str = ""
    request: type[Request] | None = None
    """The typed request its callers give in place of an ARGV list (``Request``, below)."""
    keys: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(self.roles.split()))

    def argv(self, name: str, args: Sequence[Any] | Request) -> Sequence[Any]:
        """ARGV of a call: its row's typed request spread, or the list given
        to a script that has none."""
        if isinstance(args, Request) or self.request is not None:
            assert type(args) is self.request, f"{name} takes a {self.request}"
            return args.argv()
        return args

    def keys_of(self, owner: Any) -> list[str]:
        """KEYS for a call on ``owner`` (a ``RunKeys``, ``ThrottleKeys``…)."""
        named = [getattr(owner, role) for role in self.keys if role != "*" and not role.endswith("?")]
        if "*" in self.keys:
            named += [key for key in astuple(owner) if key not in named]
        return named


# -- typed requests: a script's ARGV as named fields --------------------------


@dataclass(frozen=True, slots=True)
class Request:
    def argv(self) -> list[Any]:
        return _spread([getattr(self, field.name) for field in fields(self)])


def _spread(values: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if isinstance(value, Request):
            out += value.argv()
        elif isinstance(value, Sequence) and not isinstance(value, str):
            out += _spread(value)
        else:
            out.append(int(value) if isinstance(value, bool) else value)
    return out


@dataclass(frozen=True, slots=True)
class Lock(Request):
    """What taking a pass's lock needs (``activate_run`` in ``_prelude.lua``)."""

    lock_ms: int
    lease_ms: int
    channel: str
    resend: str
    """The message that comes back if another pass holds the lock."""


@dataclass(frozen=True, slots=True)
class Activate(Request):
    epoch: int
    token: str
    now: int
    lock: Lock
    tail: Sequence[Any] = ()
    """A sequence and the index its tail is read from, or nothing."""
    expect: Sequence[Any] = ()
    """With a tail: the workflow and namespace a message names whose pass has
    not read its run (``RunStore.activate_unread``), or nothing."""


@dataclass(frozen=True, slots=True)
class CallDone(Request):
    epoch: int
    now: int
    key: str
    outcome: str
    error: str
    wake_prefix: str
    here: Sequence[Any] = ()
    """The pass taken where the answer came: its token, ``Lock``, sequence,
    start and soft flag, or nothing."""


@dataclass(frozen=True, slots=True)
class Finish(Request):
    epoch: int
    now: int
    channel: str
    status: str
    reason: str
    error: str
    can_resume: bool
    has_result: bool
    result: str
    message: str
    retention_ms: int
    last: Sequence[Any] = ()
    """A settling pass's writes not made yet (``RunControl.finish``), or nothing."""


@dataclass(frozen=True, slots=True)
class Resume(Request):
    epoch: int
    """The epoch the caller read: the script refuses if it changed."""
    status: str
    now: int
    channel: str
    limits_json: str
    message: str
    lease_ms: int
    code_hash: str
    recovery: int
    """0 a resume, 1 a recovery (the old attempt must be dead), 2 a forced one."""
    run_fields: str
    message_id: str
    room: str


@dataclass(frozen=True, slots=True)
class Halt(Request):
    epoch: int
    """The epoch the caller read: the script refuses if it changed."""
    status: str
    now: int
    channel: str
    lease_ms: int
    room: str
    new_status: str
    reason: str
    error: str
    message: str
    recoveries: int
    forced: bool
    retention_ms: int


@dataclass(frozen=True, slots=True)
class OpAt(Request):
    """Where a journal op is entered (``enter_op`` in ``_prelude.lua``)."""

    epoch: int
    now: int
    seq: str
    index: int
    identity: str


@dataclass(frozen=True, slots=True)
class Call(Request):
    at: OpAt
    key: str
    owner: str
    due: int | str
    """When the call times out, '' for never."""
    cut: str
    running_row: str
    timeout_outcome: str
    timeout_error: str
    channel: str
    inputs: str


@dataclass(frozen=True, slots=True)
class Child(Request):
    at: OpAt
    key: str
    owner: str
    due: int | str
    cut: str
    child_run_id: str
    workflow: str
    mode: str
    """'wait' (ctx.child) or 'start' (ctx.start_child)."""
    channel: str


@dataclass(frozen=True, slots=True)
class AgentCall(Request):
    at: OpAt
    agent_id: str
    request_json: str
    owner: str
    row_json: str
    cut: str
    message: str


@dataclass(frozen=True, slots=True)
class Wait(Request):
    at: OpAt
    kind: str
    name: str
    due: int | str
    owner: str
    channel: str


@dataclass(frozen=True, slots=True)
class ChildDone(Request):
    now: int
    key: str
    child_run_id: str
    tag: str
    payload: str
    wake_prefix: str
    epoch: int | str
    """The parent's attempt that tells it, '' for the child's settling."""
    channel: str
    status: str

    @classmethod
    def of(cls, now: int, key: str, child_run_id: str, outcome: Outcome, wake_prefix: str, epoch: int | str,
           channel: str) -> ChildDone:
        """The child's end, as its journaled ``outcome`` says it."""
        tag, payload = outcome_payload(outcome)
        return cls(now, key, child_run_id, tag, payload, wake_prefix, epoch, channel, child_status(outcome))


_SETTLE = "run progress steps running agents live waits history *"
_SWEEP = "a claim of the sweep's own, on a zset of its own"
_NAMESPACE = "the namespace's slot, no run's"
_THROTTLE = "a throttle's slot, no run's; a holder's epoch is checked against its own record"
_SCHEDULE = "a schedule's slot, no run's; its rev is checked instead"
_OUTSIDE = "a caller from outside the run's work (an operator, a sender, the sweep): no epoch to fence with"

# fmt: off
OPS: dict[str, Op] = {
    # -- a pass, a task's start, beats and end (run_passes.py) ---------------
    "activate": Op(run.activate, "run progress live history journal", indexed=True, wakes=True,
                   watched="a pass, whose message is counted in flight", request=Activate),
    "release": Op(run.release, "run live", fenced="the lock's token is checked: a settled run's pass releases too"),
    "requeue": Op(run.requeue, "run live progress history",
                  fenced="its own: a stale or settled run's message is dropped, not refused", wakes=True,
                  watched="a message counted in flight, which it replaces"),
    "heartbeat": Op(run.heartbeat, "run live", wakes=True, watched="a task counted in flight"),
    "branch_start": Op(run.branch_start, "run live journal",
                       fenced="its own: a paused run's branch starts; a forged task id is refused"),
    "task_end": Op(run.task_end, "run live", fenced="its own: a stale task still ends", wakes=True,
                   watched="a task counted in flight, which it ends"),
    "agent_start": Op(run.agent_start, "run journal agents live", wakes=True,
                      watched="an agent turn's message, counted in flight"),
    "agent_finish": Op(run.agent_finish, "run journal agents live history", wakes=True,
                       watched="an agent turn's message, counted in flight"),
    # call_done.lua only ends a task call's wait, and its activation finds the run running already: not indexed.
    "call_done": Op(run.call_done, "run journal waits live running steps history progress", wakes=True,
                    request=CallDone),
    # -- a run's record (run_records.py) --------------------------------------
    "create_run": Op(run.create_run, "run live", fenced="it makes the run: no epoch yet", wakes=True),
    "discard_run": Op(run.discard_run, "run live", fenced="its own: the epoch it was created with"),
    "index_run": Op(run.index_run, "runs counter index_meta idempotency?", fenced=_NAMESPACE),
    "release_idempotency": Op(run.release_idempotency, "idempotency?", fenced="the key's slot; its owner is checked"),
    "read_progress": Op(run.read_progress, "run progress progress_phases archive", fenced=_OUTSIDE, reads_only=True),
    "read_history": Op(history.read_history, "run history archive", fenced=_OUTSIDE, reads_only=True),
    # -- control (run_control.py) ---------------------------------------------
    # finish.lua may journal what the settling pass has not written yet: the journal and phases by name.
    "finish": Op(control.finish, "run progress steps running agents live waits history journal progress_phases *",
                 indexed=True, request=Finish),
    "resume": Op(control.resume, _SETTLE, fenced="its own: the epoch and status the caller read", indexed=True,
                 wakes=True, request=Resume),
    "halt": Op(control.halt, _SETTLE, fenced="its own: the epoch and status the caller read", indexed=True,
               request=Halt),
    "cancel": Op(control.cancel, "run progress live waits steps running agents history *", fenced=_OUTSIDE,
                 indexed=True, wakes=True),
    "pause": Op(control.pause, "run live progress history", fenced=_OUTSIDE, wakes=True),
    "note": Op(control.note, "run progress history", fenced=_OUTSIDE),
    # After a settle for good (run_control.py): the run's history, steps, progress and journal folded into one key.
    "archive_run": Op(control.archive_run, "run history steps progress journal progress_phases archive",
                      fenced="its own: the run is completed or cancelled, its keys as the caller read them"),
    "signal": Op(control.signal, "run signals waits live progress history journal", fenced=_OUTSIDE, indexed=True,
                 wakes=True),
    # -- the journal of one attempt (redis_journal.py) ---------------------
    "note_code": Op(journal.note_code, "run"),
    "read_sequence": Op(journal.read_sequence, "journal", fenced="reads only", reads_only=True),
    "read_sequences": Op(journal.read_sequences, "journal", fenced="reads only", reads_only=True),
    "begin_op": Op(journal.begin_op, "run progress journal running progress_phases history"),
    "commit_begin": Op(journal.commit_begin, "run progress journal running progress_phases steps history"),
    "record_op": Op(journal.record_op, "run journal steps running history"),
    "dispatch": Op(journal.dispatch, "run journal live history"),
    "sending": Op(journal.sending, "run journal live", wakes=True,
                  watched="a pass or a branch task, counted in flight"),
    "mark_sent": Op(journal.mark_sent, "run journal"),
    "unsent": Op(journal.unsent, "run journal live"),
    "complete_branch": Op(journal.complete_branch, "run journal live steps running history", wakes=True,
                          watched="a branch task, counted in flight"),
    "complete_begin": Op(journal.complete_begin, "run progress journal running progress_phases steps live history",
                         wakes=True, watched="a branch task, counted in flight"),
    "agent_call": Op(journal.agent_call, "run journal agents live", wakes=True,
                     watched="an agent turn's message, counted in flight", request=AgentCall),
    "wait": Op(journal.wait, "run journal waits signals history", indexed=True, request=Wait),
    # call.lua reaches the waiting writers, yet only waits for a task call, which has no place in the summary.
    "call": Op(journal.call, "run journal waits running steps history", request=Call),
    "child": Op(children.child, "run journal waits children progress history", indexed=True, request=Child),
    "child_done": Op(children.child_done, "run journal waits live children history",
                     fenced="its own: a parent told from outside has no epoch to give", indexed=True, wakes=True,
                     request=ChildDone),
    "compensable": Op(children.compensable, "run"),
    "step_over": Op(children.step_over, "run journal"),
    "wake_branches": Op(children.wake_branches, "run waits", indexed=True),
    # -- the recovery sweep (fleet_store.py) ---------------------------------
    "examine": Op(fleet.examine, "run live waits journal history", fenced=_OUTSIDE, indexed=True, wakes=True,
                  watched="the sweep, which has claimed the run (claim_due.lua)"),
    "claim_due": Op(fleet.claim_due, "due?", fenced=_SWEEP),
    "look": Op(fleet.look, "due?", fenced=_SWEEP),
    "looked": Op(fleet.looked, "due?", fenced=_SWEEP),
    "received": Op(fleet.received, "live", fenced="a message's receipt: any attempt's"),
    "mark_lost": Op(fleet.mark_lost, "run live", fenced=_OUTSIDE),
    "claim_dead_workers": Op(fleet.claim_dead_workers, "workers", fenced=_SWEEP),
    # -- a namespace's indexes (run_index.py) --------------------------------
    "index_intent": Op(index.index_intent, "index_intents", fenced=_NAMESPACE),
    "index_sync": Op(index.index_sync, "index index_state runs index_intents", fenced=_NAMESPACE),
    "index_forget": Op(index.index_forget, "runs index index_state index_intents", fenced=_NAMESPACE),
    # -- schedules (schedule_store.py) ----------------------------------------
    "schedule_put": Op(schedules.schedule_put, "schedule due ids", fenced=_SCHEDULE),
    "schedule_pause": Op(schedules.schedule_pause, "schedule due", fenced=_SCHEDULE),
    "schedule_delete": Op(schedules.schedule_delete, "schedule due ids recent runs", fenced=_SCHEDULE),
    "schedule_claim": Op(schedules.schedule_claim, "due?", fenced=_SWEEP),
    "schedule_record": Op(schedules.schedule_record, "schedule due recent runs", fenced=_SCHEDULE),
    # -- throttles (throttle_store.py) ----------------------------------------
    "throttle_set": Op(throttles.throttle_set, "*", fenced=_THROTTLE),
    "throttle_delete": Op(throttles.throttle_delete, "*", fenced=_THROTTLE),
    "throttle_acquire": Op(throttles.throttle_acquire, "*", fenced=_THROTTLE),
    "throttle_release": Op(throttles.throttle_release, "*", fenced=_THROTTLE),
    "throttle_enter": Op(throttles.throttle_enter, "run throttles"),
    "throttle_wait": Op(throttles.throttle_wait, "run throttles waits live history", indexed=True),
    "throttle_granted": Op(throttles.throttle_granted, "run throttles waits live",
                           fenced="its own: the holder's epoch, as the throttle granted it", indexed=True, wakes=True),
    "throttle_forget": Op(throttles.throttle_forget, "throttles", fenced="the run's intents only, as read"),
}
# fmt: on

SCRIPT_NAMES = tuple(sorted(OPS))
"""Every script in ``lua/``: the contract tests hold the files and the rows equal."""
FENCED = frozenset(name for name, op in OPS.items() if op.fenced is True)
INDEXED_SCRIPTS = frozenset(name for name, op in OPS.items() if op.indexed)
WAKING_SCRIPTS = frozenset(name for name, op in OPS.items() if op.wakes)
WATCHED_CALLERS = {name: op.watched for name, op in OPS.items() if op.watched}
LOOK_FIRST = WAKING_SCRIPTS - WATCHED_CALLERS.keys()
"""Every script that may count a wake for a caller the sweep does not
already watch the run for (create a run, resume it, cancel, pause, signal, a
child's end, a call's answer) runs only once the run has a look scheduled
no later than a lease from now (``StoreCore._run``). The wake it counts is
published after it returns; should its caller die before that, the sweep
finds the counted message gone and the run goes on (liveness in
_prelude.lua). A script is safe by default: leaving ``watched`` empty costs
a command, never a run."""
READS = frozenset(name for name, op in OPS.items() if op.reads_only)
