"""What ``celery-durable demo`` prints: events as they happen, the run's own
progress records, and at the end its phases, steps and the provider receipts.

Everything shown is read back from Redis (the run's envelope, detail and
progress through the public client; the receipts from the providers), never
composed by the demo from what it expected to happen.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from celery_durable import ProgressEntry, RunDetail, Settings
from celery_durable.cli.render import duration, phase_seconds, record_line, status_text
from celery_durable.demo.providers import Receipt

if TYPE_CHECKING:
    from celery_durable.local.fleet import LocalWorker


def stamp(seconds: float) -> Text:
    return Text(f"[{seconds:5.1f}s] ", style="dim")


def intro(redis_described: str, settings: Settings, workers: int) -> RenderableType:
    lines = Text()
    lines.append("A trip, its workers killed while the car booking is in flight\n", style="bold")
    lines.append(
        "A trip books a flight, a hotel and a rental car in parallel against local fake providers\n"
        "that honour idempotency keys, reviews the bookings and confirms. Every worker process is\n"
        "killed with SIGKILL while the car booking is in flight; new ones finish the same run.\n"
        "Then the car provider sells out: a second trip's saga cancels its flight and hotel.\n"
    )
    lines.append(f"Redis: {redis_described}\n", style="cyan")
    lines.append(
        f"{workers} workers per generation · key prefix {settings.key_prefix} · "
        f"lease {settings.lease_seconds:g} s (CELERY_DURABLE_LEASE_SECONDS; 30 s by default)",
        style="dim",
    )
    return Panel(lines, title="celery-durable demo", expand=False)


def event(seconds: float, message: str) -> Text:
    line = stamp(seconds)
    line.append("» ", style="bold magenta")
    line.append(message)
    return line


def progress(seconds: float, record: ProgressEntry) -> Text:
    """One of the run's own progress records, as ``runs progress`` shows it."""
    line = stamp(seconds)
    line.append_text(record_line(record, None))
    if record.kind == "system" and "recovered" in record.message:
        line.stylize("bold green", len(line) - len(record.message) - 2)
    return line


def worker_label(worker: LocalWorker) -> str:
    return f"{worker.name} (pid {worker.pid})"


def exit_text(code: int | None) -> str:
    if code is None:
        return "no exit yet"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


def crash_point(seconds: float, detail: RunDetail) -> RenderableType:
    head = stamp(seconds)
    head.append("» the crash point: ", style="bold magenta")
    head.append("flight and hotel journaled; the car reserved at its provider, its step not journaled")
    return Group(head, steps_table(detail, title="steps in Redis, before the kill"))


def steps_table(detail: RunDetail, title: str) -> Table:
    table = Table("step", "status", "attempt", title=title, title_justify="left")
    for row in detail.steps:
        table.add_row(row.key, status_text(row.status), str(row.attempt))
    return table


def phases_table(detail: RunDetail) -> Table:
    table = Table("phase", "state", "took", title="phases", title_justify="left")
    for phase in detail.phases:
        table.add_row(phase.title, phase.state, duration(phase_seconds(phase, detail.run)))
    return table


def receipts_table(receipts: Sequence[Receipt], expected: Sequence[int] = (1, 1, 1)) -> Table:
    table = Table(
        "service", "raw provider calls", "reservations", "cancellations", "confirmation",
        title="provider receipts (read from the providers, not the journal)", title_justify="left",
    )
    for receipt, wanted in zip(receipts, expected, strict=True):
        table.add_row(
            receipt.service,
            str(receipt.calls),
            Text(str(receipt.reservations), style="green" if receipt.reservations == wanted else "bold red"),
            str(receipt.cancellations),
            receipt.confirmation or "",
        )
    return table


def undone(detail: RunDetail, receipts: Sequence[Receipt], seconds: float) -> RenderableType:
    """The second trip: the car refused, the flight and the hotel cancelled by the saga."""
    run = detail.run
    head = stamp(seconds)
    head.append("■ ")
    head.append_text(status_text(run.status))
    status = run.result.get("status") if isinstance(run.result, dict) else None
    head.append(f"  run {run.run_id} · {status or 'no result'}")
    parts: list[RenderableType] = [head, steps_table(detail, "steps"), receipts_table(receipts, (1, 1, 0))]
    cancelled = [r.service for r in receipts if r.reservations == 1 and r.cancellations == 1]
    if cancelled:
        parts.append(
            Text(
                f"no car left: the saga cancelled the {' and the '.join(cancelled)} at their providers, "
                "each cancellation a journaled step.",
                style="bold",
            )
        )
    return Group(*parts)


def outcome(detail: RunDetail, receipts: Sequence[Receipt], seconds: float) -> RenderableType:
    run = detail.run
    head = stamp(seconds)
    head.append("■ ")
    head.append_text(status_text(run.status))
    head.append(f"  run {run.run_id} · attempt {run.attempt}")
    parts: list[RenderableType] = [head, phases_table(detail), steps_table(detail, "steps"), receipts_table(receipts)]
    for receipt in receipts:
        if receipt.calls > 1 and receipt.reservations == 1:
            parts.append(
                Text(
                    f"{receipt.service}: its step ran {receipt.calls} times (killed in flight, run again by the "
                    "next attempt); the idempotency key made the provider book once.",
                    style="bold",
                )
            )
    if run.status != "completed":
        parts.append(Text(f"the run ended {run.status}: {run.reason or ''} {run.error or ''}", style="bold red"))
    return Group(*parts)
