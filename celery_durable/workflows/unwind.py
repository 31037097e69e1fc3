"""How replay leaves a workflow function early: ``BaseException``s user code cannot swallow.

Each ends the current execution (or one branch of it) at a point where the
journal says everything it must; the next execution replays from the top.
They derive from ``BaseException`` so that a workflow's ``except Exception``
cannot catch them and carry on past a point the engine has left.
"""

from __future__ import annotations


class Suspend(BaseException):
    """Ends a coordinator pass that must wait (for branches, an agent turn, a
    timer, a signal or a task): no worker slot is held while it waits, and
    the next pass replays."""


class BranchFinished(BaseException):
    """Ends a branch task's replay once its own thunks have outcomes."""


class BranchSuspended(BaseException):
    """Ends one branch that waits (for an agent turn, a timer, a signal or a
    task); it has no outcome yet, and what it waits for sends the branch task
    again when it is done."""


class BranchRerun(BaseException):
    """Ends one run of a branch whose held-back step lost its first write to
    another execution: the branch runs again, and the step replays the
    journaled value its later code must see."""


class PauseRequested(BaseException):
    """Ends the main body at its first new call after a pause was requested."""


def unwound(exc: BaseException) -> None:
    """Drop the traceback of an unwinding exception that reached its handler.

    The engine keeps these exceptions (``Replay.unwinding``, a cursor's
    ``suspended``) to raise them again at any later op, and a traceback holds
    the frames it unwound, whose locals hold the replay or the cursor that
    holds the exception: a reference cycle, which only the cyclic GC frees.
    In a fan-out of 4,096 task calls that was a hundred-odd objects a branch
    (frames, locks, conditions) and full collections of 0.2 s each.
    """
    exc.__traceback__ = None
