"""What the engine's hooks do once tracing or metrics are on: spans and counts.

The hooks in the task bodies and replay ops are one check of
``telemetry.observer`` (None: both off, and nothing below runs). Spans of a
run hang under its anchor (``context.run_parent``): every worker and every
attempt of a run reaches it from the run record alone, so a run is one trace
however many processes and attempts it crosses. A durable task's span is
remembered by its execution (``Replay``), not by the thread: a kept main
body runs on a thread of its own, and nested branches on threads too, and
their ops still find the span of the task they work for.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from celery_durable.telemetry import traces
from celery_durable.telemetry.context import run_parent

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from celery_durable.broker import RunRecord
    from celery_durable.broker.schema import Outcome
    from celery_durable.telemetry.metrics import Metrics
    from celery_durable.workflows.calls import CallRequest
    from celery_durable.workflows.replay import Replay

T = TypeVar("T")

RUN_ID = "celery_durable.run_id"
WORKFLOW = "celery_durable.workflow"
NAMESPACE = "celery_durable.namespace"
ATTEMPT = "celery_durable.attempt"
EPOCH = "celery_durable.epoch"
KEY = "celery_durable.key"
SEQUENCE = "celery_durable.sequence"
JOURNAL = "celery_durable.journal"
"""``new`` (the op ran now) or ``hit`` (its outcome came from the journal)."""
MESSAGE_ID = "messaging.message.id"


def run_attributes(record: RunRecord) -> dict[str, Any]:
    return {
        RUN_ID: record.run_id,
        WORKFLOW: record.workflow,
        NAMESPACE: record.namespace,
        ATTEMPT: record.attempt,
        EPOCH: record.epoch,
    }


class TaskScope:
    """One durable task's span and count: a coordinator pass, a branch task."""

    __slots__ = ("_begun", "_kind", "_observer", "_replay", "_span", "_token")

    def __init__(self, observer: Observer, replay: Replay, kind: str, token: str) -> None:
        self._observer, self._replay, self._kind, self._token = observer, replay, kind, token
        self._span: Span | None = None
        self._begun = 0.0

    def __enter__(self) -> None:
        self._begun = time.monotonic()
        self._span = self._observer.task_started(self._replay, self._kind, self._token)

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self._observer.task_ended(self._replay, self._kind, self._span, exc, time.monotonic() - self._begun)


