"""``examples/rate_limited_agents.py`` as its user would test it: the
fan-out completes under the throttle, which holds nothing afterwards, and
no customer ever had two turns at once."""

from __future__ import annotations

from celery_durable import FunctionRunner
from celery_durable.testing import WorkflowTestEnvironment
from examples.rate_limited_agents import LLM, TICKETS, ensure_throttle, summarize, summarize_tickets


def test_the_fan_out_completes_under_the_fleet_wide_limit() -> None:
    env = WorkflowTestEnvironment([summarize_tickets], agent_runner=FunctionRunner(default=summarize))
    ensure_throttle(env.client)
    done = env.run(summarize_tickets)
    assert done.status == "completed", done.error
    assert done.result["tickets"] == len(TICKETS)
    assert [s["kind"] for s in done.result["summaries"]] == ["bug", "bug", "feature", "bug"]
    info = env.client.get_throttle(LLM)
    assert (info.holding, info.waiting, info.per_key_concurrency) == (0, 0, 1)
