"""The object a workflow's ``run(ctx)`` receives (SPEC §4).

Every method is one line into the replay engine, as in Temporal's
``workflow/_context.py``: the engine does the work, the context forwards.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn

from celery_durable.workflows import versions as patches
from celery_durable.workflows.branch_work import LENT
from celery_durable.workflows.envelope import from_ms
from celery_durable.workflows.replay import Replay
from celery_durable.workflows.retry import RetryPolicy
from celery_durable.workflows.saga import Saga
from celery_durable.workflows.throttles import Throttled, check_throttle
from celery_durable.workflows.waits import Signal


class WorkflowContext:
    """Journaled work, fan-out, progress and cancellation for one run."""

    def __init__(self, replay: Replay) -> None:
        self._home = replay
        self._args = copy.deepcopy(replay.run.args)

    @property
    def _replay(self) -> Replay:
        lending = LENT.get()
        if lending is not None and lending[0] is self._home:
            return lending[1]
        return self._home

    @property
    def run_id(self) -> str:
        return self._replay.run.run_id

    @property
    def schedule_id(self) -> str | None:
        """The schedule whose tick started this run (SPEC §5d), else None."""
        return self._replay.run.schedule_id

    @property
    def scheduled_at(self) -> datetime | None:
        """That tick, an aware UTC datetime, else None: the same on every replay."""
        return from_ms(self._replay.run.scheduled_at)

    @property
    def attempt(self) -> int:
        """The current attempt: 1 on the first, +1 on every resume or recovery."""
        return self._replay.run.attempt

    @property
    def args(self) -> Any:
        """The run's JSON arguments, the same on every replay and resume."""
        return self._args

    @property
    def cancel_event(self) -> threading.Event:
        return self._replay.cancel_event

    def cancelled(self) -> bool:
        return self._replay.cancelled()

    def phase(self, title: str) -> None:
        self._replay.phase(title)

    def log(self, message: str) -> None:
        self._replay.log(message)

    def step(
        self,
        key: str,
        producer: Callable[[], Any],
        *,
        volatile: bool = False,
        retry: RetryPolicy | None = None,
        throttle: str | None = None,
        throttle_key: str | None = None,
    ) -> Any:
        """Run ``producer`` once per run under ``key`` and journal its JSON
        result; with ``throttle``, holding a slot of that fleet-wide throttle
        while it runs (SPEC §5e)."""
        return self._replay.steps.step(
            key, producer, volatile=volatile, retry=retry, throttled=_throttled(throttle, throttle_key)
        )

    def parallel(self, thunks: Iterable[Callable[[], Any]], *, errors: str = "none") -> list[Any]:
        """Run zero-argument callables concurrently across the fleet; results in order.
        A failed slot is None (``errors="none"``), raised from the call once every
        branch finished, first in slot order (``"raise"``), or its exception (``"return"``)."""
        return self._replay.fanout.parallel(thunks, errors)

    def pipeline(
        self, items: Iterable[Any], *stages: Callable[[Any, Any, int], Any], errors: str = "none"
    ) -> list[Any]:
        """Each item through ``stage(previous, item, index)``; no barrier between items.
        ``errors`` as ``parallel``'s."""
        return self._replay.fanout.pipeline(items, stages, errors)

    def sleep(self, seconds: float | timedelta) -> None:
        """Wait ``seconds`` (or a ``timedelta``) without holding a worker; the run
        continues on any worker once it is due, within about a second."""
        self._replay.waits.sleep(seconds)

    def sleep_until(self, when: datetime) -> None:
        """Wait until ``when``, an aware datetime, without holding a worker."""
        self._replay.waits.sleep_until(when)

    def wait_for_signal(self, name: str, timeout: float | timedelta | None = None) -> Signal:
        """Wait for the next signal ``name`` sent with ``signal_workflow_run``
        (one sent earlier counts, in arrival order); ``received`` is false when
        ``timeout`` seconds passed first."""
        return self._replay.waits.wait_for_signal(name, timeout)

    def call(
        self,
        key: str,
        task: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        timeout: float | None = None,
        throttle: str | None = None,
        throttle_key: str | None = None,
    ) -> Any:
        """Run an existing Celery task (an object, a name or a signature) as a
        journaled step under ``key``: on any worker that has it, holding no
        slot here while it runs; its JSON result, or ``StepFailed``."""
        return self._replay.calls.call(
            key, task, args, kwargs, queue, timeout, _throttled(throttle, throttle_key)
        )

    def child(
        self,
        key: str,
        workflow: Any,
        args: Any = None,
        *,
        limits: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        throttle: str | None = None,
        throttle_key: str | None = None,
    ) -> Any:
        """Run another registered workflow (a name or a handle) as a child run
        under ``key`` and return its result, holding no slot here while it
        runs; ``ChildWorkflowFailed`` when it ends error or cancelled."""
        return self._replay.children.child(
            key, workflow, args, limits, timeout, _throttled(throttle, throttle_key)
        )

    def start_child(
        self, key: str, workflow: Any, args: Any = None, *, limits: Mapping[str, Any] | None = None
    ) -> str:
        """Start a child run under ``key`` that nothing waits for (it outlives
        this run and is not cancelled with it); its run id."""
        return self._replay.children.start_child(key, workflow, args, limits)

    def saga(self) -> Saga:
        """``with ctx.saga() as saga:``: compensations registered with
        ``saga.compensate(key, producer)`` run in reverse when the block
        fails or the run is cancelled."""
        return Saga(lambda: self._replay)

    def now(self) -> datetime:
        """Replay-safe clock: an aware UTC datetime, journaled."""
        return self._replay.steps.now()

    def uuid4(self) -> uuid.UUID:
        """Replay-safe random UUID, journaled."""
        return self._replay.steps.uuid4()

    def idempotency_key(self, key: str) -> str:
        """``"<run_id>:<key>"``: stable across attempts, for external services."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"idempotency_key takes a non-empty string, got {key!r}")
        return f"{self.run_id}:{key}"

    def patched(self, patch_id: str) -> bool:
        """True where this run executes new code at this point, False where it
        went past it under the old code: guard a change of calls with it (SPEC §8a)."""
        return patches.patched(self._replay, patch_id)

    def deprecate_patch(self, patch_id: str) -> None:
        """Once no run needs the old branch: consume the marker of ``patch_id`` where one is journaled."""
        patches.deprecate_patch(self._replay, patch_id)

    def workflow(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError("Nested workflows are not supported")

    def agent(
        self,
        prompt: str,
        *,
        label: str | None = None,
        schema: Any = None,
        model: str | None = None,
        throttle: str | None = None,
        throttle_key: str | None = None,
    ) -> Any:
        """One agent turn on the agents queue: its final text, or its JSON value
        when ``schema`` is given; None when the turn failed. Identical calls in a
        run are memoized."""
        return self._replay.agents.agent(
            prompt, label=label, schema_=schema, model=model, throttled=_throttled(throttle, throttle_key)
        )


def _throttled(throttle: object, key: object) -> Throttled:
    """``check_throttle``, reached only when a throttle is asked for: nearly
    every op is unthrottled, and its pass need not cross the throttle modules."""
    return None if throttle is None and key is None else check_throttle(throttle, key)
