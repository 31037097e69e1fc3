"""Agent turns through replay: one turn per identical request, the sequence
waits without a worker, and the run's ceilings stop new turns."""

from __future__ import annotations

from typing import Any

from celery_durable import WorkflowContext, workflow
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
