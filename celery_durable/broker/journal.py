"""The seam between replay and storage: one attempt's view of its run's journal.

In the spirit of DBOS's check/record pair, every call a workflow makes is
checked against the journal and recorded in it through this protocol, and
each answer is a small typed result: the call is new, it is a hit, or the
journal holds a different call at that position (``Conflict``: the workflow
is not deterministic). An attempt that lost its authority (a newer epoch
owns the run, or the run settled) is *fenced*: that is raised as
``StaleAttemptError``, never returned, because nothing may continue after it.

Writes that make the caller send a Celery message take that message's task
id (``wake``, ``message``, ``messages``): the run records it as in flight in
the same script, which is how the recovery sweep tells a run whose work
waits in a queue from one whose work was lost (liveness in ``_prelude.lua``).

One implementation: ``RedisJournal``, where every write is one fenced Lua
script, held to this contract by ``tests/contract`` on one Redis and on a
Redis Cluster. Tests and ``celery_durable.testing`` run the same scripts on
a private redis-server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from celery_durable.broker.schema import Outcome, SequenceHistory

if TYPE_CHECKING:
    from celery_durable.broker.child_types import ChildCall, ChildDone

ProgressRecordArgs = tuple[int, str, str, str]
"""A buffered progress record: (position, kind, phase id, message)."""

READ_ENTRIES_BUDGET = 1024
"""Journal entries ``read_sequences`` reads before it stops (after the sequence
that spends them): the rest are read when they are reached."""


@dataclass(frozen=True, slots=True)
class Flags:
    """The run's control flags, returned by every fenced write so an attempt
    learns of a cancellation, a pause or a ceiling reached without a read."""

    cancel: bool = False
    pause: bool = False
    limit: str = ""


@dataclass(frozen=True, slots=True)
class BeginCall:
    """What happens before a call runs: the sequence's buffered progress is
    written (records an earlier replay wrote are dropped by position), a
    step shows as running, and a re-run of an older attempt's failure cuts
    the sequence (``cut``, see ``schema.cut_argument``)."""

    cut: str | None = None
    step_key: str = ""
    step_row: str = ""
    records: Sequence[ProgressRecordArgs] = ()

    def argv(self) -> list[Any]:
        """The ARGV tail that begins a call (``begin_call`` in ``_prelude.lua``):
        cut, step key, step row, then the buffered progress records, flat."""
        records = self.records
        return [self.cut or "", self.step_key, self.step_row, len(records), *(f for record in records for f in record)]


@dataclass(frozen=True, slots=True)
class PendingCommit:
    """One op to journal: its index and identity, and for a step or a value
    op the field and encoded value, and the step row to leave."""

    index: int
    identity: str
    value_field: str = ""
    value: str = ""
    step_key: str = ""
    step_row: str = ""


@dataclass(frozen=True, slots=True)
class LastWrites:
    """What a main body's pass that settles has not written yet: the step it
    held back and its buffered progress, which go out with ``finish.lua``
    rather than in a round trip of their own (``Replay.last_writes``).
    ``knew_cancel``: whether the settlement was decided knowing of a cancel;
    one it did not know of sends the writes back to be made as a pass that
    did not settle makes them, and the settlement decided again."""

    seq: str
    commit: PendingCommit | None
    call: BeginCall
    knew_cancel: bool

    def argv(self) -> list[Any]:
        """``finish.lua``'s ARGV from its 12th on."""
        commit = list(astuple(self.commit)) if self.commit is not None else [""] * 6
        return [int(self.knew_cancel), self.seq, *commit, *self.call.argv()]


@dataclass(frozen=True, slots=True)
class Began:
    flags: Flags
    existing: str | None = None
    """The step's live journaled outcome when another sequence (or an attempt
    that died before recording this op) already journaled the key."""
    woke: bool = False
    """``complete_begin``: the branch it completed must wake the coordinator."""


