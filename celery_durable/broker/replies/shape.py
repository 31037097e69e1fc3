"""What every script reply shares: the verdict it opens with, the fence's
refusals, the run's flags, and what a reply of a shape its script never
sends becomes (``StorageCorruptError``, naming the script)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Concatenate, NoReturn, ParamSpec, TypeVar

from celery_durable.broker.journal import Flags
from celery_durable.errors import StaleAttemptError, StorageCorruptError

P = ParamSpec("P")
R = TypeVar("R")


class Refusal(StrEnum):
    """Why a script turned its caller away. ``fence()`` in ``_prelude.lua``
    answers 'missing', 'stale' or 'settled'; scripts that check more say
    'stale' too (agent_start, call_done, sending, complete_branch,
    complete_begin: the thing written belongs to another attempt), and
    branch_start.lua adds 'forged' (another workflow's message, or one naming
    branches its fan-out has not) and 'unknown' (a message the run does not
    count in flight: never sent, or delivered again after it ended)."""

    MISSING = "missing"
    STALE = "stale"
    FORGED = "forged"
    SETTLED = "settled"
    UNKNOWN = "unknown"

    def raise_for(self, run_id: str) -> NoReturn:
        """What the caller of a fenced write sees: a run record gone is
        corruption, anything else is this attempt losing the run."""
        if self is Refusal.MISSING:
            raise StorageCorruptError(f"Run record {run_id} is missing")
        raise StaleAttemptError(f"Run {run_id}: this attempt no longer owns the run ({self})")


FENCED = frozenset({Refusal.MISSING, Refusal.STALE, Refusal.SETTLED})


def script(name: str) -> Callable[[Callable[Concatenate[Any, P], R]], Callable[Concatenate[Any, P], R]]:
    """Marks the parse function of script ``name``, whose first argument is
    the reply, and the next the run's id for a script about one run: an item
    missing or of the wrong type (IndexError, TypeError, ValueError,
    KeyError) is a reply the script never sends, said as such."""

    def parses(parse: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
        @functools.wraps(parse)
        def parsed(reply: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return parse(reply, *args, **kwargs)
            except (IndexError, TypeError, ValueError, KeyError) as exc:
                run = f"Run {args[0]}: " if args and isinstance(args[0], str) else ""
                raise StorageCorruptError(
                    f"{run}{name}.lua replied in a shape it never sends ({exc}): {reply!r:.80}"
                ) from None

        return parsed

    return parses


def ok_only(name: str) -> Callable[[Any, str], None]:
    """The parse function of fenced script ``name``, whose one answer is
    {'ok'}: the scripts that only mark something have nothing else to say."""

    def parse(reply: Any, run_id: str) -> None:
        verdict(reply, run_id, "ok")

    parse.__doc__ = f"{name}.lua: {{'ok'}}."
    return script(name)(parse)


def verdict(reply: Any, run_id: str | None, *expected: str) -> str:
    """The verdict ``reply`` opens with, one of ``expected``. With ``run_id``
    (a fenced script) a refusal is raised first, as ``Refusal.raise_for``."""
    said = reply[0]
    if run_id is not None and said in FENCED:
        Refusal(said).raise_for(run_id)
    if said not in expected:
        raise ValueError(f"verdict {said!r}")
    return str(said)


def flags(reply: Any) -> Flags:
    """The (cancel, pause, limit) triple every fenced write returns after its
    verdict ('0'/'1', '0'/'1', '' or the ceiling reached: ``flags()`` in
    ``_prelude.lua``)."""
    return Flags(cancel=reply[1] == "1", pause=reply[2] == "1", limit=str(reply[3] or ""))


def wake_flag(flag: Any) -> bool:
    """A script's wake 0/1: 1 when the caller must send the message it named."""
    if flag not in (0, 1):
        raise ValueError(f"wake {flag!r}")
    return bool(flag == 1)


def throttled_flag(flag: Any) -> bool:
    """A settle's or an answer's '1'/'0': whether an op of the run ever asked
    a throttle for a slot (the run hash's ``throttled``), so that the caller
    looks for one to give back."""
    if flag not in ("0", "1"):
        raise ValueError(f"throttled {flag!r}")
    return bool(flag == "1")


def count(reply: Any) -> int:
    """A bare integer reply (a count, or 1/0 for yes/no)."""
    if not isinstance(reply, int):
        raise TypeError(f"{type(reply).__name__}, not an integer")
    return reply
