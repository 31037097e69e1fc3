"""What the crash-point explorer records: the boundaries one run of a scenario crosses.

A ``Tracer`` numbers the boundaries of the process under way — before and
after each storage operation of the environment's store (``_TracedStore``)
and each message its sender publishes (``_TracedSender``) — and kills the
process at the target one: ``SimulatedCrash``, and every later boundary or
step producer of that process raises too. ``explorer.py`` runs scenarios on
it; ``crash_test.py`` counts a user's step producers and fakes through
``Tracer.effect``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from celery_durable.engine import Engine
from celery_durable.tasks.sending import Outgoing
from celery_durable.testing.crash import SimulatedCrash
from celery_durable.testing.environment import _Store
from celery_durable.testing.fleet import InProcessSender
from celery_durable.workflows.calls import CallRequest

if TYPE_CHECKING:
    from celery_durable.testing.explorer import ExplorerEnvironment


@dataclass(frozen=True, slots=True)
class Boundary:
    """One place a process can die: ``moment`` (before/after) an operation.

    ``label`` is stable across runs of one scenario (script name and its
    ordinal in the run, or the task published), so known-failing points can
    be listed by it."""

    index: int
    process: int
    process_name: str
    label: str
    moment: str

    @property
    def name(self) -> str:
        return f"{self.moment} {self.label} (in {self.process_name})"


@dataclass(slots=True)
class Trace:
    """What one run of a scenario crossed, and the step producers it ran, in order."""

    boundaries: list[Boundary] = field(default_factory=list)
    effects: list[tuple[int, int, str]] = field(default_factory=list)
    """(boundaries crossed before it, process, effect name)."""


class Tracer:
    """Counts boundaries of the current process, and kills it at the target one.

    Only the thread that drives a process is traced: a heartbeat thread or
    the sweep (which never dies here) crosses no boundary."""

    def __init__(self) -> None:
        self.trace = Trace()
        self.target: int | None = None
        self.crashed_at: Boundary | None = None
        self.effects: Counter[str] = Counter()
        self._process = -1
        self._process_name = ""
        self._thread: int | None = None
        self._dead = False
        self._ordinals: Counter[str] = Counter()
        self._depth = threading.local()

    @contextmanager
    def process(self, name: str) -> Iterator[None]:
        """One process: a delivery or a client call; its death ends it here, quietly."""
        self._process += 1
        self._process_name = name
        self._thread = threading.get_ident()
        self._dead = False
        try:
            yield
        except SimulatedCrash:
            pass
        finally:
            self._thread = None
            self._dead = False

    def _traced(self) -> bool:
        return self._thread == threading.get_ident() and not getattr(self._depth, "n", 0)

    def _cross(self, label: str, moment: str) -> None:
        if not self._traced():
            return
        if self._dead:
            raise SimulatedCrash(f"the process died earlier; {moment} {label}")
        boundary = Boundary(len(self.trace.boundaries), self._process, self._process_name, label, moment)
        self.trace.boundaries.append(boundary)
        if boundary.index == self.target:
            self._dead = True
            self.crashed_at = boundary
            raise SimulatedCrash(f"simulated crash {boundary.name}")

    def around(self, kind: str, call: Callable[[], Any]) -> Any:
        """``call`` (one storage operation or one publish) between its two boundaries."""
        if not self._traced():
            return call()
        self._ordinals[kind] += 1
        label = f"{kind}#{self._ordinals[kind]}"
        self._cross(label, "before")
        self._depth.n = 1  # a call nested in this one (a script run again alone) is part of it
        try:
            result = call()
        finally:
            self._depth.n = 0
        self._cross(label, "after")
        return result

    def effect(self, name: str) -> None:
        """A step producer ran (called by the scenario's step functions). A
        dead process runs none: its thread unwinds instead."""
        if self._traced() and self._dead:
            raise SimulatedCrash(f"the process died earlier; effect {name}")
        self.effects[name] += 1
        process = self._process if self._traced() else -1
        self.trace.effects.append((len(self.trace.boundaries), process, name))


class _TracedStore(_Store):
    """The environment's store, each storage operation between two boundaries."""

    tracer: Tracer

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return self.tracer.around(name, lambda: super(_TracedStore, self)._run(name, keys, args))

    def _run_each_with(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], writes: Callable[[Any], None]
    ) -> list[Any]:
        return self.tracer.around(  # type: ignore[no-any-return]
            name, lambda: super(_TracedStore, self)._run_each_with(name, calls, writes)
        )

    def _run_each(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], *, looked: bool = False
    ) -> list[Any]:
        return self.tracer.around(  # type: ignore[no-any-return]
            f"{name}*", lambda: super(_TracedStore, self)._run_each(name, calls, looked=looked)
        )

    def schedule_check(self, run_id: str, at_ms: int, *, sooner_only: bool = False) -> None:
        self.tracer.around(
            "schedule_check", lambda: super(_TracedStore, self).schedule_check(run_id, at_ms, sooner_only=sooner_only)
        )

    def look(self, run_ids: Sequence[str], at_ms: int) -> None:
        self.tracer.around("look", lambda: super(_TracedStore, self).look(run_ids, at_ms))

    def looked(self, claim: str, looks: dict[str, int], done: Sequence[str]) -> None:
        self.tracer.around("looked", lambda: super(_TracedStore, self).looked(claim, looks, done))

    def unschedule(self, run_id: str) -> None:
        self.tracer.around("unschedule", lambda: super(_TracedStore, self).unschedule(run_id))


class _TracedSender(InProcessSender):
    """The fleet's sender, each message published between two boundaries."""

    tracer: Tracer
    env: ExplorerEnvironment

    def send(self, messages: Sequence[Outgoing]) -> None:
        for message in messages:
            self.tracer.around(f"publish {short(message.task)}", partial(self._send, message))

    def _send(self, message: Outgoing) -> None:
        """Queued now, or, with a countdown, once the virtual clock reaches it
        (a pass that found the lock busy sends itself again a little later)."""
        if message.countdown:
            due = self.env.clock.now_ms() + round(message.countdown * 1000)
            self.env.delayed.append((due, message))
        else:
            super().send([message])

    def send_call(self, engine: Engine, record: Any, request: CallRequest) -> None:
        self.tracer.around(
            f"publish {request.task_name}", lambda: super(_TracedSender, self).send_call(engine, record, request)
        )


def short(task: str) -> str:
    return task.rsplit(".", 1)[-1]