@dataclass(frozen=True, slots=True)
class HeldBranch:
    """A finished branch's completion, held back to travel with the first
    begin of the next branch the same execution runs (``complete_begin``):
    its outcome (never a fatal one), and its last step, held back too."""

    call: str
    branch: int
    outcome: str
    seq: str
    """The branch's sequence, where its step goes."""
    step: PendingCommit
    wake: str
    """Task id of the coordinator message to send should this outcome wake it ('' for none)."""


@dataclass(frozen=True, slots=True)
class Recorded:
    flags: Flags
    winner: str | None = None
    """The value already journaled first (first write wins): use it, not yours."""


@dataclass(frozen=True, slots=True)
class Conflict:
    """The journal holds ``journaled`` at this position: non-determinism."""

    journaled: str


@dataclass(frozen=True, slots=True)
class Winner:
    """The held-back step lost a first-write race to ``value``; nothing was begun."""

    value: str


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A fan-out op was journaled. ``pending``: its branches are in flight
    already; else ``indices`` are the branches to send (none: all are done),
    and ``cut`` says branches an older attempt failed run again."""

    pending: bool = False
    cut: bool = False
    indices: list[int] = field(default_factory=list)
    in_flight: int = 0
    """With ``pending``: the run's messages in flight, the caller's own
    included. One means no branch is running or queued: what is left of the
    fan-out waits for the outside world."""


@dataclass(frozen=True, slots=True)
class WaitResult:
    """A durable wait reached: ``done`` with its journaled ``outcome`` (JSON
    text), or registered to be woken; ``due`` is its due time in ms, fixed
    when the wait was first reached (None: a signal without a timeout)."""

    done: bool
    flags: Flags
    outcome: str | None = None
    due: int | None = None


class CallVerdict(StrEnum):
    """``call.lua``'s verdicts."""

    HIT = "hit"  # the outcome is journaled: the task's result, or how it failed or timed out
    PUBLISH = "publish"  # send the task now: this attempt has not sent it yet
    PENDING = "pending"  # it is in flight; the caller waits too


@dataclass(frozen=True, slots=True)
class TaskCall:
    """The answer to a task call (``ctx.call``, ``call.lua``); ``outcome``
    (JSON text) comes with a hit only."""

    verdict: CallVerdict
    flags: Flags
    outcome: str | None = None


class AgentVerdict(StrEnum):
    """``agent_call.lua``'s verdicts."""

    HIT = "hit"  # the turn's outcome is journaled
    PENDING = "pending"  # the turn is in flight; the caller waits too
    DISPATCH = "dispatch"  # send the turn's task
    LIMIT = "limit"  # a ceiling stops it: see the flags


@dataclass(frozen=True, slots=True)
class AgentCall:
    """The answer to an agent turn request (``agent_call.lua``), with the
    turn's ``outcome`` on a hit."""

    verdict: AgentVerdict
    flags: Flags
    outcome: str | None = None


class JournalIdentity:
    """What every journal answers alike: its run, its attempt's epoch and its
    clock (a base of ``RedisJournal`` and ``ArchivedJournal``)."""

    def __init__(self, run_id: str, epoch: int, clock: Callable[[], int]) -> None:
        self._run_id = run_id
        self._epoch = epoch
        self._clock = clock

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def epoch(self) -> int:
        return self._epoch

    def now_ms(self) -> int:
        return self._clock()


