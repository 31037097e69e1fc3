"""The operator's actions, shared by the page's forms and the JSON API.

Each is one client call and a sentence saying what happened. Cancel, pause
and resume block in the client until the run settles (30 s by default);
a page cannot hang that long, so they wait ``SETTLE_SECONDS`` and, if the
run has not settled yet, report the request as made: the run page then
shows the outcome live as the run reaches it. Blocking calls: run them off
the event loop (``WebContext.call``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_durable import Client, RunEnvelope
from celery_durable.web.problems import BadRequest

SETTLE_SECONDS = 2.0
APPROVAL_SIGNAL = "approval"
MAX_SIGNAL_NAME = 200


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an action did; ``run`` is the envelope read after it (None if the run could not be read)."""

    message: str
    run: RunEnvelope | None

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "run": self.run.to_dict() if self.run is not None else None}


def cancel(client: Client, run_id: str, *, settle: float = SETTLE_SECONDS) -> Outcome:
    requested = "Cancellation requested: the run stops at its next step or agent call."
    return _settling(client, run_id, client.cancel_workflow_run, requested, settle)


def pause(client: Client, run_id: str) -> Outcome:
    requested = "Pause requested: work in flight finishes, then the run pauses."
    return _settling(client, run_id, client.pause_workflow_run, requested, SETTLE_SECONDS)


def _settling(
    client: Client, run_id: str, ask: Callable[..., RunEnvelope], requested: str, settle: float
) -> Outcome:
    """``ask`` the client and wait a little (``settle`` seconds) for the run to
    settle: its status, or ``requested`` when it has not settled yet."""
    try:
        run = ask(run_id, timeout=settle)
    except TimeoutError:
        return Outcome(requested, read(client, run_id))
    return Outcome(f"The run is {run.status}.", run)


def resume(client: Client, run_id: str, *, force: bool, settle: float = SETTLE_SECONDS) -> Outcome:
    try:
        run = client.resume_workflow(run_id, timeout=settle, force=force)
    except TimeoutError:
        current = read(client, run_id)
        what = f"attempt {current.attempt} is {current.status}" if current is not None else "the new attempt runs"
        return Outcome(f"Resumed: {what}.", current)
    return Outcome(f"Resumed: attempt {run.attempt} ended {run.status}.", run)


def signal(client: Client, run_id: str, name: str, payload: Any) -> Outcome:
    send = getattr(client, "signal_workflow_run", None)
    if send is None:
        raise BadRequest("This engine cannot send signals yet (Client.signal_workflow_run is missing)")
    send(run_id, name, payload)
    return Outcome(f"Signal {name!r} sent.", read(client, run_id))


def approve(client: Client, run_id: str, *, approved: bool, note: str | None) -> Outcome:
    """``approve``, as the CLI's ``runs approve`` sends it: the signal ``approval`` with ``{"approved", "note"}``."""
    signal(client, run_id, APPROVAL_SIGNAL, {"approved": approved, "note": note or None})
    verdict = "Approved" if approved else "Rejected"
    return Outcome(f"{verdict}: the signal {APPROVAL_SIGNAL!r} was sent.", read(client, run_id))


def signal_name(text: str | None) -> str:
    name = (text or "").strip()
    if not name:
        raise BadRequest("A signal needs a name")
    if len(name) > MAX_SIGNAL_NAME:
        raise BadRequest(f"A signal name is at most {MAX_SIGNAL_NAME} characters")
    return name


def signal_payload(text: str | None) -> Any:
    """The payload field: empty means no payload (None); anything else must be JSON."""
    if text is None or not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"The payload is not valid JSON ({exc}); no signal was sent") from None


def read(client: Client, run_id: str) -> RunEnvelope | None:
    """The run's envelope after an action; None when it cannot be read (the action was still made)."""
    try:
        return client.get_workflow_run(run_id)
    except Exception:  # the action was made; failing to read back must not hide that
        return None
