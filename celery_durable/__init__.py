"""Durable, resumable workflows for Python on Celery and Redis.

The public names load on first use (PEP 562): importing a part of the
package runs this file first, and a worker's replay code
(``celery_durable.workflows``) must not pay for Celery, the client and the
web view it never uses -- nor sit in one import circle with them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The errors import nothing: they load with the package, the rest on first use.
from celery_durable.errors import (
    ChildWorkflowFailed,
    CompensationFailed,
    DurableError,
    NonDeterminismError,
    RunNotFoundError,
    ScheduleExistsError,
    ScheduleNotFoundError,
    StaleAttemptError,
    StepFailed,
    StorageCorruptError,
    StorageError,
    StorageUnavailableError,
    ThrottleNotFoundError,
    WorkflowCancelled,
    WorkflowDefinitionError,
    WorkflowLimitReached,
    WorkflowResumeError,
    WorkflowWaitCancelled,
)

if TYPE_CHECKING:
    from celery_durable.agents import (
        AgentRequest,
        AgentResult,
        AgentRunner,
        AgentRunnerError,
        FunctionRunner,
        OpenAIChatRunner,
    )
    from celery_durable.broker.events import RunUpdate, RunWatch
    from celery_durable.client.async_client import AsyncClient
    from celery_durable.client.client import Client
    from celery_durable.client.fleet_registry import WorkerInfo
    from celery_durable.client.history import HistoryEvent, HistoryPage
    from celery_durable.client.versioning import ReplayCheck
    from celery_durable.config import Settings
    from celery_durable.engine import Engine
    from celery_durable.schedules.spec import ScheduleInfo
    from celery_durable.throttles import ThrottleInfo
    from celery_durable.workflows.context import WorkflowContext
    from celery_durable.workflows.definition import Phase, Workflow, define_workflow, workflow
    from celery_durable.workflows.envelope import (
        ChildRow,
        PhaseRow,
        ProgressEntry,
        ProgressPage,
        RunDetail,
        RunEnvelope,
        RunPage,
        StepRow,
        is_terminal_status,
    )
    from celery_durable.workflows.jsonvalue import JSON_NULL
    from celery_durable.workflows.retry import RetryPolicy
    from celery_durable.workflows.saga import Saga
    from celery_durable.workflows.waits import Signal

# The module that defines each public name (its `import` above, for type checkers).
_MODULES = {
    "celery_durable.agents": "AgentRequest AgentResult AgentRunner AgentRunnerError FunctionRunner OpenAIChatRunner",
    "celery_durable.client.async_client": "AsyncClient",
    "celery_durable.broker.events": "RunUpdate RunWatch",
    "celery_durable.client.client": "Client",
    "celery_durable.config": "Settings",
    "celery_durable.engine": "Engine",
    "celery_durable.client.fleet_registry": "WorkerInfo",
    "celery_durable.client.history": "HistoryEvent HistoryPage",
    "celery_durable.schedules.spec": "ScheduleInfo",
    "celery_durable.throttles": "ThrottleInfo",
    "celery_durable.client.versioning": "ReplayCheck",
    "celery_durable.workflows.context": "WorkflowContext",
    "celery_durable.workflows.definition": "Phase Workflow define_workflow workflow",
    "celery_durable.workflows.envelope": (
        "ChildRow PhaseRow ProgressEntry ProgressPage RunDetail RunEnvelope RunPage StepRow "
        "is_terminal_status"
    ),
    "celery_durable.workflows.jsonvalue": "JSON_NULL",
    "celery_durable.workflows.retry": "RetryPolicy",
    "celery_durable.workflows.saga": "Saga",
    "celery_durable.workflows.waits": "Signal",
}
_SOURCES = {name: module for module, names in _MODULES.items() for name in names.split()}

__all__ = [
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
    # agents
    "AgentRequest",
    "AgentResult",
    "AgentRunner",
    "AgentRunnerError",
    "FunctionRunner",
    "OpenAIChatRunner",
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
    "RunDetail",
    "RunEnvelope",
    "RunPage",
    "RunUpdate",
    "ReplayCheck",
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
]


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use, then keep the name here."""
    try:
        source = _SOURCES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
