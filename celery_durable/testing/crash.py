"""Crashes on purpose: an attempt that dies at a chosen step, as under ``kill -9``.

DBOS places named trigger points in production code so a test can fail
exactly after a commit; here the trigger points are in the journal the test
environment hands to replay, so production code carries none. A crash point
names a step key and a moment: ``before`` (the step shows running, its
producer has not run) or ``after`` (its outcome is journaled, and the next
call of its sequence has begun, as the one script that journals it does).
Once a point fires, the whole attempt is dead: every later journal call of
any of its threads raises too, so nothing journals past the crash.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from celery_durable.broker.journal import (
    Began,
    BeginCall,
    Conflict,
    GuardedJournal,
    HeldBranch,
    Journal,
    PendingCommit,
    Recorded,
    Winner,
)

Answer = TypeVar("Answer")


class SimulatedCrash(BaseException):
    """The attempt died here. A ``BaseException``, like the unwinding of a
    killed process, so workflow code's ``except Exception`` cannot outlive it."""


@dataclass(frozen=True, slots=True)
class CrashPoint:
    key: str
    moment: str  # "before" or "after"


class CrashPlan:
    """The crash points armed for the attempts to come; each fires once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._points: list[CrashPoint] = []
        self._dead = False

    def arm(self, point: CrashPoint) -> None:
        with self._lock:
            self._points.append(point)

    @property
    def armed(self) -> list[CrashPoint]:
        with self._lock:
            return list(self._points)

    def revive(self) -> None:
        """The dead attempt is gone; whatever runs next is a new process."""
        with self._lock:
            self._dead = False

    def check_alive(self) -> None:
        with self._lock:
            if self._dead:
                raise SimulatedCrash("this attempt already died")

    def reached(self, key: str, moment: str) -> None:
        point = CrashPoint(key, moment)
        with self._lock:
            if point not in self._points:
                return
            self._points.remove(point)
            self._dead = True
        raise SimulatedCrash(f"simulated crash {moment} step {key!r}")


class CrashingJournal(GuardedJournal):
    """The environment's journal: the store's real one, dying at the plan's crash points.

    Every call first checks that the attempt is alive (``GuardedJournal``
    forwards each method of the protocol through that check), so once a
    point fired nothing of that attempt journals again, in any of its
    threads. The calls that begin or journal a step also fire the points
    armed for it: those are the methods written out below.
    """

    def __init__(self, inner: Journal, plan: CrashPlan) -> None:
        super().__init__(inner, self._alive_first)
        self._plan = plan

    def _alive_first(self, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._plan.check_alive()
        return method(*args, **kwargs)

    def begin(self, seq: str, call: BeginCall) -> Began:
        self._plan.check_alive()
        began = self._inner.begin(seq, call)
        self._began(call)
        return began

    def commit_begin(self, seq: str, commit: PendingCommit, call: BeginCall) -> Began | Conflict | Winner:
        self._plan.check_alive()
        return self._step_then_begin(self._inner.commit_begin(seq, commit, call), commit, call)

    def complete_begin(self, seq: str, held: HeldBranch, call: BeginCall) -> Began | Winner | Conflict:
        self._plan.check_alive()
        return self._step_then_begin(self._inner.complete_begin(seq, held, call), held.step, call)

    def complete_held(
        self, call: str, branch: int, outcome: str, wake: str, ending: str, seq: str, held: PendingCommit
    ) -> bool | Winner | Conflict:
        self._plan.check_alive()
        result = self._inner.complete_held(call, branch, outcome, wake, ending, seq, held)
        if isinstance(result, bool):
            self._committed(held)
        return result

    def record(self, seq: str, commit: PendingCommit, *, compensation: bool = False) -> Recorded | Conflict:
        self._plan.check_alive()
        result = self._inner.record(seq, commit, compensation=compensation)
        if isinstance(result, Recorded):
            self._committed(commit)
        return result

    def _step_then_begin(self, result: Answer, step: PendingCommit, call: BeginCall) -> Answer:
        """A script that journals ``step`` and begins ``call`` did both, unless it answered otherwise."""
        if isinstance(result, Began):
            self._committed(step)
            self._began(call)
        return result

    def _began(self, call: BeginCall) -> None:
        if call.step_key:
            self._plan.reached(call.step_key, "before")

    def _committed(self, commit: PendingCommit) -> None:
        if commit.step_key:
            self._plan.reached(commit.step_key, "after")
