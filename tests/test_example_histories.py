"""``examples/fulfilment.py`` against the histories its runs left
(``examples/histories/``), as a user's test suite checks a change before a
deploy: a plain test, no worker and no service started beforehand
(``replay_history`` uses the private redis-server ``celery_durable.testing``
starts itself)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from celery_durable import WorkflowContext, define_workflow
from celery_durable.testing import WorkflowTestEnvironment, replay_history
from examples.fulfilment import fulfilment, reserve

HISTORIES = Path(__file__).resolve().parent.parent / "examples" / "histories"


def history(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((HISTORIES / f"{name}.json").read_text(encoding="utf-8"))
    return loaded


@pytest.mark.parametrize("name", ["fulfilment-v1-waiting", "fulfilment-v2-waiting"])
def test_the_example_replays_every_stored_history(name: str) -> None:
    kept = history(name)
    check = replay_history(fulfilment, kept)
    assert (check.run_id, check.workflow, check.status) == (kept["run"]["run_id"], "order-fulfilment", "running")
    assert (check.verdict, check.message) == ("ok", "")


def test_a_fraud_check_added_without_a_patch_would_break_the_waiting_run_of_the_first_version() -> None:
    def unguarded(ctx: WorkflowContext) -> Any:
        ctx.step("reserve", lambda: reserve("A-1"))
        ctx.step("fraud-check", lambda: {"hold": False})
        return ctx.wait_for_signal("approval").payload

    meta = {"name": "order-fulfilment", "description": "Without ctx.patched", "phases": []}
    check = replay_history(define_workflow(meta, unguarded), history("fulfilment-v1-waiting"))
    assert check.verdict == "diverges"
    assert "expected wait_for_signal('approval'), got fraud-check" in check.message
    assert "The workflow's code changed since the run started" in check.message


def test_dropping_the_old_branch_keeps_the_runs_that_took_the_new_one() -> None:
    def deprecated(ctx: WorkflowContext) -> Any:
        ctx.step("reserve", lambda: reserve("B-7"))
        ctx.deprecate_patch("fraud-check")
        ctx.step("fraud-check", lambda: {"hold": False})
        return ctx.wait_for_signal("approval").payload

    meta = {"name": "order-fulfilment", "description": "The old branch dropped", "phases": []}
    assert replay_history(define_workflow(meta, deprecated), history("fulfilment-v2-waiting")).verdict == "ok"
    # ... but not the runs of the first version, which is why deprecate_patch
    # waits until replay-check finds none of them left.
    assert replay_history(define_workflow(meta, deprecated), history("fulfilment-v1-waiting")).verdict == "diverges"


def test_replay_history_ignores_a_production_cluster_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Cluster deployment's CI has CELERY_DURABLE_REDIS_CLUSTER=true in its
    environment; the test environment's private server is one Redis all the
    same (testing/server.private_settings decides for every part of it)."""
    from celery_durable.testing import replay as testing_history

    monkeypatch.setenv("CELERY_DURABLE_REDIS_CLUSTER", "true")
    monkeypatch.setenv("CELERY_DURABLE_BROKER_URL", "redis://127.0.0.1:1/0")  # never used by the environment
    monkeypatch.setattr(testing_history, "_stores", {})  # a store made before the variable was set proves nothing
    assert replay_history(fulfilment, history("fulfilment-v1-waiting")).verdict == "ok"
    monkeypatch.delenv("CELERY_DURABLE_BROKER_URL")
    assert WorkflowTestEnvironment([fulfilment]).settings.redis_cluster is False
