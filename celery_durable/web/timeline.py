"""The run page's timeline: steps, calls, agent turns, fan-outs and waits
over time, one bar each, drawn on the server as SVG (no script, no CDN).

Bars come from the run's detail (step and agent rows: start and end) and
its history (every wait from its ``wait_started`` to the timer, signal or
child's end that closed it; fan-outs dispatched): what ran when, and where
the run only waited.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from markupsafe import Markup

from celery_durable import RunDetail
from celery_durable.client.history import HistoryEvent

MAX_BARS = 120
"""Bars drawn at most (the first ones, by start): a long run's page stays light."""
WIDTH, LABEL, ROW, TOP = 900, 170, 16, 22


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    kind: str  # step, call, agent, wait, fanout
    start: datetime
    end: datetime | None
    status: str


def bars(detail: RunDetail, events: list[HistoryEvent]) -> list[Bar]:
    out: list[Bar] = []
    calls = {event.key for event in events if event.kind == "call_sent"}
    for step in detail.steps:
        if step.started_at is not None:
            kind = "call" if step.key in calls else "step"
            out.append(Bar(step.key, kind, step.started_at, step.finished_at, step.status))
    for agent in detail.agents:
        start = _dt(agent.get("started_at"))
        if start is not None:
            label = f"agent {agent.get('label') or agent.get('agent_id')}"
            out.append(Bar(label, "agent", start, _dt(agent.get("completed_at")), str(agent.get("status"))))
    starts = {step.key: step.started_at for step in detail.steps if step.started_at is not None}
    starts.update({str(a.get("agent_id")): start for a in detail.agents if (start := _dt(a.get("started_at")))})
    for i, event in enumerate(events):
        if event.kind == "wait_started":
            end = wait_end(event, events[i + 1 :], starts) or detail.run.finished_at
            out.append(Bar(wait_label(event), "wait", event.at, end, "completed" if end else "running"))
        elif event.kind == "branches_dispatched":
            label = f"{event.data.get('kind')} of {event.data.get('width')} at {event.key}"
            out.append(Bar(label, "fanout", event.at, event.at, "completed"))
    out.sort(key=lambda bar: bar.start)
    return out[:MAX_BARS]


WAIT_NAMES = {"timer": "sleep", "signal": "signal", "child": "child", "throttle": "throttle"}


def wait_label(event: HistoryEvent) -> str:
    kind = str(event.data.get("kind"))
    return f"{WAIT_NAMES.get(kind, kind)} {event.key or event.data.get('name')}"


def wait_end(
    started: HistoryEvent, later: list[HistoryEvent], starts: dict[str, datetime] | None = None
) -> datetime | None:
    """When the wait that ``started`` began ended, from the events after it:
    its timer fired, its signal came (or its timeout passed), its child settled, its throttle let it
    go (None: it waits). A throttle's grant is no event of its own: the
    run's slot ends at the attempt it let start, an op's at the op's start
    (``starts``: step and agent rows by key) or its first event after."""
    kind = started.data.get("kind")
    if kind == "throttle":
        return _throttle_end(started, later, starts or {})
    for event in later:
        if kind == "timer" and event.kind == "timer_fired" and event.key == started.key:
            return event.at
        if kind == "signal" and event.kind in ("signal_received", "signal_timed_out") and event.key == started.key:
            return event.at
        if kind == "child" and event.kind == "child_settled" and event.key == started.key:
            return event.at
    return None


def _throttle_end(started: HistoryEvent, later: list[HistoryEvent], starts: dict[str, datetime]) -> datetime | None:
    if started.key is None:
        return next((event.at for event in later if event.kind == "attempt_started"), None)
    began = starts.get(started.key)
    if began is not None and began >= started.at:
        return began
    return next((event.at for event in later if event.key == started.key and event.kind != "wait_started"), None)


def timeline_svg(detail: RunDetail, events: list[HistoryEvent], now: datetime | None = None) -> Markup:
    """The SVG, or an empty Markup when nothing has run yet."""
    drawn = bars(detail, events)
    if not drawn:
        return Markup("")
    now = now or datetime.now(UTC)
    run = detail.run
    begin = min(bar.start for bar in drawn)
    end = max([bar.end or now for bar in drawn] + ([run.finished_at] if run.finished_at else []))
    total = max((end - begin).total_seconds(), 0.001)
    scale = (WIDTH - LABEL - 10) / total
    height = TOP + ROW * len(drawn) + 6
    parts = [
        f'<svg id="timeline-svg" class="timeline-svg" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="Timeline of the run">',
        f'<text x="{LABEL}" y="12" class="axis">{escape(_clock(begin))}</text>',
        f'<text x="{WIDTH - 10}" y="12" class="axis" text-anchor="end">{escape(_clock(end))} '
        f"({escape(_span(total))})</text>",
    ]
    for i, bar in enumerate(drawn):
        y = TOP + i * ROW
        x = LABEL + (bar.start - begin).total_seconds() * scale
        w = max(((bar.end or now) - bar.start).total_seconds() * scale, 2.0)
        seconds = ((bar.end or now) - bar.start).total_seconds()
        tip = f"{bar.label}: {bar.status}, {_span(seconds)} from {_clock(bar.start)}"
        parts.append(
            f'<g class="bar bar-{bar.kind} status-{escape(bar.status)}" data-kind="{bar.kind}" '
            f'data-label="{escape(bar.label)}"><title>{escape(tip)}</title>'
            f'<text x="{LABEL - 6}" y="{y + 11}" text-anchor="end" class="label">{escape(bar.label[:28])}</text>'
            f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{ROW - 5}" rx="2"/></g>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _dt(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000, tz=UTC)
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value)
    return None


def _clock(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]


def _span(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"
