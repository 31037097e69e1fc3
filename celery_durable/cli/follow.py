"""``--follow``: show one run until it settles, through the public client only.

``Client.follow_workflow_run_progress`` does the waiting (woken by the run's
updates, reading again after a quiet second, raising at the timeout); this
module only renders what it yields, and reads the run's detail when a record
says the phases or the run's state moved. Three views:

- ``LiveView`` on a terminal: one progress bar per declared phase (empty
  while pending, pulsing while active, full when done) with its elapsed
  time, the run's status line, and the latest progress lines;
- ``PlainView`` when output is not a terminal: a transcript, one line per
  record, phases marked as they begin and end;
- ``JsonView`` for ``--json``: one JSON object per line per record.

Each also says when the run begins to wait (a signal, a timer, a child run),
which no progress record does: a follower would otherwise sit silent at the
phase.

Each ends with the run's final envelope: a summary and the result.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from celery_durable import PhaseRow, ProgressEntry, RunDetail, RunEnvelope
from celery_durable.cli.common import print_json_line
from celery_durable.cli.render import (
    PHASE_ICONS,
    PHASE_STYLES,
    duration,
    phase_seconds,
    record_line,
    shown_state,
    status_text,
    summary,
    waiting_text,
)
from celery_durable.client.client import Client

LIVE_LINES = 8


class View(Protocol):
    def start(self, detail: RunDetail) -> None: ...
    def records(self, records: list[ProgressEntry]) -> None: ...
    def refresh(self, detail: RunDetail) -> None: ...
    def waiting(self, envelope: RunEnvelope) -> None:
        """The run began to wait (``snapshot.waiting_for``), or waits for something else now."""
        ...

    def stop(self, envelope: RunEnvelope | None) -> None: ...


def follow_run(
    client: Client,
    run_id: str,
    view: View,
    *,
    after_seq: int,
    timeout: float | None,
    history: Sequence[ProgressEntry] = (),
) -> RunEnvelope:
    """Show the run's progress after ``after_seq`` until it settles; its final envelope.

    ``history``, records read before (up to ``after_seq``), is shown first, so
    a transcript reads the same whether the run was followed from its start
    or joined later. Raises ``TimeoutError`` past ``timeout`` (the run goes
    on).
    """
    told: list[object] = [None]

    def on_run(current: RunEnvelope) -> None:
        # No record says that a run waits: its envelope does, and it is told once per wait.
        wait = current.snapshot.get("waiting_for") if not current.is_terminal else None
        if wait != told[0]:
            told[0] = wait
            if wait:
                view.waiting(current)

    records = client.follow_workflow_run_progress(run_id, after_seq=after_seq, timeout=timeout, on_run=on_run)
    envelope: RunEnvelope | None = None
    view.start(client.get_workflow_run_detail(run_id))
    try:
        if history:
            view.records(list(history))
        for record in records:
            view.records([record])
            if record.kind != "log":
                # A phase began, or the run's state changed: bars and status line move.
                view.refresh(client.get_workflow_run_detail(run_id))
        detail = client.get_workflow_run_detail(run_id)
        view.refresh(detail)
        envelope = detail.run
        return envelope
    finally:
        view.stop(envelope)


class PlainView:
    """A transcript for pipes and logs: every record once, in seq order."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.phases: list[PhaseRow] = []
        self.active: str | None = None
        self.first = True

    def start(self, detail: RunDetail) -> None:
        self.phases = detail.phases
        self.active = next((p.phase_id for p in detail.phases if p.state == "active"), None)
        titles = ", ".join(phase.title for phase in detail.phases) or "none declared"
        header = f"run {detail.run.run_id} · {detail.run.workflow} · phases: {titles}"
        self.console.print(header, markup=False, soft_wrap=True)

    def records(self, records: list[ProgressEntry]) -> None:
        if self.first and records:
            # The detail read at start may be newer than these records; when
            # they start at the run's first record or name phases, they tell
            # the phases' story themselves.
            self.first = False
            if records[0].seq == 1 or any(record.kind == "phase" for record in records):
                self.active = None
        for record in records:
            if record.kind == "phase" and record.phase_id != self.active:
                self._done(self.active)
                self.active = record.phase_id
            self.console.print(record_line(record, self.phases), soft_wrap=True)

    def refresh(self, detail: RunDetail) -> None:
        self.phases = detail.phases

    def waiting(self, envelope: RunEnvelope) -> None:
        self.console.print(Text(f"⏸ waiting for {waiting_text(envelope)}", style="bold"), soft_wrap=True)

    def stop(self, envelope: RunEnvelope | None) -> None:
        if envelope is None:
            return
        if envelope.status == "completed":
            # A completed run's last phase is done too; on any
            # other ending the phase that was active stays active.
            self._done(self.active)
        self.console.print(summary(envelope), soft_wrap=True)

    def _done(self, phase_id: str | None) -> None:
        phase = next((p for p in self.phases if p.phase_id == phase_id), None)
        if phase is not None:
            self.console.print(Text(f"✓ {phase.title} done", style="green"), soft_wrap=True)


