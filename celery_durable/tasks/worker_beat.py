"""A worker's word to the fleet: that it is alive, and which of the engine's messages it holds.

The recovery sweep of every worker judges a message lost when the worker
that held it stops beating (``claim_dead_workers``, ``mark_lost``), and a
queued message by the empty-queue rule, which a backlog delays without
bound. So a worker says each durable message it receives at once, and its
beat says again every interval which it still holds: received, waiting for
a countdown, or running (Celery's own bookkeeping). Its sweep
(``tasks/recovery.py``) starts and stops it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from celery.worker import state as worker_state

from celery_durable.broker import now_ms
from celery_durable.broker.keys import RUN_ID_PATTERN
from celery_durable.broker.schema.live import HELD_TOKEN, HeldMessage
from celery_durable.errors import StorageError
from celery_durable.tasks.app import AGENT_TASK, BRANCH_TASK, CALL_FAILED_TASK, CALL_RESULT_TASK, COORDINATOR_TASK
from celery_durable.workflows.versions import profile_of

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

BEAT_SPACING = 0.02
"""Beats that received messages ask for are this far apart at least: one write per 20 ms at worst."""
DURABLE_TASKS = frozenset({COORDINATOR_TASK, BRANCH_TASK, AGENT_TASK})
ANSWER_TASKS = frozenset({CALL_RESULT_TASK, CALL_FAILED_TASK})
FRESH_SECONDS = 5.0
"""A received message is reported from this worker's own record this long at most (see beat)."""

Turn = Callable[[Callable[[], object], str], bool]
"""A turn of a loop that lives as long as the worker (``RecoverySweep._turn``)."""


class WorkerBeat:
    """One worker's beats and the messages it says it holds."""

    def __init__(
        self,
        engine: Engine,
        worker_id: str,
        queues: Callable[[], Collection[str]],
        interval: float,
        stop: threading.Event,
        turn: Turn,
    ) -> None:
        self.engine = engine
        self.worker_id = worker_id
        """Who beats (``<hostname>/<pid>``)."""
        self.interval = interval
        self._queues = queues
        """The queues this worker consumes (read at each beat: Celery knows them once it runs)."""
        self._stop = stop
        """The sweep's: set, the beat and the holding thread end."""
        self._turn = turn
        self._beat_now = threading.Event()
        self._fresh: dict[str, tuple[str, float]] = {}
        """Messages received lately (task id -> held value, when), until Celery's own requests list them."""
        self._reported: set[str] = set()
        """The messages the last beat reported held."""
        self._to_hold: deque[tuple[str, str]] = deque()
        """Messages received and not yet said held (task id, held value): ``_hold_loop`` says so."""
        self._hold_now = threading.Event()
        self._holder: threading.Thread | None = None

    def start(self) -> None:
        """The beat and the holding thread, until the sweep's ``stop`` is set."""
        threading.Thread(target=self._beat_loop, name="celery-durable-beat", daemon=True).start()
        self._holder = threading.Thread(target=self._hold_loop, name="celery-durable-held", daemon=True)
        self._holder.start()

    def stop(self) -> None:
        """Once the sweep's ``stop`` is set: the last held write lands, then the worker is forgotten."""
        self._hold_now.set()
        if self._holder is not None:
            self._holder.join(timeout=10)
        with contextlib.suppress(StorageError):
            self.engine.store.forget_worker(self.worker_id)

    def received(self, request: Any = None) -> None:
        """A message was received: it is said at once, before the worker can
        die holding it (a message the fleet never heard of would be left to
        the empty-queue rule, which a backlog delays without bound), but by
        the holding thread (``_hold_loop``), not in the consumer's: the task
        starts without waiting for that round trip, and a burst of messages
        is said in one. Written, it needs no beat: the next regular one
        (within ``interval``) takes out what finished. Not written, the beat
        comes soon and reports it with the rest (a beat per message cost a
        burst of wakes 5 % of the worker's time)."""
        held = _held(request)
        if held is None:
            return  # another task (a call's own, say): no run counts it in flight
        task_id = str(request.id)
        self._fresh[task_id] = (held, time.monotonic())
        self._to_hold.append((task_id, held))
        self._hold_now.set()

    def _hold_loop(self) -> None:
        while not self._stop.is_set():
            self._hold_now.wait(self.interval)
            self._hold_now.clear()  # before the drain: what comes after it sets the event again
            held: list[tuple[str, str]] = []
            while self._to_hold:
                held.append(self._to_hold.popleft())
            if not held:
                continue
            try:
                self.engine.store.hold_messages(self.worker_id, held, now_ms())
            except StorageError as exc:
                logger.warning("could not report %d message(s) as held: %s", len(held), exc)
                self._beat_now.set()

    def _beat_loop(self) -> None:
        while not self._stop.is_set():
            self._beat_now.wait(self.interval)
            self._beat_now.clear()
            if not self._turn(self.beat, "worker beat failed: %s"):
                return
            self._stop.wait(BEAT_SPACING)

    def beat(self) -> None:
        """Say this worker is alive, and which of the engine's messages it holds:
        received, waiting for a countdown, or running (Celery's own bookkeeping)."""
        held: dict[str, str] = {}
        requests, complete = _requests()
        for request in requests:
            value = _held(request)
            if value is not None:
                held[str(request.id)] = value
        # Received but not yet in Celery's requests (the task_received signal
        # comes first), or in and out again between two beats: still held.
        now = time.monotonic()
        for task_id, (value, at) in list(self._fresh.items()):
            if task_id in held or now - at > FRESH_SECONDS:
                self._fresh.pop(task_id, None)
            else:
                held[task_id] = value
        # Only what this beat saw go is removed: a message received while it
        # looked was written by received() and is in no snapshot yet; with a
        # set left unread, nothing is.
        gone = [task_id for task_id in self._reported if task_id not in held] if complete else []
        # What it serves goes with every beat (list_workers, a mixed deploy named).
        profile = profile_of(self.engine.workflows, self._queues())
        self.engine.store.report_worker(self.worker_id, held, gone, now_ms(), profile)
        self._reported = set(held) if complete else self._reported | set(held)


