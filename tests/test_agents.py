"""ctx.agent on a real runner, and the limits of SPEC §6 that hold across the fleet."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from celery_durable import WorkflowContext
from celery_durable.agents import AgentRequest, AgentResult, FunctionRunner
from tests.support.poll import RUN_BOUND, START_BOUND, poll
from tests.support.workflows import wf

OBJECT = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}


class CountingRunner:
    """A fake model: counts calls per prompt, measures peak concurrency, charges credits."""

    def __init__(self, seconds: float = 0.0, credits: float = 0.0) -> None:
        self.seconds = seconds
        self.credits = credits
        self.calls: Counter[str] = Counter()
        self.feedback: list[str | None] = []
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()

    def run(self, request: AgentRequest) -> AgentResult:
        with self._lock:
            self.calls[request.prompt] += 1
            self.feedback.append(request.feedback)
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            time.sleep(self.seconds)
            output: Any = {"ok": True} if request.schema else f"answer to {request.prompt}"
            usage = {"prompt_tokens": 3, "completion_tokens": 2, "ai_credits": self.credits}
            return AgentResult(output=output, usage=usage)
        finally:
            with self._lock:
                self.running -= 1


@pytest.mark.topologies("redis", "cluster")
def test_an_agent_turn_is_journaled_and_identical_calls_are_memoized(durable) -> None:
    runner = CountingRunner(credits=0.01)

    def run(ctx: WorkflowContext) -> Any:
        first = ctx.agent("Review cart.js", label="reviewer", schema=OBJECT)
        again = ctx.agent("Review cart.js", label="reviewer", schema=OBJECT)
        text = ctx.agent("Summarize")
        ctx.step("after", lambda: 1)  # one more pass: the turns replay from the journal
        return {"first": first, "again": again, "text": text}

    d = durable([wf("memo", run)], agent_runner=runner)
    envelope = d.client.run_workflow("memo", timeout=30)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == {"first": {"ok": True}, "again": {"ok": True}, "text": "answer to Summarize"}
    assert runner.calls == Counter({"Review cart.js": 1, "Summarize": 1})
    assert envelope.snapshot["agents_done"] == 2
    assert envelope.snapshot["subagents_used"] == 2
    assert envelope.snapshot["ai_credits"] == 0.02
    rows = d.client.get_workflow_run_detail(envelope.run_id).agents
    assert [(r["label"], r["status"]) for r in rows] == [("reviewer", "completed"), (None, "completed")]
    assert all(r["usage"]["prompt_tokens"] == 3 and r["started_at"] and r["completed_at"] for r in rows)


@pytest.mark.topologies("redis", "rabbitmq")
def test_sixty_four_agents_never_exceed_a_ceiling_of_four(durable) -> None:
    # Long enough that four turns overlap even on a loaded machine: the test
    # checks the ceiling is reached, not only that it holds.
    runner = CountingRunner(seconds=0.25)

    def run(ctx: WorkflowContext) -> Any:
        return ctx.parallel([lambda i=i: ctx.agent(f"item {i}") for i in range(64)])

    d = durable([wf("fan64", run, limits={"max_concurrent_subagents": 4})], concurrency=16, agent_runner=runner)
    envelope = d.client.run_workflow("fan64", timeout=120)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [f"answer to item {i}" for i in range(64)]
    assert sum(runner.calls.values()) == 64
    assert runner.peak == 4, runner.peak
    assert envelope.snapshot["agents_running"] == 0


def test_an_output_that_breaks_the_schema_is_retried_once_with_the_error_fed_back(durable) -> None:
    seen: list[str | None] = []

    def flaky(request: AgentRequest) -> Any:
        seen.append(request.feedback)
        return {"ok": "yes"} if request.feedback is None else {"ok": True}

    def always_wrong(request: AgentRequest) -> Any:
        return {"ok": "no"}

    def run(ctx: WorkflowContext) -> Any:
        return [ctx.agent("fixed on retry", label="flaky", schema=OBJECT),
                ctx.agent("never right", label="wrong", schema=OBJECT)]

    runner = FunctionRunner(routes={"flaky": flaky, "wrong": always_wrong})
    d = durable([wf("schema", run)], agent_runner=runner)
    envelope = d.client.run_workflow("schema", timeout=30)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [{"ok": True}, None]
    assert seen[0] is None and seen[1] is not None and "'yes' is not of type 'boolean'" in seen[1]
    rows = {r["label"]: r for r in d.client.get_workflow_run_detail(envelope.run_id).agents}
    assert rows["flaky"]["status"] == "completed"
    assert rows["wrong"]["status"] == "failed"
    assert "still violates the schema" in rows["wrong"]["error"]


def test_a_runner_error_returns_none_and_leaves_a_failed_row(durable) -> None:
    def broken(request: AgentRequest) -> Any:
        raise ConnectionError("model endpoint down")

    d = durable([wf("broken", lambda ctx: {"got": ctx.agent("hello")})], agent_runner=FunctionRunner(default=broken))
    envelope = d.client.run_workflow("broken", timeout=30)
    assert envelope.status == "completed"
    assert envelope.result == {"got": None}
    (row,) = d.client.get_workflow_run_detail(envelope.run_id).agents
    assert row["status"] == "failed"
    assert row["error"] == "ConnectionError: model endpoint down"


def sequential_agents(count: int) -> Any:
    def run(ctx: WorkflowContext) -> Any:
        return [ctx.agent(f"turn {i}") for i in range(count)]

    return run


def test_max_total_subagents_stops_the_run_and_a_raised_limit_resumes_it(durable) -> None:
    runner = CountingRunner()
    d = durable([wf("total", sequential_agents(5), limits={"max_total_subagents": 3})], agent_runner=runner)
    stopped = d.client.run_workflow("total", timeout=30)
    assert (stopped.status, stopped.reason, stopped.can_resume) == ("error", "workflow_limit_reached", True)
    assert "max_total_subagents" in stopped.error
    assert sum(runner.calls.values()) == 3
    resumed = d.client.resume_workflow(stopped.run_id, limits={"max_total_subagents": None}, timeout=30)
    assert resumed.status == "completed", resumed.error
    assert len(resumed.result) == 5
    assert sum(runner.calls.values()) == 5, "journaled turns are not run again"


def test_max_ai_credits_is_absolute_across_resumes(durable) -> None:
    runner = CountingRunner(credits=0.01)
    d = durable([wf("credits", sequential_agents(6), limits={"max_ai_credits": 0.025})], agent_runner=runner)
    stopped = d.client.run_workflow("credits", timeout=30)
    assert (stopped.status, stopped.reason) == ("error", "workflow_limit_reached")
    assert "max_ai_credits" in stopped.error
    assert sum(runner.calls.values()) == 3  # the third turn crossed the ceiling
    again = d.client.resume_workflow(stopped.run_id, limits={"max_ai_credits": 0.04}, timeout=30)
    assert again.reason == "workflow_limit_reached"  # 0.03 spent counts: one more turn, then 0.04 is crossed
    assert sum(runner.calls.values()) == 5
    done = d.client.resume_workflow(stopped.run_id, limits={"max_ai_credits": None}, timeout=30)
    assert done.status == "completed", done.error
    assert sum(runner.calls.values()) == 6
    assert done.snapshot["ai_credits"] == 0.06


def test_timeout_seconds_counts_active_time_and_resume_can_clear_it(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        ctx.step("slow", lambda: time.sleep(1.2) or 1)
        return ctx.step("after", lambda: 2)

    d = durable([wf("timeout", run, limits={"timeout_seconds": 0.5})])
    stopped = d.client.run_workflow("timeout", timeout=30)
    assert (stopped.status, stopped.reason) == ("error", "workflow_limit_reached")
    assert "timeout_seconds" in stopped.error
    resumed = d.client.resume_workflow(stopped.run_id, limits={"timeout_seconds": None}, timeout=30)
    assert resumed.status == "completed", resumed.error
    assert resumed.result == 2


@pytest.mark.topologies("redis", "cluster", "rabbitmq")
def test_pause_lets_work_in_flight_finish_and_resume_continues(durable) -> None:
    release = threading.Event()
    calls: Counter[str] = Counter()

    def step(name: str, block: bool = False) -> Any:
        def produce() -> str:
            calls[name] += 1
            if block:
                release.wait(20)
            return name

        return produce

    def run(ctx: WorkflowContext) -> Any:
        return [ctx.step("a", step("a")), ctx.step("b", step("b", block=True)), ctx.step("c", step("c"))]

    d = durable([wf("pause", run)])
    run_id = d.client.start_workflow("pause")
    poll(lambda: calls["b"], within=RUN_BOUND, what="step b to start")
    waiter = threading.Thread(target=lambda: time.sleep(0.3) or release.set())
    waiter.start()
    paused = d.client.pause_workflow_run(run_id, timeout=20)
    waiter.join()
    assert (paused.status, paused.can_resume) == ("paused", True)
    assert calls == Counter({"a": 1, "b": 1}), "b finished and was journaled; c was not started"
    assert paused.snapshot["steps_done"] == 2
    resumed = d.client.resume_workflow(run_id, timeout=20)
    assert resumed.status == "completed"
    assert resumed.result == ["a", "b", "c"]
    assert calls == Counter({"a": 1, "b": 1, "c": 1})


@pytest.mark.topologies("redis", "rabbitmq")
def test_an_agent_in_flight_when_its_worker_is_killed_is_interrupted_and_the_run_recovers(
    settings, fleet, raw_redis
) -> None:
    from celery_durable import Engine
    from tests.support.apps.agents import review

    prefix = settings.key_prefix
    worker = fleet.start("tests.support.apps.agents:engine", concurrency=4)
    client = Engine([review], settings).client()
    run_id = client.start_workflow("review")
    poll(
        lambda: raw_redis.sismember(f"{prefix}:gate:{run_id}:reached", "review discount, hold"),
        within=START_BOUND,
        what="the held turn to start",
    )
    assert client.get_workflow_run(run_id).snapshot["agents_running"] >= 1
    # The other turn may have returned without being journaled yet; killed
    # then, it would run again (at least once), and this test is about the
    # journaled one not running again.
    poll(
        lambda: client.get_workflow_run(run_id).snapshot["agents_done"] >= 1,
        within=RUN_BOUND,
        what="the free turn to be journaled",
    )
    worker.kill()
    raw_redis.sadd(f"{prefix}:gate:{run_id}:open", "review discount, hold")
    fleet.start("tests.support.apps.agents:engine", concurrency=4, name="w2")

    envelope = client.wait_for_workflow_run(run_id, timeout=60)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == ["done: review cart", "done: review discount, hold"]
    assert envelope.snapshot["agents_running"] == 0, "the dead worker's slot was released"
    rows = client.get_workflow_run_detail(run_id).agents
    statuses = sorted((row["attempt"], row["status"]) for row in rows)
    assert (1, "interrupted") in statuses
    assert statuses.count((2, "completed")) >= 1
    assert "running" not in {row["status"] for row in rows}
    calls = raw_redis.hgetall(f"{prefix}:agent-calls")
    assert calls == {"review cart": "1", "review discount, hold": "2"}, "the finished turn was not run again"