class LiveView:
    """A live display on a terminal: a bar per phase and the latest lines."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.detail: RunDetail | None = None
        self.lines: deque[ProgressEntry] = deque(maxlen=LIVE_LINES)
        self.live = Live(console=console, get_renderable=self.render, refresh_per_second=8, transient=False)

    def start(self, detail: RunDetail) -> None:
        self.detail = detail
        self.live.start()

    def records(self, records: list[ProgressEntry]) -> None:
        self.lines.extend(records)

    def refresh(self, detail: RunDetail) -> None:
        self.detail = detail
        self.live.refresh()

    def waiting(self, envelope: RunEnvelope) -> None:
        # The head line says what it waits for, once it shows this envelope.
        if self.detail is not None:
            self.refresh(dataclasses.replace(self.detail, run=envelope))

    def stop(self, envelope: RunEnvelope | None) -> None:
        self.live.stop()
        if envelope is not None:
            self.console.print(summary(envelope))

    def render(self) -> RenderableType:
        detail = self.detail
        if detail is None:
            return Text("")
        run = detail.run
        head = Text(f"run {run.run_id} · {run.workflow} · ")
        head.append(status_text(run.status))
        head.append(f" · attempt {run.attempt} · steps {run.snapshot.get('steps_done', 0)} done")
        if run.snapshot.get("steps_running"):
            head.append(f", {run.snapshot['steps_running']} running")
        waiting = waiting_text(run)
        if waiting:
            head.append(f" · waiting for {waiting}", style="bold")
        bars = Table.grid(padding=(0, 1))
        for phase in detail.phases:
            state = shown_state(phase, run)
            bars.add_row(
                Text(PHASE_ICONS.get(state, "?")),
                Text(phase.title, style="bold" if state == "active" else ""),
                phase_bar(state),
                Text(state, style=PHASE_STYLES.get(state, "dim")),
                Text(duration(phase_seconds(phase, run))),
                Text(phase.detail or "", style="dim"),
            )
        parts: list[RenderableType] = [head, bars] if detail.phases else [head]
        parts.extend(record_line(record, detail.phases) for record in self.lines)
        return Group(*parts)


def phase_bar(state: str) -> ProgressBar:
    """Phases declare no amount of work, so an active phase's bar pulses."""
    return ProgressBar(total=1, completed=1 if state == "done" else 0, width=24, pulse=state == "active")


class JsonView:
    """``--json``: a line per record, then a line with the final envelope."""

    def start(self, detail: RunDetail) -> None:
        pass

    def records(self, records: list[ProgressEntry]) -> None:
        for record in records:
            print_json_line({"type": "progress", "record": record.to_dict()})

    def refresh(self, detail: RunDetail) -> None:
        pass

    def waiting(self, envelope: RunEnvelope) -> None:
        print_json_line({"type": "waiting", "run_id": envelope.run_id, "waiting_for": envelope.snapshot["waiting_for"]})

    def stop(self, envelope: RunEnvelope | None) -> None:
        if envelope is not None:
            print_json_line({"type": "run", "run": envelope.to_dict()})


def view_for(console: Console, as_json: bool) -> View:
    if as_json:
        return JsonView()
    return LiveView(console) if console.is_terminal else PlainView(console)
