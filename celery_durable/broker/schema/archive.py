"""The archive of a run settled for good (``P:{R}:archive``, issue 42).

A run that ends ``completed`` or ``cancelled`` can never be resumed (SPEC
§8): nothing will write its journal, steps, progress or history again, and
they are read whole or a page at a time by people. So, once it settled, its
``history`` stream, ``steps`` hash, ``progress`` stream and ``journal`` hash
are folded into one string key (``archive_run.lua``) and their keys
deleted; its phase index (``progress:phases``) goes too, since every
progress record names its phase. The ``run`` hash stays as it is.

The string is zlib of one JSON document (stdlib only; Lua has no zlib, so
Python builds it and the script only checks and stores it)::

    {"v": 1,
     "history":  [["<n>-0", [field, value, ...]], ...],    XRANGE order
     "progress": [["<seq>-0", [field, value, ...]], ...],  XRANGE order
     "steps":    {key: row JSON, ...},
     "journal":  {field: value, ...}}

``parse_archive`` gives back exactly what reading the keys gave (hash
dicts, stream entries as the scripts return them), and ``history_reply`` /
``progress_reply`` the very replies ``read_history.lua`` and
``read_progress.lua`` give for the live keys, so the same reply parsers
decode both forms. A run settled before archives existed simply has no
archive and is read as it always was.

``shape`` is what ``archive_run.lua`` checks the keys against before it
deletes them: each stream's length and last id, each hash's and the phase
index's length, as the caller read them. A run settled for good is never
written again (the fence refuses every fenced script; every other script
that writes these keys refuses a completed or cancelled run itself,
``tests/unit/test_ops_table.py``), so that is a check against a write the
rules missed, not the rule: it catches any record, event, step or journal
field added since the read, at the cost of seven reads. (A SHA-1 of every
field of them cost 0.66 ms of Redis per run, a fifth of all a typical run
costs it: issue 42.)
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ARCHIVABLE",
    "ARCHIVED",
    "ARCHIVE_VERSION",
    "Archive",
    "Archived",
    "StreamEntry",
    "build_archive",
    "history_reply",
    "parse_archive",
    "progress_reply",
    "sequence_reply",
    "shape",
]

ARCHIVE_VERSION = 1
ARCHIVABLE = frozenset({"completed", "cancelled"})
"""The statuses a run is archived in: the two it can never leave (SPEC §8)."""
ARCHIVED = "archived"
"""What ``read_history.lua`` and ``read_progress.lua`` answer for a run whose
keys are archived: the caller reads the archive instead."""

StreamEntry = tuple[str, list[str]]
"""A stream entry as a script returns it: its id and its flat field/value list."""


@dataclass(frozen=True, slots=True)
class Archived:
    """A read script's answer for an archived run: the run hash's counter it
    would have answered with (``events`` for the history, ``next_seq`` for
    the progress); the caller reads the archive for the rest."""

    counter: str


@dataclass(frozen=True, slots=True)
class Archive:
    history: list[StreamEntry]
    steps: dict[str, str]
    progress: list[StreamEntry]
    journal: dict[str, str]


def _entries(raw: Iterable[Any]) -> list[StreamEntry]:
    """Stream entries as redis-py's XRANGE gives them (id, {field: value}) or as
    a script does (id, [field, value, ...]), in the script's shape."""
    out: list[StreamEntry] = []
    for entry_id, fields in raw:
        flat = [item for pair in fields.items() for item in pair] if isinstance(fields, Mapping) else list(fields)
        out.append((str(entry_id), [str(item) for item in flat]))
    return out


def build_archive(
    history: Iterable[Any], steps: Mapping[str, str], progress: Iterable[Any], journal: Mapping[str, str]
) -> bytes:
    """The archive of the four keys as read (XRANGE - + of each stream,
    HGETALL of each hash)."""
    document = {
        "v": ARCHIVE_VERSION,
        "history": _entries(history),
        "progress": _entries(progress),
        "steps": dict(steps),
        "journal": dict(journal),
    }
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    # Level 6, not 9: on a typical run's 13 KB of JSON both give the same
    # 1,021 bytes, and 9 takes twice the settling worker's time (112 us
    # against 55). Any level reads back the same (zlib.decompress).
    return zlib.compress(text.encode("utf-8"), 6)


