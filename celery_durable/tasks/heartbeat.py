"""A background thread that keeps an attempt's lease alive while it works.

It is also how a long step learns of a cancellation: every beat returns the
run's control flags, and a set cancel flag sets the attempt's cancel event.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Protocol

from celery_durable.broker import Flags, RunRecord, RunStore
from celery_durable.errors import StaleAttemptError, StorageCorruptError, StorageUnavailableError

logger = logging.getLogger(__name__)


class Attempt(Protocol):
    """What a heartbeat needs of the attempt it keeps alive (a Replay, an agent turn)."""

    run: RunRecord
    epoch: int
    cancel_event: threading.Event
    lost_authority: bool

    def apply_flags(self, flags: Flags) -> None: ...


class Heartbeat:
    """``with Heartbeat(...):`` beats every ``interval`` seconds until the block ends."""

    def __init__(self, store: RunStore, replay: Attempt, *, token: str = "", interval: float) -> None:
        self._store = store
        self._replay = replay
        self._token = token
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"heartbeat-{replay.run.run_id[:8]}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        replay = self._replay
        while not self._stop.wait(self._interval):
            try:
                replay.apply_flags(self._store.heartbeat(replay.run.run_id, replay.epoch, self._token))
            except StaleAttemptError:
                # A newer attempt owns the run: stop this one at its next call.
                replay.lost_authority = True
                replay.cancel_event.set()
                return
            except (StorageUnavailableError, StorageCorruptError) as exc:
                logger.warning("heartbeat of run %s failed: %s", replay.run.run_id, exc)
