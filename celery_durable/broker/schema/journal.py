"""The journal hash (``P:{R}:journal``), op identities and sequences, and a
run's signals hash: field names built here, and the history replay reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery_durable.errors import StorageCorruptError

JOURNAL_FIELDS: dict[str, str] = {
    "n:": "n:<seq>: ops recorded in the sequence",
    "o:": "o:<seq>:<i>: op identity, '<epoch>:<identity>'",
    "v:": "v:<key>: outcome of a step, task call or child run (schema.children)",
    "x:": "x:<seq>:<i>: value of a now()/uuid4()/wait op, a started child's run id",
    "r:": "r:<call>:<j>: outcome of a branch",
    "c:": "c:<call>: branches outstanding",
    "d:": "d:<call>: '<epoch>:<execution>' that dispatched the branches",
    "s:": "s:<call>: epoch whose dispatch finished sending",
    "g:": "g:<call>:<task id>: '<epoch>|<j>,<j>,...' branches that branch task handed on to new tasks",
    "h:": "h:<seq>: progress high-water mark",
    "k:": "k:<seq>: cut '<epoch>:<op index>'",
    "u:": "u:<seq>: the last saga compensation journaled in the sequence, '<epoch>:<op index>' "
    "(dead past a cut as that op is; absent in journals older than it: Cursor.compensated_after)",
    "a:": "a:<id>: agent turn outcome",
    "q:": "q:<id>: agent turn request",
    "qe:": "qe:<id>: epoch that asked for the turn",
    "w:": "w:<id>: owners waiting for the turn",
    "wd:": (
        "wd:<seq>:<i>: due time (ms) of a wait or call op, fixed when first reached ('' for none;"
        " a call run again after an older attempt's failure fixes its own)"
    ),
    "wt:": "wt:<seq>:<i>: when (ms) a wait op was first reached (the run's history)",
    "wf:": "wf:<seq>:<i>: when (ms) a wait op's outcome was journaled (the run's history)",
    "ce:": "ce:<key>: the epoch that published the task call <key>",
    "i:": "i:<key>: the inputs of the task call <key>, JSON {'args': [...], 'kwargs': {...}} (the run's history)",
    "cuts": "how many cuts the run's sequences got (a cut voids the signals' floors, SIGNAL_FIELDS f:)",
    "stepped": "'1' once a cancelled pass stepped over an op (step_over.lua): reads look for so: marks only then",
    "so:": "so:<value field>: the journal entry a cancelled pass stepped over, unanswered (step_over.lua): "
    "every later read hides an answer to it, and one that comes is late",
    "wk:": "wk:<prefix>: the owners a call's answer or an agent turn's end woke by the messages '<prefix>-<n>' "
    "(a script run again for the same call, its reply lost, answers the same)",
}
"""Every field prefix of the journal hash (see the module docstring)."""

SIGNAL_FIELDS: dict[str, str] = {
    "n:": "n:<name>: how many signals <name> arrived",
    "p:": "p:<name>:<k>: the k-th one's JSON payload",
    "t:": "t:<name>:<k>: when it arrived (ms)",
    "k:": "k:<name>:<k>: the wait op '<seq>:<i>' that took it",
    "f:": "f:<name>: '<cuts>:<k>': signals 1..k of <name> are taken by live waits while the journal's cuts are <cuts>",
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


def handoff_field(call: str, giver: str) -> str:
    return f"g:{call}:{giver}"


def handoff_value(epoch: int, branches: Sequence[int]) -> str:
    return f"{epoch}|{','.join(str(j) for j in branches)}"


def parse_handoff(raw: str | None, epoch: int) -> list[int]:
    """The branches a ``g:`` field says were handed on in attempt ``epoch`` (none for another attempt)."""
    if not raw:
        return []
    stamp, _, text = raw.partition("|")
    try:
        if int(stamp) != epoch:
            return []
        return [int(j) for j in text.split(",") if j]
    except ValueError:
        raise StorageCorruptError(f"A hand-off record is not one celery-durable wrote: {raw[:80]!r}") from None


def call_id(seq: str, index: int) -> str:
    """The id of fan-out op ``index`` of ``seq``: its branches' outcomes and counters hang off it."""
    return f"{seq}:{index}"


