"""Where a wake runs: the one decision, as a pure function of what is known.

When a call's answer or an agent turn settles, what waited for it — the
main body (``m``) or a top-level branch — is woken, and the wake runs
somewhere. Several mechanisms bear on where, each for a cost it saves
(``benchmarks/NOTES.md``):

- **In place**: a worker that consumes the wake's queue runs it in the
  thread that decided it, under the id its message would have had, instead
  of sending a message only to receive it back. Not in a thread that runs a
  user's task whose ``acks_late`` or time limit a pass run inside it would
  hold up or count against (``tasks/in_place.py``).
- **Kept bodies**: a main body parked at the call in this process goes on
  from it (``tasks/parked.py``); the answer's own script can take that
  pass's lock (``call_done.lua``), one round trip fewer a call.
- **Letting go**: an answer that comes while this process's pass of the run
  still holds the lock (the task ran the moment it was sent) waits for that
  pass to release it, rather than set the lock's wake flag and have the
  pass run once more (``ParkedRuns.wait_let_go``).
- **Home queues**: an answer names the home queue of the process that keeps
  the body (``tasks/home.py``); a main body's wake that does not run here
  goes there, falling back to the coordinator queue after a while.

Nothing here reads a clock, a lock or the broker: ``route`` maps the facts
(``WakeFacts``) to a ``Verdict``, and the task code gathers the one and
carries out the other (``tasks/in_place.py``, ``tasks/calls.py``). The
script keeps one condition of its own: ``call_done.lua`` takes the pass
only when the answer woke the main body alone (else the wake is routed as
any other). A lock it finds held by a pass in another process gets that
lock's wake flag, and the pass is sent again for when the lock expires
(``coordinator.py``), as any activation that finds it busy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Owner(enum.Enum):
    """What a wake continues."""

    MAIN = "main body"
    BRANCH = "top-level branch"


class Home(enum.Enum):
    """The home queue an answer names (``tasks/home.py``)."""

    NONE = "none"
    """No home: an agent turn, or a sender without one (a prefork pool,
    ``home_queues`` off, a version before them). A home is the main body's
    alone: a branch's wake ignores it."""
    HERE = "this process's"
    ELSEWHERE = "another process's"


class Where(enum.Enum):
    TAKE = "the answer's script takes the pass's lock; the pass runs here"
    HERE = "run here, in this thread"
    HOME = "send to the home queue, sent again to the coordinator queue if not started in time"
    QUEUE = "send to the owner's own queue (coordinator, or steps for a branch)"


@dataclass(frozen=True, slots=True)
class Verdict:
    where: Where
    wait_let_go: bool = False
    """First wait (bounded) for the pass of the run that this process runs
    to let go of the lock. With ``TAKE``, the script takes the lock softly:
    a lock that pass still holds is left alone, and the wake, routed again
    (``WakeFacts.takeable`` false), waits for it and runs here."""


@dataclass(frozen=True, slots=True)
class WakeFacts:
    """What the decision depends on, gathered by the task code."""

    owner: Owner
    home: Home = Home.NONE
    consumes: bool = False
    """This thread runs a task of a worker that consumes the owner's queue
    (the coordinator queue for the main body, the steps queue for a branch)."""
    knows_workflow: bool = False
    """The run's workflow is registered with this worker's engine."""
    user_task_binds: bool = False
    """This thread runs a user's task whose options a pass run inside it
    would break: ``acks_late`` (its message unacknowledged past the
    visibility timeout for as long as the pass runs) or a time limit (the
    pass counted against it, a soft limit raised inside workflow code)."""
    shutting_down: bool = False
    """This worker was asked to stop: what it starts now holds up its warm
    shutdown, and its home queue is no longer consumed."""
    kept: bool = False
    """This process keeps the main body parked at a call, for this attempt."""
    pass_here: bool = False
    """A pass of the run holds its lock in this process (the one that sent
    the call, about to park the body and release)."""
    takeable: bool = False
    """Decided before the answer's script (``call_done``), which can take the
    main body's pass for this thread; false after it, and for wakes whose
    script cannot (an agent turn)."""
    slot_taken: bool = False
    """Another owner woken by the same answer already runs in this thread."""


def route(facts: WakeFacts) -> Verdict:
    """Where the wake of ``facts.owner`` runs, and whether it first waits.

    Rules, in order:

    1. A wake of the main body waits for this process's pass of the run to
       let go first, wherever it then runs: the pass is about to release, and
       a wake that found its lock busy would cost that pass one more run and
       a message back later.
    2. A worker shutting down starts nothing: the wake goes to its queue, or
       to another process's home.
    3. A branch runs here when this thread may run it, else in its queue.
    4. A main body kept in another process goes there (its home).
    5. A main body that may run here does, taking the pass in the answer's
       script when the body is kept here and the script is still to run.
    6. Otherwise it goes to this process's home when it has one (where its
       body is kept), else to the coordinator queue.
    """
    wait = facts.owner is Owner.MAIN and facts.pass_here
    if facts.shutting_down:
        elsewhere = facts.owner is Owner.MAIN and facts.home is Home.ELSEWHERE
        return Verdict(Where.HOME if elsewhere else Where.QUEUE, wait)
    may_run = facts.consumes and facts.knows_workflow and not facts.user_task_binds and not facts.slot_taken
    if facts.owner is Owner.BRANCH:
        return Verdict(Where.HERE if may_run else Where.QUEUE)
    if facts.home is Home.ELSEWHERE:
        return Verdict(Where.HOME, wait)
    if may_run:
        return Verdict(Where.TAKE if facts.takeable and facts.kept else Where.HERE, wait)
    return Verdict(Where.HOME if facts.home is Home.HERE else Where.QUEUE, wait)


def answer_here(link_of_running_task: bool, consumes_coordinator: bool) -> bool:
    """Whether a call's answer is journaled where its task ran, instead of
    its link being published (``CallAnswerTask``): when the link is the one
    Celery dispatches for the task this thread just ran, and this worker
    consumes the coordinator queue the link's message would come back on. A
    worker shutting down answers too: the task's acknowledgement waits for
    it anyway, and the message would only wait for another worker."""
    return link_of_running_task and consumes_coordinator
