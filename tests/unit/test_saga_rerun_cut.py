"""A compensation that re-runs an older attempt's failure cuts the sequence
past its saga's last compensation (``Cursor.cut_here``), but only past those
in the live history: beyond it the journal may hold entries an older cut
abandoned, which a cut further on would make history again."""

from __future__ import annotations

from typing import Any

from celery_durable import StepFailed, WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment
from tests.support.producers import calls, did, fails, fails_first


@workflow(name="saga-rerun-cut-abandoned", description="A saga reached only once a caught failure passes", phases=[])
def abandoned(ctx: WorkflowContext) -> Any:
    try:
        ctx.step("a", lambda: fails_first("a"))
    except StepFailed:
        for key in ("x1", "x2", "x3"):
            ctx.step(key, lambda key=key: did(key))
        ctx.step("x4", lambda: fails("x4"))
        return None
    with ctx.saga() as saga:
        ctx.step("b", lambda: did("b"))
        saga.compensate("undo-1", lambda: did("undo-1"))
        saga.compensate("undo-2", lambda: fails_first("undo-2"))
        ctx.step("c", lambda: fails("c"))
    return None


def test_a_rerun_compensation_does_not_revive_what_an_older_cut_abandoned() -> None:
    """Attempt 1 takes the caught path (x1..x4 at calls 1..4). Attempt 2 runs
    "a" again (cut at call 0), enters the saga, and dies right after undo-2
    failed at call 3. Attempt 3 runs undo-2 again: a cut past the saga's
    last compensation (call 4) made attempt 1's x4 there history again, and
    undo-1 met it as a divergence."""
    calls.clear()
    env = WorkflowTestEnvironment([abandoned])
    first = env.run(abandoned)
    assert (first.status, first.error) == ("error", "StepFailed: step 'x4' raised RuntimeError: x4")
    env.crash_after("undo-2")
    crashed = env.resume(first.run_id)
    assert (crashed.status, crashed.attempt) == ("running", 2)
    assert (calls["undo-2"], calls["undo-1"]) == (1, 0)
    resumed = env.resume(first.run_id)
    assert (resumed.status, resumed.reason, resumed.error) == (
        "error",
        "exception",
        "StepFailed: step 'c' raised RuntimeError: c",
    )
    assert (calls["undo-2"], calls["undo-1"]) == (2, 1)