def branch_seq(seq: str, index: int, branch: int) -> str:
    return f"{seq}.{index}.{branch}"


def branch_seq_of(call: str, branch: int) -> str:
    """The sequence of branch ``branch`` of fan-out op ``call`` (``call_id``)."""
    seq, _, index = call.rpartition(":")
    return branch_seq(seq, int(index), branch)


def branch_owner(call: str, branch: int) -> str:
    return f"{call}/{branch}"


def branch_of(owner: str) -> tuple[str, int]:
    """The fan-out call id and branch index of a branch owner (``branch_owner``'s inverse)."""
    call, _, branch = owner.rpartition("/")
    return call, int(branch)


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


def _op(letter: str) -> Callable[[str], str]:
    """The identities of one kind of op: its letter, then what names it (``describe`` reads them back)."""
    return lambda name: f"{letter}|{name}"


class Identity:
    """Op identities as the journal keeps them (``o:`` fields)."""

    step = staticmethod(_op("s"))

    @staticmethod
    def fanout(kind: str, width: int) -> str:
        return f"{kind}|{width}"

    NOW = "t|"
    UUID = "u|"
    SLEEP = "z|"
    agent = staticmethod(_op("a"))
    signal = staticmethod(_op("g"))
    call = staticmethod(_op("c"))
    child = staticmethod(_op("k"))
    """``ctx.child``: a child run waited for (schema.children)."""
    start_child = staticmethod(_op("d"))
    """``ctx.start_child``: a child run started, not waited for."""
    patch = staticmethod(_op("v"))
    """A patch marker (``ctx.patched``): journaled where new code took the new branch."""


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
        "k": f"child {rest}",
        "d": f"start_child {rest}",
        "v": f"patched({rest!r})",
    }.get(kind, identity)


@dataclass(frozen=True, slots=True)
class SequenceHistory:
    """One sequence as journaled: entries are (epoch, identity, value)."""

    cut: tuple[int, int] | None
    high_water: int
    entries: list[tuple[int, str, str | None]]
    start: int = 0
    """The index of the first entry: a read of the tail leaves out the rest."""
    compensated: tuple[int, int] | None = None
    """(epoch, index) of the last compensation of a saga journaled in the
    sequence (field ``u:<seq>``; none in a journal older than it)."""

    def live_entries(self) -> list[tuple[str, str | None]]:
        """The history replay must follow: entries up to the first dead one."""
        live: list[tuple[str, str | None]] = []
        for index, (epoch, identity, value) in enumerate(self.entries, start=self.start):
            if self.cut is not None and index > self.cut[1] and epoch < self.cut[0]:
                break
            live.append((identity, value))
        return live

    def last_compensation(self) -> int:
        """The index of the last compensation journaled in the live history,
        or -1: a dead one (past the cut, from an older epoch) is no history."""
        if self.compensated is None:
            return -1
        epoch, index = self.compensated
        if self.cut is not None and index > self.cut[1] and epoch < self.cut[0]:
            return -1
        return index


def parse_sequence(run_id: str, seq: str, reply: Sequence[Any], start: int = 0) -> SequenceHistory:
    """A reply of ``sequence_reply`` (``_prelude.lua``; read_sequence, read_sequences and
    activate scripts): cut, high-water mark, last compensation, then entry/value pairs."""
    try:
        cut: tuple[int, int] | None = None
        if reply[0]:
            cut_epoch, cut_index = str(reply[0]).split(":", 1)
            cut = (int(cut_epoch), int(cut_index))
        compensated: tuple[int, int] | None = None
        if reply[2]:
            compensated_epoch, compensated_index = str(reply[2]).split(":", 1)
            compensated = (int(compensated_epoch), int(compensated_index))
        entries: list[tuple[int, str, str | None]] = []
        for i in range(3, len(reply), 2):
            epoch, identity = str(reply[i]).split(":", 1)
            value = reply[i + 1]
            entries.append((int(epoch), identity, str(value) if value else None))
        high_water = int(reply[1]) if reply[1] else -1
        return SequenceHistory(cut=cut, high_water=high_water, entries=entries, start=start, compensated=compensated)
    except (ValueError, IndexError, TypeError) as exc:
        raise StorageCorruptError(f"Journal of run {run_id} is corrupt in sequence {seq}: {exc!r}") from None
