"""Points a test waits for in a run (with tests/support/poll.py)."""

from __future__ import annotations

from typing import Any

from tests.support.poll import RUN_BOUND, poll


def waiting_for_the_signal(d: Any, run_id: str, name: str = "approve") -> None:
    """Until the run waits for its signal ``name`` and the sweep, having looked,
    no longer watches it: only a signal brings it back now."""
    store = d.engine.store
    poll(
        lambda: (d.client.get_workflow_run(run_id).snapshot.get("waiting_for") or {}).get("name") == name,
        within=RUN_BOUND,
        what="the run to wait for its signal",
    )
    poll(
        lambda: store.client.zscore(store.keys.sweep_due, run_id) is None,
        within=RUN_BOUND,
        what="the sweep to stop watching the run",
    )
