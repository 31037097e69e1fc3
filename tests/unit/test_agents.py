"""Agent turns through replay: one turn per identical request, the sequence
waits without a worker, and the run's ceilings stop new turns."""

from __future__ import annotations

from typing import Any

from celery_durable import AgentResult, FunctionRunner, Settings, WorkflowContext, define_workflow, workflow
from celery_durable.agents.errors import AgentOutputError
from celery_durable.broker.schema import Identity
from celery_durable.testing import WorkflowTestEnvironment
from celery_durable.workflows import agent_ops, jsonvalue
from tests.unit.harness import Driver


@workflow(name="reviews", description="Asks twice the same, then something else", phases=[])
def reviews(ctx: WorkflowContext) -> Any:
    first = ctx.agent("Review cart.js", label="reviewer")
    again = ctx.agent("Review cart.js", label="reviewer")
    other = ctx.agent("Review discount.js", label="reviewer")
    return [first, again, other]


def test_identical_calls_are_one_turn_and_the_sequence_waits_for_it() -> None:
    driver = Driver.of(reviews)
    assert driver.main() is None  # waits for the turn without holding a worker
    assert [owner for _, owner in driver.turns] == ["m"]
    driver.finish_turns("fine")
    assert driver.main() is None  # the second identical call was a hit; the third is a new turn
    assert len(driver.turns) == 1
    driver.finish_turns("also fine")
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == '["fine","fine","also fine"]'
    assert driver.record().subagents_used == 2


def test_a_turn_past_max_total_subagents_stops_the_run_resumably() -> None:
    driver = Driver.of(reviews, limits={"max_total_subagents": 1})
    driver.main()
    driver.finish_turns("fine")
    settlement = driver.main()
    assert settlement is not None
    assert (settlement.status, settlement.reason, settlement.can_resume) == ("error", "workflow_limit_reached", True)
    assert settlement.error.startswith("Limit reached: max_total_subagents (ceiling 1)")
    assert driver.turns == []


def _six_reviews(ctx: WorkflowContext) -> Any:
    return ctx.parallel([lambda i=i: ctx.agent(f"Review file {i}") for i in range(6)])


def test_turns_a_stopped_attempt_left_queued_are_not_counted_again_when_resumed() -> None:
    """SPEC §6: resume with a higher limit continues the run. The three turns the
    first attempt dispatched (and never ran: the ceiling stopped the run) were
    counted then; dispatched again by the resume they are not counted twice."""
    runs: list[str] = []
    six = define_workflow({"name": "six", "description": "d", "phases": [], "limits": {"max_total_subagents": 3}},
                          _six_reviews)
    env = WorkflowTestEnvironment([six], agent_runner=FunctionRunner(default=lambda r: runs.append(r.prompt) or "ok"))
    stopped = env.run(six)
    assert (stopped.status, stopped.reason) == ("error", "workflow_limit_reached")
    assert stopped.snapshot["subagents_used"] == 3
    resumed = env.resume(stopped.run_id, limits={"max_total_subagents": 6})
    assert (resumed.status, resumed.result) == ("completed", ["ok"] * 6)
    assert resumed.snapshot["subagents_used"] == 6 and sorted(runs) == [f"Review file {i}" for i in range(6)]


def _one_review(ctx: WorkflowContext) -> Any:
    return ctx.agent("Review cart.js", label="reviewer")


ONE = define_workflow({"name": "one-review", "description": "d", "phases": []}, _one_review)


def _broken_factory() -> Any:
    raise RuntimeError("factory exploded")


def test_a_runner_that_cannot_be_made_or_reports_bad_usage_fails_its_turn_not_the_task() -> None:
    """SPEC §9: the call returns None and the row is failed with the error; never a row left running."""
    for runner, error in [
        (FunctionRunner(default=lambda r: AgentResult(output="x", usage=None)), "AgentResult.usage must be a dict"),
        (FunctionRunner(default=lambda r: AgentResult(output="x", usage={"ai_credits": float("nan")})),
         "AgentResult.usage['ai_credits'] must be a finite number >= 0"),
        (None, "The agent runner setting cannot be loaded: RuntimeError: factory exploded"),
    ]:
        settings = Settings(redis_cluster=False, agent_runner=f"{__name__}:_broken_factory") if runner is None else None
        env = WorkflowTestEnvironment([ONE], agent_runner=runner, settings=settings)
        envelope = env.run(ONE)
        assert (envelope.status, envelope.result) == ("completed", None)
        [row] = env.client.get_workflow_run_detail(envelope.run_id).agents
        assert row["status"] == "failed" and row["error"].startswith(error), row["error"]


def _unusable(request: Any) -> Any:
    raise AgentOutputError("Output is not valid JSON", usage={"prompt_tokens": 10, "completion_tokens": 5,
                                                              "ai_credits": 0.5})