def _requests() -> tuple[list[Any], bool]:
    """Celery's requests of this worker, and whether every one was read.

    The reserved and scheduled ones by object, then those by id: a message
    that retries itself under its own id (an answer that could not be
    journaled, with a countdown) is scheduled while its first delivery ends,
    and that end pops the id from ``requests``; while both are there, the
    by-id entry is the newer, whose delivery tag must win, so it comes last.
    The sets change under the consumer's thread; one that changed while it
    was read is left out, and the beat then says nothing gone."""
    requests: list[Any] = []
    complete = True
    for pending in (worker_state.reserved_requests, worker_state.scheduled_requests):
        try:
            requests.extend(list(pending))
        except RuntimeError:  # "Set changed size during iteration"
            complete = False
    requests.extend(list(worker_state.requests.values()))
    return requests, complete


def _held(request: Any) -> str | None:
    """What the held hash says of a received message (``HeldMessage``): the
    run of one of the engine's messages, and of a call's answer its delivery
    tag too; None for any other task, and for a message whose run id, task
    id or tag is not one (``HELD_TOKEN``: the claim must be able to read it).

    By the task's registered name (``Request.type``): ``Request.name`` is the
    shadow name the message shows in Flower, which says the workflow instead.
    """
    kwargs = getattr(request, "kwargs", None)
    run_id = kwargs.get("run_id") if isinstance(kwargs, dict) else None
    kind = getattr(request, "type", None)
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id) or not HELD_TOKEN.match(str(request.id)):
        return None  # not a run's (the task refuses it, and says why): nothing of it is held
    if kind in DURABLE_TASKS:
        return run_id
    tag = str(getattr(getattr(request, "message", None), "delivery_tag", ""))
    if kind in ANSWER_TASKS and HELD_TOKEN.match(tag):
        return HeldMessage(run_id, tag).value()
    return None
