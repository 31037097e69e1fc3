"""How runs look in a terminal: tables for ``runs list``/``runs show``,
progress lines, and the closing summary of a run."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Column, Table
from rich.text import Text

from celery_durable import PhaseRow, ProgressEntry, RunDetail, RunEnvelope, RunPage

STATUS_STYLES = {
    "pending": "dim",
    "running": "cyan",
    "completed": "green",
    "paused": "yellow",
    "halted": "yellow",
    "cancelled": "magenta",
    "error": "red",
}
PHASE_ICONS = {"pending": "○", "active": "◐", "done": "✓", "stopped": "■"}
PHASE_STYLES = {"done": "green", "active": "cyan", "stopped": "yellow"}
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


def shown_state(phase: PhaseRow, run: RunEnvelope) -> str:
    """A phase's state as a person reads it: the phase a settled run stopped in
    is not "active" any more (the API keeps its state), it stopped."""
    if phase.state == "active" and run.is_terminal:
        return "stopped"
    return phase.state


def waiting_text(envelope: RunEnvelope) -> str:
    """What the run waits for, in words: "signal 'approval' until 12:00:03 UTC", "timer until ..."."""
    waiting = envelope.snapshot.get("waiting_for")
    if not waiting:
        return ""
    kind = waiting.get("kind")
    what = {"signal": f"signal {waiting['name']!r}", "child": f"child run {waiting['name']}"}.get(str(kind), "timer")
    until = waiting.get("until")
    if until:
        what += f" until {datetime.fromisoformat(until).strftime('%Y-%m-%d %H:%M:%S')} UTC"
    return what


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
    table = Table("workflow", "status", "attempt", "phase", "steps", "waiting for", "created")
    # Ids are what people copy: never folded or cut.
    table.columns.insert(0, Column("run", no_wrap=True, min_width=32))
    status = table.columns[2]
    status.no_wrap, status.min_width = True, len("completed")  # the longest status
    table.columns[-1].no_wrap = True
    for envelope in page.runs:
        table.add_row(
            envelope.run_id,
            envelope.workflow,
            status_text(envelope.status),
            str(envelope.attempt),
            str(envelope.snapshot.get("phase") or ""),
            str(envelope.snapshot.get("steps_done", 0)),
            waiting_text(envelope),
            when(envelope.created_at),
        )
    return table


def detail_view(detail: RunDetail) -> RenderableType:
    """``runs show``: the envelope, then phases, agent turns, every step (in the
    order they began, each with how long it took) and recent progress."""
    run = detail.run
    phases = Table("", "phase", "title", "state", "started", "took", "detail", title="phases", title_justify="left")
    for phase in detail.phases:
        state = shown_state(phase, run)
        phases.add_row(
            PHASE_ICONS.get(state, "?"), phase.phase_id, phase.title, state,
            when(phase.started_at), duration(phase_seconds(phase, run)), phase.detail or "",
        )
    agents = Table(
        "agent", "label", "model", "status", "active", "tokens in", "tokens out", "credits", "error",
        title="agent turns", title_justify="left",
    )
    for agent in detail.agents:
        usage = agent.get("usage") or {}
        agents.add_row(
            str(agent.get("agent_id") or ""), str(agent.get("label") or ""), str(agent.get("model") or ""),
            str(agent.get("status") or ""), duration((agent.get("active_ms") or 0) / 1000),
            str(usage.get("prompt_tokens", 0)), str(usage.get("completion_tokens", 0)),
            f"{float(usage.get('ai_credits') or 0):g}", str(agent.get("error") or ""),
        )
    steps = Table("step", "status", "attempt", "started", "took", "error", title="steps", title_justify="left")
    for step in detail.steps:
        took = step.duration_ms / 1000 if step.duration_ms is not None else None
        steps.add_row(step.key, step.status, str(step.attempt), when(step.started_at), duration(took), step.error or "")
    parts: list[RenderableType] = [envelope_table(run), Text(""), phases]
    waiting = waiting_text(run)
    if waiting:
        parts.append(Text(f"waiting for: {waiting}", style="bold"))
    parts.extend(family_view(detail))
    parts.append(Text(code_text(detail)))
    parts.append(agents if detail.agents else Text("agent turns: none"))
    parts.append(steps if detail.steps else Text("steps: none"))
    parts.append(Text("recent progress", style="italic"))
    parts.extend(record_line(record, detail.phases) for record in detail.progress[-SHOWN_PROGRESS:])
    return Group(*parts)


def family_view(detail: RunDetail) -> list[RenderableType]:
    """The run's parent and children, each with the command that shows it."""
    parts: list[RenderableType] = []
    parent = detail.run.parent_run_id
    if parent:
        parts.append(Text(f"parent run: {parent}  (celery-durable runs show {parent})"))
    if detail.children:
        table = Table("key", "workflow", "status", "waited for", title="child runs", title_justify="left")
        table.columns.insert(0, Column("run", no_wrap=True, min_width=32))
        for child in detail.children:
            table.add_row(
                child.run_id, child.key, child.workflow, status_text(child.status or "gone"),
                "detached" if child.detached else "yes",
            )
        parts.append(table)
        parts.append(Text("show one with: celery-durable runs show <run>", style="dim"))
    return parts
def code_text(detail: RunDetail) -> str:
    """Which code the run runs: the hash it started with, and the one its latest attempt ran when another."""
    started, last = detail.started_code_hash, detail.last_attempt_code_hash
    if last and last != started:
        return f"code: started with {started}, latest attempt ran {last}"
    return f"code: {started}"


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
