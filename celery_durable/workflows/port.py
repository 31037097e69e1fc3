"""``Port``: all an execution asks of the world beyond its journal.

A ``Replay`` reaches the fleet (messages to send, narrow fan-outs run in
the pass, thunks kept for later branch tasks, child runs, throttle slots)
through this one object, never through callbacks handed to it one by one:
what an execution may do outside Redis is then read in one place, and an
execution is built one way whichever drives it. This base reaches nothing
(a replay check: every send is refused); ``tasks/port.EnginePort`` is the
engine's, and ``tests/unit/harness.py`` keeps the messages for a test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery_durable.workflows.branch_work import InlineBranches, KeptFanout
    from celery_durable.workflows.calls import CallRequest
    from celery_durable.workflows.children import ChildPort
    from celery_durable.workflows.throttles import ThrottlePort

Count = Callable[[Sequence[str]], None]
"""Journals the task ids of branch messages before they are sent."""


class Port:
    """The fleet, as one execution of one run sees it."""

    def __init__(self, max_fanout: int, max_payload_bytes: int) -> None:
        self.max_fanout = max_fanout
        self.max_payload_bytes = max_payload_bytes
        self.held_step_seconds: float | None = None
        """How long a main-body step may stay held back before it is journaled
        by itself (``workflows/held.py``); None: until the body's next call."""

    @property
    def inline(self) -> InlineBranches | None:
        """Set in a coordinator pass that runs narrow fan-outs itself."""
        return None

    @property
    def children(self) -> ChildPort | None:
        """Child runs; None where an execution starts none (a replay check)."""
        return None

    @property
    def throttles(self) -> ThrottlePort | None:
        """Throttle slots; None where an execution takes none."""
        return None

    def send_branches(self, call: str, indices: Sequence[int], count: Count) -> list[str]:
        """Send branch tasks for ``indices`` of fan-out ``call``; their task ids."""
        raise RuntimeError("this execution cannot send branches")

    def send_agent(self, agent: str, owner: str, task_id: str) -> None:
        """Send an agent turn's task, which wakes ``owner`` when it answers."""
        raise RuntimeError("this execution cannot send agent turns")

    def send_call(self, request: CallRequest) -> None:
        """Publish a called Celery task (``ctx.call``)."""
        raise RuntimeError("this execution cannot call tasks")

    def keep_fanout(self, kept: KeptFanout) -> None:
        """A top-level fan-out's thunks as this execution built them, for the
        branch tasks of this process that run them later; ignored where
        nothing keeps them."""
