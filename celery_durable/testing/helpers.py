"""What a test of a user's workflows reaches for, on a real fleet or in-process.

``until_waiting_for_signal`` blocks until a run waits for a signal — the
moment a test sends it, or checks what a run shows while it waits — woken
by the run's own updates (``Client.watch_runs``), never by a fixed sleep.
Time travel to a run's next timer is ``WorkflowTestEnvironment.skip_to_next_timer``.
"""

from __future__ import annotations

import time

from celery_durable.client.client import Client
from celery_durable.workflows.envelope import RunEnvelope

QUIET_READ_SECONDS = 0.5
"""How long a silent channel is trusted before the run is read anyway (pub/sub may drop an update)."""


def until_waiting_for_signal(
    client: Client, run_id: str, name: str | None = None, *, timeout: float = 30.0
) -> RunEnvelope:
    """The run's envelope once it waits for signal ``name`` (any signal:
    None). ``TimeoutError`` past ``timeout``; an ``AssertionError`` if the
    run settles first (it will never wait now)."""
    deadline = time.monotonic() + timeout
    with client.watch_runs([run_id]) as watch:  # subscribed before the first read: no change is missed
        while True:
            envelope = client.get_workflow_run(run_id)
            waiting = envelope.snapshot.get("waiting_for")
            if waiting is not None and waiting.get("kind") == "signal" and name in (None, waiting.get("name")):
                return envelope
            if envelope.is_terminal:
                raise AssertionError(f"Run {run_id} settled {envelope.status} before it waited for a signal")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"Run {run_id} did not wait for signal {name or '(any)'} within {timeout}s")
            watch.get(min(remaining, QUIET_READ_SECONDS))
