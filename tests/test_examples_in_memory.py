"""``examples/code_review.py`` tested as a user tests their own workflow:
in-process with the pytest plugin's ``durable_env`` (``celery_durable.testing``):
no worker, and no service started beforehand.

The example's promise is the seed's experiment: each file's review is
journaled before the next one starts, so a run killed during the second
review resumes without paying for the first again.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from celery_durable import AgentRequest, FunctionRunner, Workflow
from celery_durable.testing import WorkflowTestEnvironment
from examples.code_review import code_review, rule_reviewer


class CountingReviewer:
    """The example's rule reviewer, counting the turns each file cost."""

    def __init__(self) -> None:
        self.turns: Counter[str] = Counter()

    def __call__(self, request: AgentRequest) -> Any:
        review = rule_reviewer(request)
        self.turns[review["file"]] += 1
        return review


@pytest.fixture
def reviewer() -> CountingReviewer:
    return CountingReviewer()


@pytest.fixture
def durable_workflows() -> list[Workflow]:
    return [code_review]


@pytest.fixture
def durable_env_options(reviewer: CountingReviewer) -> dict[str, Any]:
    return {"agent_runner": FunctionRunner(routes={"reviewer": reviewer})}


def test_the_review_finds_both_seeded_bugs(durable_env: WorkflowTestEnvironment) -> None:
    envelope = durable_env.run(code_review)
    assert envelope.status == "completed"
    assert (envelope.result["files"], envelope.result["reviewed"], envelope.result["bugs"]) == (2, 2, 2)
    assert [(f["file"], f["line"]) for f in envelope.result["findings"]] == [("cart.js", 3), ("discount.js", 3)]
    detail = durable_env.detail(envelope.run_id)
    assert [phase.state for phase in detail.phases] == ["done", "done"]
    assert [row["status"] for row in detail.agents] == ["completed", "completed"]


def test_a_run_killed_during_the_second_review_does_not_pay_for_the_first_again(
    durable_env: WorkflowTestEnvironment, reviewer: CountingReviewer
) -> None:
    durable_env.crash_after("read:discount.js")  # the first review is journaled; the second has not run
    crashed = durable_env.run(code_review)
    assert crashed.status == "running"
    assert reviewer.turns == Counter({"cart.js": 1})
    resumed = durable_env.resume(crashed.run_id)
    assert (resumed.status, resumed.attempt, resumed.result["bugs"]) == ("completed", 2, 2)
    assert reviewer.turns == Counter({"cart.js": 1, "discount.js": 1})
    assert resumed.snapshot["subagents_used"] == 2


def test_a_failed_review_is_reported_and_the_summary_goes_on() -> None:
    def flaky(request: AgentRequest) -> Any:
        if "discount.js" in request.prompt:
            raise TimeoutError("the model did not answer")
        return rule_reviewer(request)

    flaky_env = WorkflowTestEnvironment([code_review], agent_runner=FunctionRunner(routes={"reviewer": flaky}))
    envelope = flaky_env.run(code_review)
    assert (envelope.status, envelope.result["reviewed"], envelope.result["bugs"]) == ("completed", 1, 1)
    logs = [record.message for record in flaky_env.progress(envelope.run_id).records if record.kind == "log"]
    assert "discount.js: the review failed; its agent row says why" in logs
    errors = [row["error"] for row in flaky_env.detail(envelope.run_id).agents if row["status"] == "failed"]
    assert errors == ["TimeoutError: the model did not answer"]


def test_an_answer_that_breaks_the_schema_is_retried_once_with_the_error() -> None:
    feedback: list[str | None] = []

    def sloppy(request: AgentRequest) -> Any:
        feedback.append(request.feedback)
        review = rule_reviewer(request)
        if request.feedback is None:
            review["findings"] = [{"line": "three", "severity": "bug", "message": "?"}]
        return review

    sloppy_env = WorkflowTestEnvironment([code_review], agent_runner=FunctionRunner(routes={"reviewer": sloppy}))
    envelope = sloppy_env.run(code_review, args={"files": ["cart.js"]})
    assert envelope.result["bugs"] == 1
    assert feedback[0] is None and "is not of type 'integer'" in str(feedback[1]) and len(feedback) == 2


def test_arguments_are_checked_against_the_args_schema_before_a_run_exists(
    durable_env: WorkflowTestEnvironment,
) -> None:
    with pytest.raises(ValueError, match=r"args_schema at \$\['files'\]"):
        durable_env.start(code_review, args={"files": []})