def test_answers_the_run_cannot_use_are_counted_in_its_usage_and_credits() -> None:
    """SPEC §6 and §9: an answer that was billed counts, whether or not the run could use it."""
    asks = define_workflow({"name": "asks", "description": "d", "phases": []},
                           lambda ctx: ctx.agent("Review cart.js", schema={"type": "object"}))
    env = WorkflowTestEnvironment([asks], agent_runner=FunctionRunner(default=_unusable))
    envelope = env.run(asks)
    assert (envelope.status, envelope.result) == ("completed", None)  # two tries: the first, and its one retry
    [row] = env.client.get_workflow_run_detail(envelope.run_id).agents
    assert row["status"] == "failed"
    assert row["usage"] == {"prompt_tokens": 20, "completion_tokens": 10, "ai_credits": 1.0}
    assert envelope.snapshot["ai_credits"] == 1.0


def test_identical_calls_with_a_schema_written_in_another_key_order_are_one_turn() -> None:
    """SPEC §4: the same prompt, label, schema and model: a schema is the same whatever order its keys are in."""
    first = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    second = {"required": ["n"], "properties": {"n": {"type": "integer"}}, "type": "object"}
    turns: list[str] = []
    twice = define_workflow({"name": "twice", "description": "d", "phases": []},
                            lambda ctx: [ctx.agent("Count", schema=first), ctx.agent("Count", schema=second)])
    env = WorkflowTestEnvironment([twice], agent_runner=FunctionRunner(default=lambda r: turns.append(r.prompt)
                                                                         or {"n": len(turns)}))
    envelope = env.run(twice)
    assert envelope.result == [{"n": 1}, {"n": 1}] and envelope.snapshot["subagents_used"] == 1


def test_a_turn_journaled_under_the_id_of_the_request_as_written_keeps_it() -> None:
    """Runs in flight across the upgrade that sorted the keys replay: the journal's id is taken where it is theirs."""
    request = {"prompt": "Count", "label": None, "schema": {"type": "object", "properties": {}}, "model": None}
    canonical = agent_ops._agent_id(request, None)
    as_written = agent_ops._hash(jsonvalue.dumps(request))
    assert canonical != as_written
    assert agent_ops._agent_id(request, (Identity.agent(as_written), None)) == as_written
    assert agent_ops._agent_id(request, (Identity.agent(canonical), None)) == canonical
    assert agent_ops._agent_id(request, (Identity.step("other"), None)) == canonical


def test_a_schema_whose_ref_points_nowhere_is_refused_at_the_call() -> None:
    """SPEC §4: ``schema`` is a JSON Schema the result must satisfy. A dangling
    $ref passed the metaschema check; the agent task then died on it every
    time (jsonschema's private referencing error), and the run was taken over
    again and again with an agent row left running, never settling."""
    asked: list[str] = []

    @workflow(name="dangling-ref", description="Asks with a schema whose $ref points nowhere", phases=[])
    def dangling_ref(ctx: WorkflowContext) -> Any:
        try:
            return ctx.agent("Review cart.js", schema={"$ref": "#/$defs/verdict"})
        except ValueError as exc:
            return str(exc)

    env = WorkflowTestEnvironment([dangling_ref], agent_runner=FunctionRunner(default=lambda r: asked.append(r.prompt)))
    envelope = env.run(dangling_ref)
    assert (envelope.status, envelope.result) == (
        "completed",
        "ctx.agent schema has a $ref that does not resolve within it: '#/$defs/verdict'",
    )
    assert asked == [] and env.detail(envelope.run_id).agents == []


def test_a_schema_whose_ref_points_through_a_boolean_schema_is_refused_at_the_call_as_a_value_error() -> None:
    """SPEC §4: as any other schema that cannot be used; referencing's own
    TypeError came out of ctx.agent instead."""

    @workflow(name="ref-through-boolean", description="Asks with a $ref through a boolean schema", phases=[])
    def through_boolean(ctx: WorkflowContext) -> Any:
        try:
            return ctx.agent("Review cart.js", schema={"$defs": {"a": True}, "$ref": "#/$defs/a/b"})
        except ValueError as exc:
            return str(exc)

    env = WorkflowTestEnvironment([through_boolean], agent_runner=FunctionRunner(default=lambda r: None))
    envelope = env.run(through_boolean)
    assert (envelope.status, envelope.result) == (
        "completed",
        "ctx.agent schema has a $ref that does not resolve within it: '#/$defs/a/b'",
    ), envelope.error


def test_a_schema_that_declares_its_draft_is_read_as_that_draft_at_the_call_and_on_the_output() -> None:
    """``args_schema`` honours the draft its ``$schema`` declares; ``ctx.agent``'s
    ``schema`` did not: a draft-07 schema with ``items`` as a list (a tuple's
    items, in that draft) was refused at the call as 2020-12, where that form
    is no schema. One rule now (``json_schemas.validator_for``), at the call and
    in the agent task, which also checks the output by it."""
    pair = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
            "items": [{"type": "string"}, {"type": "integer"}]}
    outputs = iter([["cart.js", "three"], ["cart.js", 3]])

    @workflow(name="draft-07-agent", description="Asks with a draft-07 schema", phases=[])
    def draft_07(ctx: WorkflowContext) -> Any:
        return ctx.agent("Count the issues in cart.js", schema=pair)

    env = WorkflowTestEnvironment([draft_07], agent_runner=FunctionRunner(default=lambda r: next(outputs)))
    envelope = env.run(draft_07)
    assert (envelope.status, envelope.result) == ("completed", ["cart.js", 3]), envelope.error
    assert next(outputs, None) is None, "the first output broke the draft-07 tuple and was asked again"
