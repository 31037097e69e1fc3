"""The exception tree, SPEC §12: one base, stable codes, clean pickling."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from celery_durable import errors
from celery_durable.errors import (
    FATAL_ERRORS,
    RESUME_ERROR_CODES,
    ChildWorkflowFailed,
    CompensationFailed,
    DurableError,
    NonDeterminismError,
    RunNotFoundError,
    StaleAttemptError,
    StepFailed,
    StorageCorruptError,
    StorageUnavailableError,
    WorkflowCancelled,
    WorkflowDefinitionError,
    WorkflowResumeError,
    WorkflowWaitCancelled,
)

SPEC_RESUME_CODES = [
    "not_found",
    "non_resumable",
    "already_active",
    "workflow_code_changed",
    "workflow_limits_invalid",
    "workflow_storage_unavailable",
    "workflow_storage_corrupt",
]

MODULE_ERRORS = sorted(
    (
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    ),
    key=lambda cls: cls.__name__,
)


def test_the_module_defines_the_spec_errors() -> None:
    assert {cls.__name__ for cls in MODULE_ERRORS} >= {
        "DurableError",
        "WorkflowDefinitionError",
        "WorkflowResumeError",
        "RunNotFoundError",
        "WorkflowWaitCancelled",
        "WorkflowCancelled",
        "StepFailed",
        "NonDeterminismError",
        "StorageUnavailableError",
        "StorageCorruptError",
    }


@pytest.mark.parametrize("cls", MODULE_ERRORS, ids=lambda cls: cls.__name__)
def test_every_error_derives_from_durable_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, DurableError)
    assert issubclass(cls, Exception)


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (StorageUnavailableError, "workflow_storage_unavailable"),
        (StorageCorruptError, "workflow_storage_corrupt"),
        (RunNotFoundError, "not_found"),
    ],
)
def test_spec_codes(cls: type[DurableError], code: str) -> None:
    assert cls.code == code
    assert cls("message").code == code


def test_class_codes_are_distinct_strings() -> None:
    # The base and StorageError are parents to catch, not errors raised as such.
    coded = [cls for cls in MODULE_ERRORS if cls not in (DurableError, WorkflowResumeError, errors.StorageError)]
    codes = [cls.code for cls in coded]  # type: ignore[attr-defined]
    assert all(isinstance(code, str) and code for code in codes)
    # "not_found" is the one code SPEC §12 gives a family: a run's and a schedule's (the LookupErrors).
    distinct = [cls.code for cls in coded if not issubclass(cls, LookupError)]  # type: ignore[attr-defined]
    assert len(set(distinct)) == len(distinct)
    assert {cls.code for cls in coded if issubclass(cls, LookupError)} == {"not_found"}  # type: ignore[attr-defined]


def test_base_has_no_code_unless_given_one() -> None:
    assert DurableError("x").code is None
    assert DurableError("x", code="custom").code == "custom"
    assert DurableError.code is None


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [(WorkflowDefinitionError, ValueError), (RunNotFoundError, LookupError)],
)
def test_errors_that_are_also_builtin_errors(cls: type[DurableError], builtin: type[Exception]) -> None:
    assert issubclass(cls, builtin)
    with pytest.raises(builtin):
        raise cls("boom")
    with pytest.raises(DurableError):
        raise cls("boom")


# --- WorkflowResumeError ---------------------------------------------------------------------


def test_resume_codes_are_the_spec_codes() -> None:
    assert set(SPEC_RESUME_CODES) == RESUME_ERROR_CODES


@pytest.mark.parametrize("code", SPEC_RESUME_CODES)
def test_resume_error_carries_its_code(code: str) -> None:
    error = WorkflowResumeError(f"cannot resume: {code}", code=code)
    assert error.code == code
    assert str(error) == f"cannot resume: {code}"


@pytest.mark.parametrize("code", ["", "bogus", "NOT_FOUND", "workflow_limit_reached"])
def test_resume_error_refuses_an_unknown_code(code: str) -> None:
    with pytest.raises(ValueError, match="Unknown resume error code"):
        WorkflowResumeError("x", code=code)


def test_resume_error_requires_a_code() -> None:
    with pytest.raises(TypeError):
        WorkflowResumeError("x")  # type: ignore[call-arg]


def test_resume_error_can_be_built_from_its_code_alone_as_the_spec_writes_it() -> None:
    error = WorkflowResumeError(code="not_found")
    assert (error.code, str(error)) == ("not_found", "Run cannot be resumed: not_found")
    assert pickle.loads(pickle.dumps(error)).code == "not_found"


# --- StepFailed ------------------------------------------------------------------------------


def test_step_failed_carries_key_type_and_original_message() -> None:
    error = StepFailed("fetch-users", "KeyError", "'id'")
    assert (error.key, error.error_type, error.message) == ("fetch-users", "KeyError", "'id'")
    assert error.error_message == error.message
    assert error.code == "step_failed"
    assert str(error) == "Step 'fetch-users' failed: KeyError: 'id'"
    found = StepFailed("k", "TypeError", "Step result must be a JSON value: k", found_by_engine=True)
    assert found.message == str(found) == "Step result must be a JSON value: k"


# --- pickling (Celery moves exceptions between processes) ------------------------------------

PICKLED: list[tuple[DurableError, dict[str, Any]]] = [
    (DurableError("boom"), {"code": None}),
    (DurableError("boom", code="custom"), {"code": "custom"}),
    (DurableError(), {"code": None}),
    (WorkflowDefinitionError("Duplicate workflow name x"), {"code": "workflow_definition_invalid"}),
    (RunNotFoundError("Run r-1 not found"), {"code": "not_found"}),
    (WorkflowWaitCancelled("wait cancelled"), {}),
    (WorkflowCancelled("run cancelled"), {}),
    (NonDeterminismError("expected step:a, got step:b"), {"code": "nondeterminism"}),
    (StorageUnavailableError("redis down"), {"code": "workflow_storage_unavailable"}),
    (StorageCorruptError("bad record"), {"code": "workflow_storage_corrupt"}),
    (StaleAttemptError("epoch 2 < 3"), {}),
    (
        StepFailed("fetch-users", "KeyError", "'id'"),
        {"key": "fetch-users", "error_type": "KeyError", "error_message": "'id'", "code": "step_failed"},
    ),
    (
        ChildWorkflowFailed("hotel", "ab" * 16, "error", "exception", "Child run ... ended error: boom"),
        {
            "key": "hotel", "error_type": "ChildWorkflowFailed", "child_run_id": "ab" * 16, "child_status": "error",
            "child_reason": "exception", "code": "child_workflow_failed",
        },
    ),
    (
        CompensationFailed([{"key": "cancel-car", "error_type": "KeyError", "message": "'ref'"}]),
        {
            "key": "cancel-car", "error_type": "CompensationFailed", "code": "compensation_failed",
            "failures": [{"key": "cancel-car", "error_type": "KeyError", "message": "'ref'"}],
        },
    ),
    *((WorkflowResumeError(f"resume refused: {code}", code=code), {"code": code}) for code in SPEC_RESUME_CODES),
]


@pytest.mark.parametrize("error", [ChildWorkflowFailed("k", "r", "cancelled", None, "m"), CompensationFailed([])])
def test_child_and_compensation_failures_are_step_failures(error: StepFailed) -> None:
    assert isinstance(error, StepFailed) and isinstance(error, DurableError)
    assert error.error_type == type(error).__name__


@pytest.mark.parametrize(("error", "fields"), PICKLED, ids=[f"{type(e).__name__}-{e}" for e, _ in PICKLED])
@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_errors_survive_pickle(error: DurableError, fields: dict[str, Any], protocol: int) -> None:
    copy = pickle.loads(pickle.dumps(error, protocol=protocol))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.message == error.message
    assert copy.args == error.args
    assert copy.code == error.code
    for name, value in fields.items():
        assert getattr(copy, name) == value


def test_a_pickled_error_is_still_caught_as_its_builtin_base() -> None:
    copy = pickle.loads(pickle.dumps(RunNotFoundError("Run r-1 not found")))
    with pytest.raises(LookupError, match="r-1"):
        raise copy


def test_a_pickled_error_keeps_extra_attributes() -> None:
    error = StorageUnavailableError("redis down")
    error.run_id = "r-1"  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(error)).run_id == "r-1"


# --- which errors abort a whole parallel/pipeline --------------------------------------------


@pytest.mark.parametrize(
    "cls", [WorkflowCancelled, StorageUnavailableError, StorageCorruptError, StaleAttemptError, NonDeterminismError]
)
def test_fatal_errors(cls: type[DurableError]) -> None:
    assert issubclass(cls, FATAL_ERRORS)


@pytest.mark.parametrize("cls", [StepFailed, WorkflowDefinitionError])
def test_ordinary_errors_are_not_fatal(cls: type[DurableError]) -> None:
    assert not issubclass(cls, FATAL_ERRORS)


def test_storage_errors_share_one_parent_callers_can_catch() -> None:
    for cls in (StorageUnavailableError, StorageCorruptError):
        assert issubclass(cls, errors.StorageError)
    assert errors.StorageError.code is None


def test_a_fatal_error_is_rebuilt_from_its_code_not_its_class_name() -> None:
    limit = errors.fatal_from_code("workflow_limit_reached", "Run reached its limit max_ai_credits", "max_ai_credits")
    assert isinstance(limit, errors.WorkflowLimitReached) and limit.limit == "max_ai_credits"
    assert isinstance(errors.fatal_from_code("cancelled", "gone"), errors.WorkflowCancelled)
    unknown = errors.fatal_from_code("RenamedError", "boom")
    assert isinstance(unknown, StorageCorruptError)
    assert "unknown kind" in str(unknown)


def test_a_step_failure_found_by_the_engine_is_its_own_message() -> None:
    error = StepFailed("k", "TypeError", "Step result must be a JSON value: k", found_by_engine=True)
    assert str(error) == error.message == "Step result must be a JSON value: k"
    assert pickle.loads(pickle.dumps(error)).found_by_engine
