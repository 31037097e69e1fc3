"""The base of each module's ops (steps, calls, waits, ...), apart from
``replay.py``, which makes them and imports them only when first asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery_durable.workflows.replay import Replay


class Ops:
    """Ops act for one execution, through its ``Replay``."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay
