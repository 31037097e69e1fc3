"""A branch's completion: its outcome, with its last step, on its way to the journal.

A branch is done once its outcome is journaled. That write may wake the
coordinator (the last outcome out of a fan-out does), and in a branch task
the task's last one ends the task's message in the same script. Branches
that one thread runs one after another (a branch task's, or the narrow
fan-out a pass runs itself) hold their steps' writes back, as the main body
does, so a branch ends with its last step not yet written; ``Completions``
owns what happens to it and to the outcome from there, in one of three ways:

- *carried*: held back while another branch follows in the same thread, and
  journaled by that branch's first begin (``Journal.complete_begin``), so a
  quick branch costs one script;
- *alone with the step* (``complete_held``): no branch follows, the outcome
  is fatal (it wakes the coordinator at once), or the next branch ended
  without a write to carry it (``flush``);
- *alone* (``complete_branch``): the branch held no step (its last op was
  not a new step, or progress records followed it), or it is a branch of a
  nested fan-out, or the branch task's replay failed before its fan-out.

A held step that another execution journaled first (``Winner``), or whose
place holds another op (``Conflict``), had nothing of its branch written:
the branch runs again, and replays the journaled value, or meets the other
op and ends as nondeterministic. Holding a completion is as safe as holding
a step: an execution that dies with one held lost only that branch's
writes, and the branch runs again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_durable.broker.journal import Began, BeginCall, Conflict, HeldBranch, Journal, PendingCommit, Winner
from celery_durable.broker.schema import Outcome

Thunk = Callable[[], Any]


@dataclass(frozen=True, slots=True)
class CompletionRoute:
    """Whom a completion wakes, and which message it ends. The defaults are
    an execution that collects the outcomes itself (a pass's inline
    branches, a nested fan-out): nothing to wake, no message to end."""

    new_wake: Callable[[], str] = lambda: ""
    """A task id for the coordinator message an outcome may have to send
    (counted in flight by the script that journals it); '' for none."""
    send_wake: Callable[[str], None] = lambda _task_id: None
    """Sends it, once the script said the outcome wakes the coordinator."""
    ending: Callable[[], str] = lambda: ""
    """The task id of the branch task's message while the completion being
    journaled is its last: the script ends that message too, unless it wakes
    the coordinator (then the task ends it after the wake is sent)."""
    ended: Callable[[], None] = lambda: None
    """Told when a completion ended that message."""


COLLECTED = CompletionRoute()


class Completions:
    """The completions of the branches of fan-out ``call`` that one thread
    runs, one after another (or, for a nested fan-out, only ``alone``)."""

    def __init__(self, journal: Journal, call: str, route: CompletionRoute) -> None:
        self._journal = journal
        self._call = call
        self._route = route
        self._held: tuple[HeldBranch, Thunk] | None = None
        """The completion carried by the next begin, and its branch's thunk."""
        self._lost: list[tuple[int, Thunk]] = []
        """Branches whose held step was not written: they run again."""

    def finish(
        self, index: int, outcome: Outcome, seq: str, step: PendingCommit | None, fn: Thunk, *, carry: bool
    ) -> bool:
        """Branch ``index`` ended with ``outcome`` (its last step ``step``, held
        back, in sequence ``seq``): hold its completion for the next branch's
        first begin (``carry``: one follows) or journal it now. False: its
        step was not written, and the branch must run again."""
        if step is None:
            self.alone(index, outcome)
            return True
        if carry and outcome.kind != "f":
            self.flush()
            self._held = (HeldBranch(self._call, index, outcome.encode(), seq, step, self._route.new_wake()), fn)
            return True
        return self._with_step(index, outcome.encode(), seq, step)

    def alone(self, index: int, outcome: Outcome) -> None:
        """Journal an outcome that has no step with it."""
        wake, ending = self._route.new_wake(), self._route.ending()
        woke = self._journal.complete_branch(self._call, index, outcome.encode(), wake, ending)
        self._woke(woke, wake, ending)

    def begin(self, seq: str, call: BeginCall) -> Began:
        """``Journal.begin`` of ``call`` in ``seq``, carrying the completion held back."""
        if self._held is None:
            return self._journal.begin(seq, call)
        held, fn = self._held
        self._held = None
        result = self._journal.complete_begin(seq, held, call)
        if isinstance(result, Winner | Conflict):
            self._lost.append((held.branch, fn))
            return self._journal.begin(seq, call)
        if result.woke:
            self._route.send_wake(held.wake)
        return result

    def flush(self) -> None:
        """Journal the completion held back on its own: no branch carried it."""
        if self._held is None:
            return
        held, fn = self._held
        self._held = None
        if not self._with_step(held.branch, held.outcome, held.seq, held.step):
            self._lost.append((held.branch, fn))

    def take_lost(self) -> list[tuple[int, Thunk]]:
        """The branches to run again, their completion not written."""
        lost, self._lost = self._lost, []
        return lost

    def _with_step(self, index: int, outcome: str, seq: str, step: PendingCommit) -> bool:
        wake, ending = self._route.new_wake(), self._route.ending()
        found = self._journal.complete_held(self._call, index, outcome, wake, ending, seq, step)
        if isinstance(found, Winner | Conflict):
            return False  # nothing of the branch was written, and a message it would end still runs
        self._woke(found, wake, ending)
        return True

    def _woke(self, woke: bool, wake: str, ending: str) -> None:
        if woke:
            # The message ``ending`` names still runs: the script does not end
            # it when it wakes the coordinator; the task ends it after the wake.
            self._route.send_wake(wake)
        elif ending:
            self._route.ended()