class Journal(Protocol):
    """One attempt (``epoch``) of one run; every write is fenced by the epoch."""

    @property
    def run_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    def now_ms(self) -> int:
        """The store's time, which its scripts compare due times with: replay
        computes a wait's or a call's due time, and ``ctx.now()``, from it, so
        a store on a virtual clock (``celery_durable.testing``) skips time consistently."""
        ...

    def note_code(self, code_hash: str) -> None:
        """This attempt runs code whose hash differs from the one the run last
        ran (a deploy since): record it, fenced (``note_code.lua``)."""
        ...

    def read_sequence(self, seq: str, start: int = 0) -> SequenceHistory:
        """The sequence's ops as journaled from index ``start``, with their
        values, cut and high-water mark."""
        ...

    def read_sequences(self, seqs: Sequence[str]) -> list[SequenceHistory]:
        """Whole sequences in one read, in order: ``read_sequence`` of each
        of the first ``seqs`` (at least one; fewer than all when their
        histories are long)."""
        ...

    def begin(self, seq: str, call: BeginCall) -> Began: ...

    def commit_begin(self, seq: str, commit: PendingCommit, call: BeginCall) -> Began | Conflict | Winner:
        """Journal ``commit`` (the step the sequence ran last) and begin its next call, atomically."""
        ...

    def record(self, seq: str, commit: PendingCommit, *, compensation: bool = False) -> Recorded | Conflict:
        """Journal ``commit``; a saga's ``compensation`` is named as the sequence's last one
        (``SequenceHistory.compensated``)."""
        ...

    def dispatch(
        self, seq: str, index: int, identity: str, width: int, token: str, position: int
    ) -> Dispatch | Conflict:
        """Journal a fan-out op and decide which branches the execution ``token`` sends."""
        ...

    def sending(self, call: str, messages: Sequence[str]) -> None:
        """The dispatching execution is about to publish branch tasks with
        these task ids: the run counts them in flight from now (never after
        they are published: one may have run and ended by then)."""
        ...

    def mark_sent(self, call: str) -> None:
        """The dispatching execution finished publishing the branch tasks:
        a later execution of this epoch must not send them again."""
        ...

    def branch_outcomes(self, call: str, count: int, only: Sequence[int] | None = None) -> list[str | None]:
        """The outcomes of branches 0..count-1 of ``call`` (None: not yet), or
        of the branches ``only`` names, in its order: a branch task reads its
        own, not every branch of a wide fan-out."""
        ...

    def hand_off(self, call: str, giver: str, branches: Sequence[int], messages: Sequence[str]) -> None:
        """Branch task ``giver`` is about to hand ``branches`` on to new tasks
        ``messages`` (counted in flight from now, as ``sending``): a
        redelivery of ``giver`` must not run them."""
        ...

    def handed_off(self, call: str, giver: str) -> list[int]:
        """The branches of ``call`` that task ``giver`` handed on in this attempt."""
        ...

    def unsent(self, messages: Sequence[str], *, call: str = "", giver: str = "", call_key: str = "") -> None:
        """The broker refused ``messages``, counted in flight: they are
        forgotten, and with them the record of what ``giver`` handed on of
        ``call`` (it runs those itself), or this attempt's publication of task
        call ``call_key`` (so that it is published again) (``unsent.lua``)."""
        ...

    def complete_branch(self, call: str, branch: int, outcome: str, wake: str, ending: str = "") -> bool:
        """Journal a branch outcome; True when the coordinator must be woken,
        by a message whose task id is ``wake`` (then counted as in flight).
        ``ending``: the task id of a branch task whose last branch this is,
        ended here as ``RunStore.task_end`` would end it, unless this returns
        True: the caller then sends the wake and ends its message after."""
        ...

    def complete_held(
        self, call: str, branch: int, outcome: str, wake: str, ending: str, seq: str, held: PendingCommit
    ) -> bool | Winner | Conflict:
        """``complete_branch`` with the branch's last step, held back, journaled
        first (``record``). ``Winner``: another execution journaled that step
        first, and nothing of the branch was written (run it again);
        ``Conflict``: the journal holds another op there."""
        ...

    def complete_begin(self, seq: str, held: HeldBranch, call: BeginCall) -> Began | Winner | Conflict:
        """``complete_held`` of ``held`` (ending no message), then ``begin`` of
        ``call`` in ``seq``, in one round trip: a branch task's quick branches
        cost one script each. ``Winner``/``Conflict``: about the held step, as
        ``complete_held`` says; then nothing was written, not even the begin.
        ``Began.woke``: the coordinator must be woken (``held.wake`` is counted)."""
        ...

    def agent_call(
        self,
        seq: str,
        index: int,
        agent_id: str,
        request_json: str,
        owner: str,
        row_json: str,
        cut: str | None,
        message: str,
    ) -> AgentCall | Conflict:
        """Ask for an agent turn; on ``dispatch`` the caller sends the turn's
        task with task id ``message`` (already counted as in flight)."""
        ...

    def wait(
        self, seq: str, index: int, identity: str, kind: str, name: str, due_ms: int | None, owner: str
    ) -> WaitResult | Conflict:
        """Reach a durable wait (``kind`` 'timer' or 'signal'): it ends now or
        is registered for ``owner`` to be woken. ``due_ms`` counts only the
        first time the op is reached; later calls keep that due time."""
        ...

    def call(self, seq: str, index: int, key: str, owner: str, due_ms: int | None, cut: str | None,
             running_row: str, timeout_outcome: str, inputs: str = "") -> TaskCall | Conflict:
        """Call a task of the fleet under ``key`` (``call.lua``): answered from
        the journal, published once per attempt (showing ``running_row``, and
        keeping ``inputs``, the call's arguments as JSON, for the history), or
        waited for until ``due_ms`` (fixed when first reached, and again by an
        attempt that calls again after an older attempt's failure), past which
        ``timeout_outcome`` is journaled."""
        ...

    def child(
        self, seq: str, index: int, key: str, owner: str, due_ms: int | None, cut: str | None,
        child_run_id: str, workflow: str, *, wait: bool,
    ) -> ChildCall | Conflict:
        """Start a child run under ``key`` (``wait`` False: ``ctx.start_child``)
        or wait for it (``ctx.child``) until ``due_ms``, fixed when first
        reached (``child.lua``): the op journaled, the child entered in the
        run's children hash. Its run is the caller's to create."""
        ...

    def child_done(self, key: str, child_run_id: str, outcome: Outcome) -> ChildDone:
        """Journal the end of a child this attempt found settled itself (or its
        time-out), fenced by the epoch; nothing is woken: the caller goes on."""
        ...

    def mark_compensable(self) -> Flags:
        """A saga registered a compensation: a pass that finds the run cancelled
        replays it to run its compensations (``compensable.lua``)."""
        ...

    def step_over(self, seq: str, index: int) -> Flags:
        """A cancelled pass stepped over op ``index`` of ``seq``, journaled
        without an answer: every later replay steps over it alike, and an
        answer that comes for it is late (``step_over.lua``)."""
        ...

    def wake_branches(self, call: str) -> list[int]:
        """A cancelled run that compensates: the branches of fan-out ``call``
        that wait stop waiting (``wake_branches.lua``); the caller sends them
        again, to meet the cancellation and compensate."""
        ...


