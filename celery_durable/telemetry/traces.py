"""OpenTelemetry, through its API only: whether a tracer is configured, and spans in a run's trace.

The API is an optional dependency (``pip install celery-durable[otel]``) and
the SDK, its exporters and sampler the user's choice. Until a tracer
provider is set, ``opentelemetry.trace`` hands out non-recording spans; this
module says "no tracer" instead, so that nothing is built at all
(``telemetry.refresh``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from celery_durable.telemetry.context import Parent, parse_traceparent

try:
    from opentelemetry import trace as otel
    from opentelemetry.propagate import inject
    from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

    INSTALLED = True
except ImportError:  # the otel extra is not installed: tracing is off
    INSTALLED = False

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

TRACER_NAME = "celery_durable"
_cached: tuple[object, Tracer] | None = None


def configured_tracer() -> Tracer | None:
    """The tracer of the provider the process configured, or None while it has none."""
    global _cached
    if not INSTALLED:
        return None
    provider = otel.get_tracer_provider()
    if isinstance(provider, otel.ProxyTracerProvider | otel.NoOpTracerProvider):
        return None
    if _cached is None or _cached[0] is not provider:
        _cached = (provider, provider.get_tracer(TRACER_NAME))
    return _cached[1]


def context_of(parent: Parent) -> Context:
    """A context whose current span is ``parent``, a remote span of another process or attempt."""
    span = NonRecordingSpan(
        SpanContext(parent.trace_id, parent.span_id, is_remote=True, trace_flags=TraceFlags(parent.flags))
    )
    return otel.set_span_in_context(span)


def context_of_traceparent(text: str) -> Context | None:
    parent = parse_traceparent(text)
    return context_of(parent) if parent is not None else None


def link_to(parent: Parent, attributes: Mapping[str, Any]) -> Link:
    context = SpanContext(parent.trace_id, parent.span_id, is_remote=True, trace_flags=TraceFlags(parent.flags))
    return Link(context, dict(attributes))


def under(span: Span) -> Context:
    """A context whose current span is ``span``, a span of this process."""
    return otel.set_span_in_context(span)


def start(
    tracer: Tracer,
    name: str,
    context: Context | None,
    attributes: Mapping[str, Any],
    *,
    kind: str = "internal",
    links: Iterable[Link] = (),
) -> Span:
    """A span, started now, under the current span of ``context`` (None: this thread's)."""
    return tracer.start_span(
        name, context=context, kind=SpanKind[kind.upper()], attributes=dict(attributes), links=list(links)
    )


def failed(span: Span, description: str) -> None:
    span.set_status(StatusCode.ERROR, description)


def use(span: Span) -> Any:
    """``span`` current in this thread until the block ends, then ended (an
    exception that passes is recorded on it, as OpenTelemetry does)."""
    return otel.use_span(span, end_on_exit=True)


def traceparent_of(span: Span) -> str:
    """The W3C traceparent naming ``span``, '' for a span that is not valid."""
    found = span.get_span_context()
    if not found.is_valid:
        return ""
    return Parent(found.trace_id, found.span_id, int(found.trace_flags)).traceparent()


def current_traceparent() -> str:
    """The traceparent of the span current in this thread (the caller's), or ''."""
    if not INSTALLED:
        return ""
    return traceparent_of(otel.get_current_span())


def inject_current(headers: MutableMapping[str, Any]) -> None:
    """The current trace context into a Celery message's headers, by the
    global propagator, as ``opentelemetry-instrumentation-celery`` writes them
    (``traceparent``, ``tracestate``, ``baggage`` with the default one): its
    consumer side reads them back from the task's request."""
    inject(headers)
