"""Errors of the agent-runner layer (SPEC §9).

They derive from :class:`celery_durable.errors.DurableError`, so they carry a
stable ``code`` and pickle cleanly: an agent task raises them on a worker and
Celery may carry them back to the caller. Every message is written to be shown
to a user as the ``error`` of a ``failed`` agent row, so none of them may
contain an API key.
"""

from __future__ import annotations

from typing import Any

from celery_durable.errors import DurableError


class AgentRunnerError(DurableError):
    """An agent runner could not produce a result for a request."""

    code = "agent_runner_error"


class AgentOutputError(AgentRunnerError):
    """The model answered, but the answer is unusable (not JSON under a schema, empty, refused).

    The engine feeds this message back to the model on its one schema retry,
    so it says what was wrong with the output rather than with the transport.
    ``usage``: what the answer cost all the same (``AgentResult.usage``), which
    the run's usage and its credit ceiling count.
    """

    code = "agent_output_error"

    def __init__(self, message: str = "", *, usage: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.usage = usage


class AgentEndpointError(AgentRunnerError):
    """The chat-completions endpoint refused the call or could not be reached.

    ``status`` is the last HTTP status (``None`` when no response arrived) and
    ``attempts`` how many requests were sent before giving up.
    """

    code = "agent_endpoint_error"

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts


class AgentTimeoutError(AgentEndpointError):
    """No reply within the runner's timeout.

    Kept apart from other endpoint errors because it is not retried: the
    server may still be generating (and billing) the abandoned completion.
    """

    code = "agent_timeout"
