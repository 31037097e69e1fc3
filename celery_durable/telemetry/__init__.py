"""Operators' telemetry: OpenTelemetry traces and Prometheus metrics (``docs/telemetry.md``).

The engine's hooks read one module attribute, ``observer``: None while
tracing and metrics are both off, and then nothing else runs — no span, no
label lookup, no allocation per op. Tracing is on once the process has
configured an OpenTelemetry tracer provider (looked at again as each durable
task starts, so one configured in ``worker_process_init`` counts); metrics
once ``enable_metrics`` ran (``celery-durable worker --metrics-port``, the
web view's ``/metrics``).

Child runs (``ctx.child``, when they come) record their trace the way a
start does: ``starting`` for the script that creates the child run,
called in the parent's pass, makes the child's trace continue the parent's
span.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from celery_durable.telemetry import traces
from celery_durable.telemetry.context import carried
from celery_durable.telemetry.observer import Observer, TakeOver

if TYPE_CHECKING:
    from celery_durable.broker import RunRecord
    from celery_durable.broker.replies.fleet import Examined
    from celery_durable.telemetry.metrics import Metrics
    from celery_durable.workflows.replay import Replay

__all__ = [
    "DUE_HEADER",
    "carry_traceparent",
    "enable_metrics",
    "observer",
    "refresh",
]

DUE_HEADER = "celery_durable_due"
"""The message header of a durable task: when (ms) its message was due, for the queue-wait histogram."""

observer: Observer | None = None
"""The one check every hook makes: None while tracing and metrics are off."""

T = TypeVar("T")
_metrics: Metrics | None = None
_carried = ""
_NOTHING = contextlib.nullcontext()
_NO_TAKE_OVER = TakeOver(None, "", "", None)


def refresh() -> Observer | None:
    """``observer`` as the process's configuration is now (a tracer provider set since, say)."""
    global observer
    tracer = traces.configured_tracer() if traces.INSTALLED else None
    if tracer is None and _metrics is None:
        observer = None
    elif observer is None or observer.tracer is not tracer or observer.metrics is not _metrics:
        observer = Observer(tracer, _metrics)
    return observer


def enable_metrics() -> Metrics:
    """Count into ``prometheus_client``'s default registry from now on (once per process).

    Under prefork, call it after ``PROMETHEUS_MULTIPROC_DIR`` is set and
    before the pool forks (``exposition.serve_worker_metrics`` does both).
    """
    global _metrics
    if _metrics is None:
        from celery_durable.telemetry.metrics import Metrics

        _metrics = Metrics()
    refresh()
    return _metrics


def carry_traceparent(text: str | None, source: str) -> None:
    """A trace context this process was handed from outside (the CLI: the
    ``TRACEPARENT`` variable); runs it starts outside any span join it. One
    that does not parse is ignored with one warning."""
    global _carried
    _carried = carried(text, source)


# -- hooks: each is one line in the module it observes ------------------------------------


class Starting:
    """A run being started: the ``trace_parent`` its record keeps, and its
    start's count and ``celery_durable.start`` span, both made only by
    ``created`` once the script made the run. A start that finds its run made
    already (a child reached again by a replay or cancelled at its time-out,
    a schedule's tick fired again, an idempotency key's run) starts nothing:
    its span, never ended, is never exported."""

    __slots__ = ("_span", "_started", "traceparent")

    def __init__(self, traceparent: str, started: Any = None, span: Any = None) -> None:
        self.traceparent, self._started, self._span = traceparent, started, span

    def created(self) -> None:
        started, span, self._started, self._span = self._started, self._span, None, None
        if started is not None:
            started.inc()
        if span is not None:
            span.end()


def starting(workflow: str, run_id: str, within: str = "") -> Starting:
    """What a run being started records as ``trace_parent``: a ``celery_durable.start``
    span (when this process traces) under the caller's span, the caller's
    span itself, or, outside any span, ``within`` (a child run: its parent
    run's trace) or a context carried from outside; '' for none."""
    found = refresh()
    started = found.metrics.runs_created.labels(workflow) if found is not None and found.metrics is not None else None
    tracer = found.tracer if found is not None else None
    outside = within or _carried
    if tracer is None:
        return Starting(traces.current_traceparent() or outside, started)
    parent = traces.context_of_traceparent(outside) if outside and not traces.current_traceparent() else None
    span = traces.start(
        tracer, "celery_durable.start", parent, {"celery_durable.run_id": run_id, "celery_durable.workflow": workflow},
        kind="producer",
    )
    return Starting(traces.traceparent_of(span), started, span)


def resume_traceparent() -> str:
    """What a resumed run records as its new attempt's anchor: the resuming caller's span, or ''."""
    return traces.current_traceparent() if refresh() is not None else ""


def agent_turn(record: RunRecord, agent: str, token: str, run: Callable[[], T]) -> T:
    """An agent turn's task around ``run`` (the runner): its span and time."""
    found = observer
    return run() if found is None else found.agent_turn(record, agent, token, run)


def task(replay: Replay, kind: str, token: str) -> Any:
    """The span and count of a durable task around its work (``kind``: pass, branches)."""
    found = observer
    return _NOTHING if found is None else found.task(replay, kind, token)


def received(task_name: str, request: Any) -> None:
    """A durable task's message began: how long it waited in its queue."""
    found = refresh()
    if found is None or found.metrics is None:
        return
    due = getattr(request, DUE_HEADER, None)
    if isinstance(due, int) and not isinstance(due, bool):
        found.received(task_name.rpartition(".")[2], time.time() - due / 1000)


def settled(record: RunRecord, status: str) -> None:
    found = observer
    if found is not None:
        found.settled(record, status)


def take_over(record: RunRecord, cause: str, *, forced: bool) -> TakeOver:
    found = refresh()  # the sweep's thread runs no task that would have looked
    return _NO_TAKE_OVER if found is None else found.take_over(record, cause, "redelivery" if forced else "sweep")


def call_answered(workflow: str, ok: bool, called_ms: Any) -> None:
    found = observer
    if found is not None:
        seconds = time.time() - called_ms / 1000 if isinstance(called_ms, int) and called_ms > 0 else None
        found.call_answered(workflow, ok, seconds)


def inject_headers(headers: dict[str, Any]) -> dict[str, Any]:
    """``headers`` with the current trace context added, when this process traces."""
    found = observer
    if found is not None and found.tracer is not None:
        traces.inject_current(headers)
    return headers


def sweep_pass(runs: int, seconds: float) -> None:
    found = observer
    if found is not None:
        found.sweep_pass(runs, seconds)


def sweep_found(examined: Examined | None) -> None:
    """What the sweep found of one run (None: its record is gone)."""
    found = observer
    if found is not None:
        if examined is None:
            found.sweep_found("gone", 0)
        else:
            found.sweep_found(examined.verdict.value or "settled", len(examined.woken))
