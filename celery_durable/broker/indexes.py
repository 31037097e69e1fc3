"""The member format of a namespace's index (``P:{ns:N}:ix``, keys.py), in
Python: the one place that knows it, besides ``index_members`` in
``_prelude.lua`` that writes it.

Every member is scored 0, so the zset orders them as text. A filter is a
*prefix* (``"s|error|"``: the runs in error) and its runs are the members
that start with it, each ending in ``"<ord>|<run id>"``; ``ord`` is the
run's place in start order, ``"<created ms, 13 digits><start counter, 15
digits>"``: a fixed-width number, so text order is start order and a time
range is a range of text. Names (statuses, workflows, signal names) are of
``[A-Za-z0-9._-]`` (names.py), all below ``|`` and above ``:``, so one name's
prefix never reaches into another's, and ``":"`` bounds a prefix's digits.
"""

from __future__ import annotations

from dataclasses import dataclass

ORD_DIGITS = 28
"""13 digits of created ms, 15 of the start counter."""
CREATED_DIGITS = 13
MAX_CREATED_MS = 10**CREATED_DIGITS - 1


def all_runs() -> str:
    return "t|"


def by_status(status: str) -> str:
    return f"s|{status}|"


def by_workflow(workflow: str) -> str:
    return f"w|{workflow}|"


def by_status_and_workflow(status: str, workflow: str) -> str:
    return f"sw|{status}|{workflow}|"


def waiting_any() -> str:
    return "a|"


def waiting_for(name: str) -> str:
    return f"n|{name}|"


ID_PREFIX = "i|"
"""Members "i|<run id>": every run, in the order of its id."""


@dataclass(frozen=True, slots=True)
class OrdRange:
    """Runs with ``low <= ord < high`` (text of ORD_DIGITS or less digits; None: unbounded)."""

    low: str | None = None
    high: str | None = None

    def bounds(self, prefix: str) -> tuple[str, str]:
        """(max, min) for ZREVRANGEBYLEX over ``prefix``'s members."""
        top = f"({prefix}{self.high}" if self.high is not None else f"({prefix}:"
        bottom = f"[{prefix}{self.low}" if self.low is not None else f"[{prefix}"
        return top, bottom


def created_ord(created_ms: int) -> str:
    """The ord below which every run created before ``created_ms`` lies."""
    return f"{min(max(created_ms, 0), MAX_CREATED_MS):0{CREATED_DIGITS}d}"


def is_ord(text: str) -> bool:
    return len(text) == ORD_DIGITS and text.isdigit()


def parse_member(prefix: str, member: str) -> tuple[str, str]:
    """(ord, run id) of a member that starts with ``prefix``."""
    ord_, _, run_id = member[len(prefix) :].partition("|")
    return ord_, run_id


def id_bounds(prefix: str, after: str | None) -> tuple[str, str]:
    """(min, max) for ZRANGEBYLEX over the runs whose id starts with
    ``prefix``, after run id ``after`` (ids are lowercase hex, below "~")."""
    low = f"({ID_PREFIX}{after}" if after is not None else f"[{ID_PREFIX}{prefix}"
    return low, f"({ID_PREFIX}{prefix}~"
