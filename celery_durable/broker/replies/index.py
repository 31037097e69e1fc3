"""The replies of the scripts that keep a namespace's indexes (``run_index.py``)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from celery_durable.broker.replies.shape import count, script


class Synced(StrEnum):
    APPLIED = "applied"
    SAME = "same"
    OLDER = "older"
    """The indexes hold a newer version of the run than the one read."""
    UNLISTED = "unlisted"
    """Not in its namespace's runs yet (index_run.lua lists it)."""
    GONE = "gone"
    """The record is gone: the run left every index."""


@script("index_sync")
def index_sync(reply: Any) -> list[Synced]:
    """index_sync.lua: per run, 'applied', 'same', 'older', 'unlisted' or 'gone'."""
    if not isinstance(reply, list):
        raise TypeError(f"{type(reply).__name__}, not a list")
    return [Synced(verdict) for verdict in reply]


@script("index_intent")
def index_intent(reply: Any) -> list[int]:
    """index_intent.lua: per run, how many of its writes are under way, this one included."""
    if not isinstance(reply, list):
        raise TypeError(f"{type(reply).__name__}, not a list")
    return [int(item) for item in reply]


@script("index_forget")
def index_forget(reply: Any) -> int:
    """index_forget.lua: how many of the runs were in the namespace's runs zset."""
    return count(reply)
