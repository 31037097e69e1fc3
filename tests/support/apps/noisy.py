"""An ``--app`` module that writes to stdout, as users' modules do: a
``print`` at import, a console span exporter (OpenTelemetry's, which writes
each span as JSON to the stdout it captured when it was imported) and a
span ended at exit, as a batch processor flushes at shutdown. For the CLI
test that a command's results are on stdout alone."""

from __future__ import annotations

import atexit
import sys
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from celery_durable import Engine, WorkflowContext, workflow

print("noisy: imported")
sys.stdout.flush()

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(provider)


def _span_at_exit() -> None:
    with trace.get_tracer("noisy").start_as_current_span("noisy-at-exit"):
        print("noisy: exiting")


atexit.register(_span_at_exit)


@workflow(name="noisy", description="Says hello", phases=[])
def noisy(ctx: WorkflowContext) -> Any:
    return ctx.step("hello", lambda: "hello")


def make_engine() -> Engine:
    with trace.get_tracer("noisy").start_as_current_span("noisy-engine"):
        return Engine(workflows=[noisy])
