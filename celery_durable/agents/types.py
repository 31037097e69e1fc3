"""The runner contract of SPEC §9: what the engine hands a runner and what it gets back.

Both are frozen plain data so a request can be logged, compared and rebuilt on
replay, and a result's ``usage`` is a plain dict the engine journals as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class AgentRequest:
    """One agent turn the workflow asked for with ``ctx.agent``.

    ``schema`` is the JSON Schema the output must satisfy (``None`` for free
    text). ``feedback`` is set only on the engine's one schema retry: it holds
    the validation error of the previous output so the runner can ask the
    model to fix it.
    """

    prompt: str
    label: str | None
    schema: dict[str, Any] | None
    model: str | None
    run_id: str
    agent_id: str
    feedback: str | None = None


@dataclass(frozen=True, slots=True)
class AgentResult:
    """What one agent turn produced.

    ``output`` is text, or a JSON value when the request had a schema.
    ``usage`` holds ``prompt_tokens``, ``completion_tokens`` and
    ``ai_credits``; the engine charges ``ai_credits`` against the run's
    ``max_ai_credits`` limit.
    """

    output: Any
    usage: dict[str, Any]


@runtime_checkable
class AgentRunner(Protocol):
    """Anything with ``run(request) -> AgentResult``.

    ``run`` is called on an agents-queue worker, possibly from several threads
    at once, and may block (network calls); it raises on failure and the
    engine records the error on the agent row.
    """

    def run(self, request: AgentRequest) -> AgentResult: ...


def zero_usage() -> dict[str, Any]:
    """Usage of a turn that spent no tokens: a fresh dict, since callers may mutate it."""
    return {"prompt_tokens": 0, "completion_tokens": 0, "ai_credits": 0.0}
