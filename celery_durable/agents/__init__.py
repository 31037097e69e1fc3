"""Agent runners: what answers ``ctx.agent`` calls (SPEC §9).

The engine hands each agent turn to an :class:`AgentRunner` as an
:class:`AgentRequest` and journals the :class:`AgentResult`. Two runners are
built in: :class:`FunctionRunner` (Python callables routed by label) and
:class:`OpenAIChatRunner` (any OpenAI-compatible chat-completions endpoint).
:func:`load_runner` resolves the ``agent_runner`` setting.
"""

from celery_durable.agents.errors import AgentEndpointError, AgentOutputError, AgentRunnerError, AgentTimeoutError
from celery_durable.agents.function import FunctionRunner
from celery_durable.agents.loading import load_runner
from celery_durable.agents.openai_chat import OpenAIChatRunner, openai_runner
from celery_durable.agents.types import AgentRequest, AgentResult, AgentRunner

__all__ = [
    # contract
    "AgentRequest",
    "AgentResult",
    "AgentRunner",
    # runners
    "FunctionRunner",
    "OpenAIChatRunner",
    "openai_runner",
    "load_runner",
    # errors
    "AgentRunnerError",
    "AgentOutputError",
    "AgentEndpointError",
    "AgentTimeoutError",
]
