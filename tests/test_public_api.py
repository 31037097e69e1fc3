"""SPEC §1: everything public is importable from ``celery_durable`` itself."""

from __future__ import annotations

import importlib

import pytest

import celery_durable

PUBLIC_NAMES = {
    # agents
    "AgentRequest",
    "AgentResult",
    "AgentRunner",
    "AgentRunnerError",
    "FunctionRunner",
    "OpenAIChatRunner",
    # defining workflows
    "JSON_NULL",
    "Phase",
    "RetryPolicy",
    "Saga",
    "Signal",
    "Workflow",
    "WorkflowContext",
    "define_workflow",
    "workflow",
    # running them
    "AsyncClient",
    "Client",
    "Engine",
    "Settings",
    # what clients see
    "ChildRow",
    "HistoryEvent",
    "HistoryPage",
    "PhaseRow",
    "ProgressEntry",
    "ProgressPage",
    "ReplayCheck",
    "RunDetail",
    "RunEnvelope",
    "RunPage",
    "RunUpdate",
    "RunWatch",
    "ScheduleInfo",
    "StepRow",
    "WorkerInfo",
    "ThrottleInfo",
    "is_terminal_status",
    # errors
    "ChildWorkflowFailed",
    "CompensationFailed",
    "DurableError",
    "NonDeterminismError",
    "RunNotFoundError",
    "ScheduleExistsError",
    "ScheduleNotFoundError",
    "StaleAttemptError",
    "StepFailed",
    "StorageCorruptError",
    "StorageError",
    "StorageUnavailableError",
    "ThrottleNotFoundError",
    "WorkflowCancelled",
    "WorkflowDefinitionError",
    "WorkflowLimitReached",
    "WorkflowResumeError",
    "WorkflowWaitCancelled",
}


def test_all_is_pinned() -> None:
    assert set(celery_durable.__all__) == PUBLIC_NAMES


def test_all_has_no_duplicates() -> None:
    assert len(celery_durable.__all__) == len(set(celery_durable.__all__))


@pytest.mark.parametrize("name", sorted(PUBLIC_NAMES))
def test_each_public_name_is_importable(name: str) -> None:
    module = importlib.import_module("celery_durable")
    assert getattr(module, name) is not None
    namespace: dict[str, object] = {}
    exec(f"from celery_durable import {name}", namespace)
    assert namespace[name] is getattr(celery_durable, name)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from celery_durable import *", namespace)
    assert set(namespace) - {"__builtins__"} == PUBLIC_NAMES
