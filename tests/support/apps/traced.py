"""An engine whose worker processes trace with the OpenTelemetry SDK, for tests/test_telemetry.py.

With ``TELEMETRY_SPANS`` set, the process configures a tracer provider whose
exporter appends each ended span as a JSON line to that file, and
instruments Celery (opentelemetry-instrumentation-celery), as a user's
worker would. The exporter writes synchronously (no thread of its own), so
a prefork child keeps the one it inherits. ``TELEMETRY_GATE`` names a directory: the ``gate`` step writes
``reached`` there and holds until ``open`` appears.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery_durable import Engine, WorkflowContext, workflow

GATE_SECONDS = 60


class FileExporter:
    """Each span as one JSON line, written as it ends (SimpleSpanProcessor):
    a SIGKILLed worker keeps every span it had ended."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = [json.dumps(_span(span)) + "\n" for span in spans]
        with self.lock, open(self.path, "a", encoding="utf-8") as out:
            out.write("".join(lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


def _span(span: Any) -> dict[str, Any]:
    context = span.get_span_context()
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "kind": span.kind.name,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
        "pid": os.getpid(),
    }


def configure() -> None:
    path = os.environ.get("TELEMETRY_SPANS")
    if not path:
        return
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))  # type: ignore[arg-type]
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()


def _gate() -> int:
    gate = Path(os.environ["TELEMETRY_GATE"])
    (gate / "reached").touch()
    deadline = time.monotonic() + GATE_SECONDS
    while not (gate / "open").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.getpid()


@workflow(name="traced_crash", description="Three steps, the second held at a gate", phases=[])
def traced_crash(ctx: WorkflowContext) -> Any:
    first = ctx.step("before", lambda: 1)
    ctx.step("gate", _gate)
    return ctx.step("after", lambda: first + 1)


@workflow(name="traced_call", description="Calls a Celery task, then one step", phases=[])
def traced_call(ctx: WorkflowContext) -> Any:
    doubled = ctx.call("double", "traced.double", args=[int(ctx.args.get("x", 2))])
    return ctx.step("after", lambda: doubled + 1)


@workflow(name="counted", description="Three steps and a short sleep", phases=[])
def counted(ctx: WorkflowContext) -> Any:
    total = sum(ctx.step(f"s{i}", lambda i=i: i) for i in range(3))
    ctx.sleep(0.05)
    return total


@workflow(name="traced_kid", description="A child run: one step", phases=[])
def traced_kid(ctx: WorkflowContext) -> Any:
    return ctx.step("kid-step", lambda: "kid")


@workflow(name="traced_parent", description="A step, then a child run", phases=[])
def traced_parent(ctx: WorkflowContext) -> Any:
    ctx.step("first", lambda: 1)
    return ctx.child("kid", traced_kid)


@workflow(name="traced_waiting_kid", description="A child run that waits for a signal", phases=[])
def traced_waiting_kid(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("never").received


@workflow(name="traced_impatient", description="A child run it waits a second for, then cancels", phases=[])
def traced_impatient(ctx: WorkflowContext) -> Any:
    from celery_durable import StepFailed

    try:
        return ctx.child("kid", traced_waiting_kid, timeout=1)
    except StepFailed as exc:
        return exc.error_type


@workflow(name="traced_unanswered", description="Calls a task no worker takes, for a second", phases=[])
def traced_unanswered(ctx: WorkflowContext) -> Any:
    from celery_durable import StepFailed

    try:
        return ctx.call("lost", "traced.nobody", args=[], queue=str(ctx.args["queue"]), timeout=1)
    except StepFailed as exc:
        return exc.error_type


engine = Engine(
    workflows=[
        traced_crash, traced_call, counted, traced_kid, traced_parent, traced_waiting_kid, traced_impatient,
        traced_unanswered,
    ]
)
celery_app = engine.celery


@celery_app.task(name="traced.double")
def double(x: int) -> int:
    return 2 * x


configure()