class Observer:
    """Tracing (``tracer``) and metrics (``metrics``), either of them None."""

    def __init__(self, tracer: Tracer | None, metrics: Metrics | None) -> None:
        self.tracer = tracer
        self.metrics = metrics
        self._spans: weakref.WeakKeyDictionary[Replay, Span] = weakref.WeakKeyDictionary()
        self._counted: weakref.WeakSet[Replay] = weakref.WeakSet()

    # -- durable tasks -----------------------------------------------------------------

    def task(self, replay: Replay, kind: str, token: str) -> TaskScope:
        return TaskScope(self, replay, kind, token)

    def task_started(self, replay: Replay, kind: str, token: str) -> Span | None:
        record = replay.run
        if self.metrics is not None and kind == "pass" and record.started_at is None and replay not in self._counted:
            # Its first activation: the record was read before it (a kept body's replay is counted once).
            self._counted.add(replay)
            self.metrics.runs_started.labels(record.workflow).inc()
        if self.tracer is None:
            return None
        anchor = traces.context_of(run_parent(record.run_id, record.trace_parent, record.trace_attempt))
        span = traces.start(
            self.tracer,
            f"celery_durable.{kind}",
            anchor,
            {**run_attributes(record), MESSAGE_ID: token},
            kind="consumer",
        )
        self._spans[replay] = span
        return span

    def task_ended(
        self, replay: Replay, kind: str, span: Span | None, exc: BaseException | None, seconds: float
    ) -> None:
        if self.metrics is not None:
            self.metrics.tasks.labels(replay.run.workflow, kind).inc()
            self.metrics.task_seconds.labels(kind).observe(seconds)
        if span is None:
            return
        self._spans.pop(replay, None)
        if isinstance(exc, Exception):  # a Suspend (a BaseException) is how a pass waits, not a failure
            span.record_exception(exc)
            traces.failed(span, type(exc).__name__)
        span.end()

    def received(self, task: str, waited: float) -> None:
        if self.metrics is not None:
            self.metrics.queue_wait.labels(task).observe(max(0.0, waited))

    def settled(self, record: RunRecord, status: str) -> None:
        if self.metrics is not None:
            self.metrics.runs_settled.labels(record.workflow, status).inc()

    # -- ops -----------------------------------------------------------------------------

    def _op_span(self, replay: Replay, name: str, attributes: dict[str, Any], kind: str = "internal") -> Span | None:
        """A span under the task ``replay`` works for; None without one (a replay check, a test's harness)."""
        parent = self._spans.get(replay) if self.tracer is not None else None
        if parent is None or self.tracer is None:
            return None
        attributes[RUN_ID] = replay.run.run_id
        attributes[ATTEMPT] = replay.run.attempt
        return traces.start(self.tracer, name, traces.under(parent), attributes, kind=kind)

    def step(self, replay: Replay, seq: str, key: str, produce: Callable[[], Outcome]) -> Outcome:
        """A step run now: its span is current while its producer runs, so the user's own spans nest in it."""
        begun = time.monotonic()
        span = self._op_span(replay, "celery_durable.step", {KEY: key, SEQUENCE: seq, JOURNAL: "new"})
        if span is None:
            outcome = produce()
        else:
            with traces.use(span):
                outcome = produce()
                if outcome.kind != "o":
                    traces.failed(span, f"{outcome.error_type}: {outcome.message}")
        if self.metrics is not None:
            self._op_done(replay.run.workflow, "step", outcome.kind == "o", time.monotonic() - begun)
        return outcome

    def hit(self, replay: Replay, op: str, seq: str, key: str) -> None:
        """An op whose outcome the journal already held: a mark in the trace, no work."""
        span = self._op_span(replay, f"celery_durable.{op}", {KEY: key, SEQUENCE: seq, JOURNAL: "hit"})
        if span is not None:
            span.end()

    def call(self, replay: Replay, request: CallRequest, send: Callable[[CallRequest], None]) -> None:
        """A call published now. Its span is current while the task is sent,
        and its context rides in the message's headers (``inject_headers``):
        the called task, traced by opentelemetry-instrumentation-celery, is its child."""
        attributes = {KEY: request.key, "celery_durable.task": request.task_name, MESSAGE_ID: request.task_id}
        span = self._op_span(replay, "celery_durable.call", {**attributes, JOURNAL: "new"}, kind="producer")
        if self.metrics is not None:
            self.metrics.waits.labels(replay.run.workflow, "call").inc()
        if span is None:
            send(request)
            return
        with traces.use(span):
            send(request)

    def throttle_waits(self, throttle: str, outcome: str, n: int) -> None:
        """Slots asked of ``throttle`` (by its name, never a key), by outcome."""
        if self.metrics is not None:
            self.metrics.throttle_waits.labels(throttle, outcome).inc(n)

    def call_answered(self, workflow: str, ok: bool, seconds: float | None) -> None:
        if self.metrics is None:
            return
        self.metrics.ops.labels(workflow, "call", "ok" if ok else "failed").inc()
        if seconds is not None:
            self.metrics.op_seconds.labels(workflow, "call").observe(max(0.0, seconds))

    def wait(self, replay: Replay, seq: str, kind: str, name: str, *, hit: bool, ended: bool) -> None:
        """A durable wait reached: ``ended`` when it has fired (or its signal came), else the sequence waits."""
        if self.metrics is not None and not hit and not ended:
            self.metrics.waits.labels(replay.run.workflow, kind).inc()
        attributes = {
            "celery_durable.wait.kind": kind,
            "celery_durable.wait.name": name,
            "celery_durable.wait.state": "ended" if ended else "waiting",
            SEQUENCE: seq,
            JOURNAL: "hit" if hit else "new",
        }
        span = self._op_span(replay, "celery_durable.wait", attributes)
        if span is not None:
            span.end()

    def agent_dispatched(self, replay: Replay) -> None:
        if self.metrics is not None:
            self.metrics.waits.labels(replay.run.workflow, "agent").inc()

    def agent_turn(self, record: RunRecord, agent: str, token: str, run: Callable[[], T]) -> T:
        """An agent turn's task: its span (under the run's anchor) and its time."""
        begun = time.monotonic()
        span = None
        if self.tracer is not None:
            anchor = traces.context_of(run_parent(record.run_id, record.trace_parent, record.trace_attempt))
            attributes = {**run_attributes(record), "celery_durable.agent_id": agent, MESSAGE_ID: token}
            span = traces.start(self.tracer, "celery_durable.agent_turn", anchor, attributes, kind="consumer")
        if span is None:
            turn = run()
        else:
            with traces.use(span):
                turn = run()
                error = getattr(turn, "error", None)
                if error:
                    traces.failed(span, str(error))
        if self.metrics is not None:
            seconds = time.monotonic() - begun
            self.metrics.tasks.labels(record.workflow, "agent_turn").inc()
            self.metrics.task_seconds.labels("agent_turn").observe(seconds)
            self._op_done(record.workflow, "agent_turn", not getattr(turn, "error", None), seconds)
        return turn

    def _op_done(self, workflow: str, op: str, ok: bool, seconds: float) -> None:
        assert self.metrics is not None
        self.metrics.ops.labels(workflow, op, "ok" if ok else "failed").inc()
        self.metrics.op_seconds.labels(workflow, op).observe(seconds)

    # -- the recovery sweep ------------------------------------------------------------

    def take_over(self, record: RunRecord, cause: str, trigger: str) -> TakeOver:
        span = None
        if self.tracer is not None:
            # Under the run's own parent, beside the attempts, linked to the one it replaces.
            root = traces.context_of(run_parent(record.run_id, record.trace_parent))
            replaced = run_parent(record.run_id, record.trace_parent, record.trace_attempt)
            attributes = {**run_attributes(record), "celery_durable.cause": cause, "celery_durable.trigger": trigger}
            link = traces.link_to(replaced, {ATTEMPT: record.attempt, EPOCH: record.epoch})
            span = traces.start(self.tracer, "celery_durable.recovery", root, attributes, links=[link])
        return TakeOver(self, record.workflow, trigger, span)

    def sweep_pass(self, runs: int, seconds: float) -> None:
        if self.metrics is not None and runs:
            self.metrics.sweeps.inc()
            self.metrics.sweep_seconds.observe(seconds)

    def sweep_found(self, verdict: str, fired: int) -> None:
        if self.metrics is not None:
            self.metrics.sweep_found.labels(verdict).inc()
            if fired:
                self.metrics.timers_fired.inc(fired)


class TakeOver:
    """A dead attempt acted on: the recovery's span, whose traceparent the new
    attempt's record keeps (``trace_attempt``), and its count once it ends."""

    __slots__ = ("_observer", "_span", "_trigger", "_workflow")

    def __init__(self, observer: Observer | None, workflow: str, trigger: str, span: Span | None) -> None:
        self._observer, self._workflow, self._trigger, self._span = observer, workflow, trigger, span

    @property
    def traceparent(self) -> str:
        return traces.traceparent_of(self._span) if self._span is not None else ""

    def end(self, outcome: str, epoch: int | None = None) -> None:
        """``outcome``: recovered, halted, recovery_limit; or lost (another sweeper acted), not counted."""
        observer = self._observer
        if observer is not None and observer.metrics is not None and outcome != "lost":
            observer.metrics.takeovers.labels(self._workflow, self._trigger, outcome).inc()
        if self._span is not None:
            self._span.set_attribute("celery_durable.outcome", outcome)
            if epoch is not None:
                self._span.set_attribute("celery_durable.new_epoch", epoch)
            self._span.end()
