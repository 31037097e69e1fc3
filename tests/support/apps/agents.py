"""An engine whose agent turns can be held at a gate, for crash tests."""

from __future__ import annotations

import time
from typing import Any

import redis

from celery_durable import Engine, Settings, WorkflowContext, workflow
from celery_durable.agents import AgentRequest, FunctionRunner

settings = Settings()
_redis = redis.Redis.from_url(settings.redis_url, decode_responses=True)


def gated(request: AgentRequest) -> Any:
    """Count the call, then wait at the run's gate if the prompt asks for it."""
    prefix = settings.key_prefix
    _redis.hincrby(f"{prefix}:agent-calls", request.prompt, 1)
    if "hold" in request.prompt:
        _redis.sadd(f"{prefix}:gate:{request.run_id}:reached", request.prompt)
        while not _redis.sismember(f"{prefix}:gate:{request.run_id}:open", request.prompt):
            time.sleep(0.02)
    return f"done: {request.prompt}"


@workflow(name="review", description="Two reviews in parallel, one held at a gate", phases=[])
def review(ctx: WorkflowContext) -> Any:
    return ctx.parallel([lambda: ctx.agent("review cart"), lambda: ctx.agent("review discount, hold")])


engine = Engine(workflows=[review], settings=settings, agent_runner=FunctionRunner(default=gated))
