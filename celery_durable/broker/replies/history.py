"""The reply of ``read_history.lua``."""

from __future__ import annotations

from typing import Any

from celery_durable.broker.replies.shape import script
from celery_durable.broker.schema.archive import ARCHIVED, Archived
from celery_durable.broker.schema.history import StoredEvent, parse_event


@script("read_history")
def read_history(reply: Any, run_id: str) -> tuple[int, list[StoredEvent]] | Archived | None:
    """What read_history.lua returns: the run's event count and the entries
    read, decoded; None for a run that does not exist; ``Archived`` (its
    event count) for a run whose history is in its archive."""
    if not reply:
        return None
    if len(reply) == 2 and reply[1] == ARCHIVED:
        return Archived(str(int(reply[0])))
    if len(reply) != 2 or not isinstance(reply[1], list):
        raise ValueError(f"{len(reply)} parts")
    return int(reply[0]), [parse_event(str(entry[0]), [str(f) for f in entry[1]]) for entry in reply[1]]
