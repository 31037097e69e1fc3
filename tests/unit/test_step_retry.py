"""``ctx.step(..., retry=RetryPolicy(...))`` (SPEC §4): a bad policy is refused
where it is written, naming the problem, and never turns a producer's failure
into something other than ``StepFailed``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from celery_durable import RetryPolicy, StepFailed, WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment

tries: Counter[str] = Counter()


def flaky() -> str:
    tries["flaky"] += 1
    if tries["flaky"] < 3:
        raise KeyError("not yet")
    return "done"


@workflow(name="retrying", description="A flaky step, retried as its args say", phases=[])
def retrying(ctx: WorkflowContext) -> Any:
    policies: dict[str, Callable[[], Any]] = {
        "int": lambda: 3,
        "one-class": lambda: RetryPolicy(retry_on=KeyError, initial_interval=0),
        "union": lambda: RetryPolicy(retry_on=KeyError | OSError, initial_interval=0),  # type: ignore[arg-type]
    }
    try:
        return ctx.step("flaky", flaky, retry=policies[ctx.args["policy"]]())
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc)}


@pytest.fixture
def env() -> WorkflowTestEnvironment:
    tries.clear()
    return WorkflowTestEnvironment([retrying])


def test_a_retry_that_is_not_a_policy_is_refused_before_the_step_runs(env: WorkflowTestEnvironment) -> None:
    """It was accepted; the producer's first failure then reached the workflow
    as an AttributeError ('int' object has no attribute 'delay_after'), not
    StepFailed, and left the step's row interrupted in a completed run."""
    envelope = env.run(retrying, args={"policy": "int"})
    message = "Step 'flaky' retry must be a RetryPolicy or None, got int"
    assert envelope.result == {"type": "ValueError", "message": message}
    assert tries["flaky"] == 0
    assert env.detail(envelope.run_id).steps == []


@pytest.mark.parametrize("policy", ["one-class", "union"])
def test_a_policy_retrying_exception_classes_as_isinstance_takes_them_retries_them(
    env: WorkflowTestEnvironment, policy: str
) -> None:
    """One class, or a union of classes (KeyError | OSError): isinstance
    takes both, and both always retried; the check refused the union."""
    envelope = env.run(retrying, args={"policy": policy})
    assert (envelope.status, envelope.result, tries["flaky"]) == ("completed", "done", 3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retry_on": ("KeyError",)}, "RetryPolicy.retry_on must be a tuple of exception classes, got ('KeyError',)"),
        ({"retry_on": [KeyError]}, "RetryPolicy.retry_on must be a tuple of exception classes"),
        ({"backoff_coefficient": "2"}, "RetryPolicy.backoff_coefficient must be a finite number >= 1, got '2'"),
        ({"max_interval": True}, "RetryPolicy.max_interval must be a finite number >= 0, got True"),
    ],
    ids=["names", "list", "text-coefficient", "bool-interval"],
)
def test_a_bad_policy_is_refused_where_it_is_built(options: dict[str, Any], message: str) -> None:
    """A retry_on of names failed only when a step failed, with a TypeError
    from isinstance in place of the step's StepFailed; a text coefficient
    was a TypeError from math.isfinite."""
    with pytest.raises(ValueError) as raised:
        RetryPolicy(**options)
    assert str(raised.value).startswith(message)


def test_a_failing_step_under_a_policy_is_still_step_failed(env: WorkflowTestEnvironment) -> None:
    @workflow(name="gives-up", description="Retries twice, then fails", phases=[])
    def gives_up(ctx: WorkflowContext) -> Any:
        try:
            return ctx.step("never", lambda: {}["missing"], retry=RetryPolicy(max_attempts=2, initial_interval=0))
        except StepFailed as failed:
            return [failed.key, failed.error_type]

    assert WorkflowTestEnvironment([gives_up]).run(gives_up).result == ["never", "KeyError"]
