"""Progress records as Redis keeps them, and pages of them (SPEC §7).

A run's records live in one stream, entry id ``<seq>-0``, seq dense from 1;
records of a phase are also in the run's phase index (``append_progress`` in
``_prelude.lua`` writes both in one script). ``read_progress.lua`` reads a
page with the bounds it is relative to in one atomic snapshot; this module
turns its reply into Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from celery_durable.errors import StorageCorruptError

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


def parse_record(entry_id: str, fields: dict[str, str] | Sequence[str]) -> ProgressRecord:
    """A stream entry as a record; a field list (as Lua returns it) or a dict."""
    try:
        if not isinstance(fields, dict):
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        return ProgressRecord(
            seq=int(entry_id.split("-", 1)[0]),
            kind=fields["kind"],
            phase_id=fields.get("phase_id") or None,
            message=fields["message"],
            attempt=int(fields["attempt"]),
            at=int(fields["at"]),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise StorageCorruptError(f"Progress record {entry_id} is corrupt: {exc!r}") from None


def parse_slice(run_id: str, reply: Sequence[Any]) -> ProgressSlice:
    """The reply of ``read_progress.lua``."""
    try:
        revision = int(reply[0])
        oldest = int(reply[1]) if reply[1] not in ("", None) else None
        newest = int(reply[2]) if reply[2] not in ("", None) else None
        entries = list(reply[3:])
    except (IndexError, ValueError, TypeError) as exc:
        raise StorageCorruptError(f"Progress of run {run_id} is corrupt: {exc!r}") from None
    records = [parse_record(str(entry[0]), entry[1]) for entry in entries]
    return ProgressSlice(records=records, oldest=oldest, newest=newest, revision=revision)
