"""``Port``: all an execution asks of the world beyond its journal.

A ``Replay`` reaches the fleet (messages to send, narrow fan-outs run in
the pass, thunks kept for later branch tasks, child runs, throttle slots)
through this one object, never through callbacks handed to it one by one:
what an execution may do outside Redis is then read in one place, and an
execution is built one way whichever drives it. ``tasks/port.EnginePort``
is the engine's; ``Detached`` is an execution's that sends nothing (a
replay check, a test that drives replay by hand).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from celery_durable.workflows.branch_work import InlineBranches, KeptFanout
    from celery_durable.workflows.calls import CallRequest
    from celery_durable.workflows.children import ChildPort
    from celery_durable.workflows.throttles import ThrottlePort

Count = Callable[[Sequence[str]], None]
"""Journals the task ids of branch messages before they are sent."""


class Port(Protocol):
    """The fleet, as one execution of one run sees it."""

    max_fanout: int
    max_payload_bytes: int

    @property
    def inline(self) -> InlineBranches | None:
        """Set in a coordinator pass that runs narrow fan-outs itself."""

    @property
    def children(self) -> ChildPort | None:
        """Child runs; None where an execution starts none (a replay check)."""

    @property
    def throttles(self) -> ThrottlePort | None:
        """Throttle slots; None where an execution takes none."""

    def send_branches(self, call: str, indices: Sequence[int], count: Count) -> list[str]:
        """Send branch tasks for ``indices`` of fan-out ``call``; their task ids."""

    def send_agent(self, agent: str, owner: str, task_id: str) -> None:
        """Send an agent turn's task, which wakes ``owner`` when it answers."""

    def send_call(self, request: CallRequest) -> None:
        """Publish a called Celery task (``ctx.call``)."""

    def keep_fanout(self, kept: KeptFanout) -> None:
        """A top-level fan-out's thunks as this execution built them, for the
        branch tasks of this process that run them later; ignored where
        nothing keeps them."""


class Detached:
    """A port that reaches nothing: every send is refused."""

    inline = None
    children = None
    throttles = None

    def __init__(self, max_fanout: int, max_payload_bytes: int) -> None:
        self.max_fanout = max_fanout
        self.max_payload_bytes = max_payload_bytes

    def send_branches(self, call: str, indices: Sequence[int], count: Count) -> list[str]:
        raise RuntimeError("this execution cannot send branches")

    def send_agent(self, agent: str, owner: str, task_id: str) -> None:
        raise RuntimeError("this execution cannot send agent turns")

    def send_call(self, request: CallRequest) -> None:
        raise RuntimeError("this execution cannot call tasks")

    def keep_fanout(self, kept: KeptFanout) -> None:
        return None
