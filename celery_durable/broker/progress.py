"""Progress records as Redis keeps them, and pages of them (SPEC §7).

A run's records live in one stream, entry id ``<seq>-0``, seq dense from 1;
records of a phase are also in the run's phase index (``append_progress`` in
``_prelude.lua`` writes both in one script). ``read_progress.lua`` reads a
page with the bounds it is relative to in one atomic snapshot
(``replies.read_progress`` parses it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PageMode = Literal["after", "before", "newest"]

MAX_SEQ = 10**15 - 1
"""The highest seq the phase index can order (its members hold 15 digits);
cursors beyond it are clamped, which changes no page: no run gets there."""


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    seq: int
    kind: str
    phase_id: str | None
    message: str
    attempt: int
    at: int


@dataclass(frozen=True, slots=True)
class ProgressSlice:
    """One page of records in ascending seq, with what it is relative to:
    the oldest and newest seq in scope (the run, or one phase) and the run's
    revision, all read in the same snapshot as the records."""

    records: list[ProgressRecord]
    oldest: int | None
    newest: int | None
    revision: int

