"""The reply of ``read_history.lua``."""

from __future__ import annotations

from typing import Any

from celery_durable.broker.replies.shape import script

Flat = dict[str, str]


def _pairs(flat: Any) -> Flat:
    return dict(zip(flat[::2], flat[1::2], strict=True))


@script("read_history")
def read_history(reply: Any, run_id: str) -> tuple[Flat, Flat, Flat, Flat, Flat, Flat, Flat, list[str]] | None:
    """What read_history.lua returns: seven hashes as field maps, and the system records flat (seq, attempt,
    at, message, ...); None for a run that does not exist."""
    if not reply:
        return None
    if len(reply) != 8 or len(reply[7]) % 4:
        raise ValueError(f"{len(reply)} parts")
    run, journal, steps, running, agents, signals, children = (_pairs(part) for part in reply[:7])
    return run, journal, steps, running, agents, signals, children, [str(item) for item in reply[7]]
