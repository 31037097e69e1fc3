"""Durable, resumable workflows for Python on Celery and Redis."""

from celery_durable.agents import (
    AgentRequest,
    AgentResult,
    AgentRunner,
    AgentRunnerError,
    FunctionRunner,
    OpenAIChatRunner,
)
from celery_durable.async_client import AsyncClient
from celery_durable.broker.events import RunUpdate, RunWatch
from celery_durable.client import Client
from celery_durable.config import Settings
from celery_durable.engine import Engine
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
from celery_durable.fleet_registry import WorkerInfo
from celery_durable.history import HistoryEvent, HistoryPage
from celery_durable.schedules.spec import ScheduleInfo
from celery_durable.throttles import ThrottleInfo
from celery_durable.versioning import ReplayCheck
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