def parse_archive(blob: bytes) -> Archive:
    """The four keys back from an archive; a ``ValueError`` for one this
    version did not write (the caller turns it into ``StorageCorruptError``)."""
    try:
        document = json.loads(zlib.decompress(blob).decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not an archive: {exc}") from None
    if not isinstance(document, dict) or document.get("v") != ARCHIVE_VERSION:
        raise ValueError("an archive of another version")
    try:
        return Archive(
            history=_entries(document["history"]),
            steps={str(k): str(v) for k, v in document["steps"].items()},
            progress=_entries(document["progress"]),
            journal={str(k): str(v) for k, v in document["journal"].items()},
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"an archive of another shape: {exc!r}") from None


def shape(
    history: Iterable[Any],
    steps: Mapping[str, str],
    progress: Iterable[Any],
    journal: Mapping[str, str],
    phases: Sequence[str],
) -> list[str]:
    """What ``archive_run.lua`` compares the keys with before it deletes
    them: each stream's length and last id, each hash's and the phase
    index's length."""
    history_entries, progress_entries = _entries(history), _entries(progress)
    return [
        str(len(history_entries)),
        history_entries[-1][0] if history_entries else "",
        str(len(steps)),
        str(len(progress_entries)),
        progress_entries[-1][0] if progress_entries else "",
        str(len(journal)),
        str(len(phases)),
    ]


def _value_field(seq: str, index: int, entry: str) -> str | None:
    """``value_field`` of ``_prelude.lua``: where op ``index`` of ``seq`` keeps its value."""
    identity = entry.split(":", 1)[1] if ":" in entry else ""
    kind = identity[:1]
    if kind in ("s", "c", "k"):
        return "v:" + identity[2:]
    if kind == "a":
        return "a:" + identity[2:]
    if kind in ("t", "u", "z", "g", "d"):
        return f"x:{seq}:{index}"
    return None


def sequence_reply(journal: Mapping[str, str], seq: str, start: int = 0) -> list[Any]:
    """What ``sequence_reply`` of ``_prelude.lua`` (read_sequence.lua,
    read_sequences.lua) answers for sequence ``seq`` of the journal hash
    ``journal``, from ``start``: {cut or '', high-water or '', last
    compensation or '', entry, value or None, ...}. A replay check reads an archived run's journal this way."""
    count = int(journal.get(f"n:{seq}") or "0")
    any_stepped = "stepped" in journal
    out: list[Any] = [journal.get(f"k:{seq}", ""), journal.get(f"h:{seq}", ""), journal.get(f"u:{seq}", "")]
    for index in range(start, count):
        entry = journal.get(f"o:{seq}:{index}", "0:")
        field = _value_field(seq, index, entry)
        value = None
        if field is not None and not (any_stepped and journal.get("so:" + field) == entry):
            value = journal.get(field)
        out += [entry, value]
    return out


def _phase_of(entry: StreamEntry) -> str:
    flat = entry[1]
    return dict(zip(flat[::2], flat[1::2], strict=True)).get("phase_id", "")


def _seq(entry: StreamEntry) -> int:
    return int(entry[0].split("-", 1)[0])


def history_reply(archive: Archive, total: str, mode: str, after: int, count: int) -> list[Any]:
    """What ``read_history.lua`` answers for the live stream: {total, entries},
    ``mode`` 'after' (seq > ``after``, oldest first) or 'tail' (newest first)."""
    if mode == "tail":
        entries = archive.history[::-1][:count]
    else:
        entries = [entry for entry in archive.history if _seq(entry) > after][:count]
    return [total, [list(entry) for entry in entries]]


def progress_reply(archive: Archive, revision: str, phase: str, mode: str, cursor: int, count: int) -> list[Any]:
    """What ``read_progress.lua`` answers for the live stream and phase index:
    {revision, oldest or '', newest or '', entry, ...} in ascending seq."""
    scope = [entry for entry in archive.progress if _phase_of(entry) == phase] if phase else archive.progress
    out: list[Any] = [revision, "", ""]
    if not scope:
        return out
    out[1], out[2] = str(_seq(scope[0])), str(_seq(scope[-1]))
    if mode == "after":
        rows = [entry for entry in scope if _seq(entry) > cursor][:count]
    elif mode == "before":
        if not phase and cursor <= 1:
            return out
        earlier = [entry for entry in scope if _seq(entry) < cursor]
        rows = earlier[-count:] if count > 0 else []
    else:
        rows = scope[-count:] if count > 0 else []
    out.extend(list(entry) for entry in rows)
    return out
