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
from collections.abc import Sequence
from dataclasses import dataclass

from celery_durable.broker.journal import (
    AgentCall,
    Began,
    BeginCall,
    Conflict,
    Dispatch,
    PendingCommit,
    Recorded,
    WaitResult,
    Winner,
)
from celery_durable.broker.memory import MemoryJournal, MemoryRun
from celery_durable.testing.clock import VirtualClock


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


class CrashingJournal(MemoryJournal):
    """The environment's journal: a ``MemoryJournal`` (on the run's virtual
    clock) that dies at the plan's crash points.

    It subclasses the journal, so a method the protocol gains later is there
    at once (journaling on, with no crash check until one is added here).
    """

    def __init__(self, run: MemoryRun, epoch: int, plan: CrashPlan, clock: VirtualClock) -> None:
        super().__init__(run, epoch)
        self._plan = plan

    def begin(self, seq: str, call: BeginCall) -> Began:
        self._plan.check_alive()
        began = super().begin(seq, call)
        if call.step_key:
            self._plan.reached(call.step_key, "before")
        return began

    def commit_begin(self, seq: str, commit: PendingCommit, call: BeginCall) -> Began | Conflict | Winner:
        self._plan.check_alive()
        result = super().commit_begin(seq, commit, call)
        if isinstance(result, Began):
            if commit.step_key:
                self._plan.reached(commit.step_key, "after")
            if call.step_key:
                self._plan.reached(call.step_key, "before")
        return result

    def record(self, seq: str, commit: PendingCommit) -> Recorded | Conflict:
        self._plan.check_alive()
        result = super().record(seq, commit)
        if isinstance(result, Recorded) and commit.step_key:
            self._plan.reached(commit.step_key, "after")
        return result

    def dispatch(
        self, seq: str, index: int, identity: str, width: int, token: str, position: int
    ) -> Dispatch | Conflict:
        self._plan.check_alive()
        return super().dispatch(seq, index, identity, width, token, position)

    def sending(self, call: str, messages: Sequence[str]) -> None:
        self._plan.check_alive()
        super().sending(call, messages)

    def mark_sent(self, call: str) -> None:
        self._plan.check_alive()
        super().mark_sent(call)

    def hand_off(self, call: str, giver: str, branches: Sequence[int], messages: Sequence[str]) -> None:
        self._plan.check_alive()
        super().hand_off(call, giver, branches, messages)

    def complete_branch(self, call: str, branch: int, outcome: str, wake: str, ending: str = "") -> bool:
        self._plan.check_alive()
        return super().complete_branch(call, branch, outcome, wake, ending)

    def complete_held(
        self, call: str, branch: int, outcome: str, wake: str, ending: str, seq: str, held: PendingCommit
    ) -> bool | Winner | Conflict:
        self._plan.check_alive()
        return super().complete_held(call, branch, outcome, wake, ending, seq, held)

    def agent_call(
        self,
        seq: str,
        index: int,
        agent_id: str,
        request_json: str,
        owner: str,
        row_json: str,
        cut: str | None,
        message: str,
    ) -> AgentCall | Conflict:
        self._plan.check_alive()
        return super().agent_call(seq, index, agent_id, request_json, owner, row_json, cut, message)

    def wait(
        self, seq: str, index: int, identity: str, kind: str, name: str, due_ms: int | None, owner: str
    ) -> WaitResult | Conflict:
        self._plan.check_alive()
        return super().wait(seq, index, identity, kind, name, due_ms, owner)
