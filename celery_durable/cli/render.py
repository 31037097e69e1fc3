"""How runs look in a terminal: tables for ``runs list``/``runs show``,
progress lines, and the closing summary of a run."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Column, Table
from rich.text import Text

from celery_durable.workflows.envelope import PhaseRow, ProgressEntry, RunDetail, RunEnvelope, RunPage

STATUS_STYLES = {
    "pending": "dim",
    "running": "cyan",
    "completed": "green",
    "paused": "yellow",
    "halted": "yellow",
    "cancelled": "magenta",
    "error": "red",
}
PHASE_ICONS = {"pending": "○", "active": "◐", "done": "✓"}
SHOWN_STEPS = 20
SHOWN_PROGRESS = 10


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLES.get(status, ""))


def when(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value is not None else ""


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


def phase_seconds(phase: PhaseRow, run: RunEnvelope) -> float | None:
    """How long the phase took, or has taken so far; an active phase of a
    settled run stopped with the run."""
    if phase.started_at is None:
        return None
    end = phase.finished_at
    if end is None and phase.state == "active":
        end = run.finished_at if run.is_terminal else datetime.now(tz=UTC)
    return max(0.0, (end - phase.started_at).total_seconds()) if end is not None else None


def compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def envelope_table(envelope: RunEnvelope) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in envelope.to_dict().items():
        shown: RenderableType = status_text(value) if key == "status" else Text(
            "" if value is None else compact(value)
        )
        table.add_row(key, shown)
    return table


def runs_table(page: RunPage) -> Table:
    table = Table("workflow", "status", "attempt", "phase", "steps", "created")
    # Ids are what people copy: never folded or cut.
    table.columns.insert(0, Column("run", no_wrap=True, min_width=32))
    table.columns[-1].no_wrap = True
    for envelope in page.runs:
        table.add_row(
            envelope.run_id,
            envelope.workflow,
            status_text(envelope.status),
            str(envelope.attempt),
            str(envelope.snapshot.get("phase") or ""),
            str(envelope.snapshot.get("steps_done", 0)),
            when(envelope.created_at),
        )
    return table


def detail_view(detail: RunDetail) -> RenderableType:
    """``runs show``: the envelope, then phases, agents, steps and recent progress."""
    phases = Table("", "phase", "title", "state", "started", "took", "detail", title="phases", title_justify="left")
    for phase in detail.phases:
        phases.add_row(
            PHASE_ICONS.get(phase.state, "?"), phase.phase_id, phase.title, phase.state,
            when(phase.started_at), duration(phase_seconds(phase, detail.run)), phase.detail or "",
        )
    agents = Table("agent", "label", "model", "status", "active", "error", title="agents", title_justify="left")
    for agent in detail.agents:
        agents.add_row(
            str(agent.get("agent_id") or ""), str(agent.get("label") or ""), str(agent.get("model") or ""),
            str(agent.get("status") or ""), duration((agent.get("active_ms") or 0) / 1000),
            str(agent.get("error") or ""),
        )
    steps = Table("step", "status", "attempt", "error", title="steps", title_justify="left")
    for step in detail.steps[-SHOWN_STEPS:]:
        steps.add_row(step.key, step.status, str(step.attempt), step.error or "")
    parts: list[RenderableType] = [envelope_table(detail.run), Text(""), phases]
    parts.append(agents if detail.agents else Text("agents: none"))
    parts.append(steps if detail.steps else Text("steps: none"))
    if len(detail.steps) > SHOWN_STEPS:
        parts.append(Text(f"… and {len(detail.steps) - SHOWN_STEPS} more steps (--json lists them all)", style="dim"))
    parts.append(Text("recent progress", style="italic"))
    parts.extend(record_line(record, detail.phases) for record in detail.progress[-SHOWN_PROGRESS:])
    return Group(*parts)


def record_line(record: ProgressEntry, phases: list[PhaseRow] | None) -> Text:
    """One progress record as a transcript line: ``▶`` a phase begins, ``•``
    the runtime's own events, indented lines the workflow's log."""
    if record.kind == "phase":
        line = Text("▶ ", style="bold cyan")
        line.append(record.message, style="bold")
        index = next((i for i, p in enumerate(phases or []) if p.phase_id == record.phase_id), None)
        if phases and index is not None:
            line.append(f" (phase {index + 1}/{len(phases)})")
            if phases[index].detail:
                line.append(f": {phases[index].detail}", style="dim")
        return line
    if record.kind == "system":
        return Text(f"• {record.message}", style="dim")
    return Text(f"  {record.message}")


def summary(envelope: RunEnvelope) -> RenderableType:
    """The closing lines of a followed run: how it ended, then its result or error."""
    took = None
    if envelope.started_at is not None and envelope.finished_at is not None:
        took = (envelope.finished_at - envelope.started_at).total_seconds()
    head = Text("■ ")
    head.append(status_text(envelope.status))
    head.append(f"  run {envelope.run_id} · attempt {envelope.attempt}")
    if took is not None:
        head.append(f" · {duration(took)}")
    lines: list[RenderableType] = [head]
    if envelope.status == "completed":
        lines.append(Text("result: " + (json.dumps(envelope.result) if envelope.has_result else "(none)")))
    elif envelope.error or envelope.reason:
        lines.append(Text(f"{envelope.reason or envelope.status}: {envelope.error or ''}".rstrip(": ")))
    if envelope.can_resume:
        lines.append(Text(f"resume it with: celery-durable runs resume {envelope.run_id}", style="dim"))
    return Group(*lines)


def print_envelope(console: Console, envelope: RunEnvelope) -> None:
    console.print(envelope_table(envelope))