Around = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
"""Runs one call of the inner journal: (its bound method, args, kwargs) -> its answer."""

JOURNAL_CALLS = frozenset(
    name for name, member in vars(Journal).items() if callable(member) and not name.startswith("_")
)
"""The methods of the ``Journal`` protocol (its properties are not calls)."""


class GuardedJournal:
    """Every method of ``Journal``, forwarded to ``inner`` through ``around``.

    A ``Journal`` that passes every call of another through one function.

    Replay's sticky journal (a lost execution stays lost) and the test
    environment's crashing one (an attempt dies at a chosen step) are wrappers
    of the store's journal. Written out method by method, each restated the
    whole protocol, and every journaled write the engine gained had to be added
    to both. ``GuardedJournal`` takes its methods from the protocol itself: a
    method ``Journal`` declares is forwarded through ``around``; a name it does
    not declare is an ``AttributeError``, as on the store's journal, never
    passed through unguarded. A wrapper adds behaviour to a method by defining
    it (``testing/crash.py``), not by restating the others.
    """

    def __init__(self, inner: Journal, around: Around) -> None:
        self._inner = inner
        self._around = around

    @property
    def run_id(self) -> str:
        return self._inner.run_id

    @property
    def epoch(self) -> int:
        return self._inner.epoch

    def __getattr__(self, name: str) -> Any:
        # Reached only for names the class does not define: the protocol's
        # methods this wrapper adds nothing to.
        if name not in JOURNAL_CALLS:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}: Journal declares no such method")
        method = getattr(self._inner, name)
        around = self._around

        def guarded(*args: Any, **kwargs: Any) -> Any:
            return around(method, args, kwargs)

        guarded.__name__ = name
        self.__dict__[name] = guarded  # found directly from now on
        return guarded
