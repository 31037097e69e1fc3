"""A runner that routes agent calls to plain Python callables (SPEC §9).

Tools, rule engines and test fakes do not need a model: ``FunctionRunner``
lets a workflow's ``ctx.agent`` calls be answered by functions, chosen by the
call's ``label``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery_durable.agents.errors import AgentRunnerError
from celery_durable.agents.types import AgentRequest, AgentResult, zero_usage

AgentFunction = Callable[[AgentRequest], Any]
"""``fn(request) -> output | AgentResult``."""


class FunctionRunner:
    """Routes each request by ``request.label`` to a callable, else to ``default``.

    A callable returns either a plain output (text, or a JSON value when the
    request has a schema), which is reported as spending no tokens, or an
    :class:`AgentResult` that is passed through unchanged, for fakes that
    want to exercise the engine's credit limits. Exceptions a callable raises
    propagate as they are: the engine records them on the failed agent row,
    and wrapping them would hide their type.
    """

    def __init__(
        self,
        routes: Mapping[str, AgentFunction] | None = None,
        default: AgentFunction | None = None,
    ) -> None:
        # Copied so that later changes to the caller's mapping cannot reroute
        # calls of a running worker behind its back.
        self.routes: dict[str, AgentFunction] = dict(routes or {})
        self.default = default
        for label, fn in self.routes.items():
            if not callable(fn):
                raise TypeError(f"FunctionRunner route {label!r} is not callable")
        if default is not None and not callable(default):
            raise TypeError("FunctionRunner default is not callable")

    def run(self, request: AgentRequest) -> AgentResult:
        fn = self._route(request.label)
        output = fn(request)
        if isinstance(output, AgentResult):
            return output
        return AgentResult(output=output, usage=zero_usage())

    def _route(self, label: str | None) -> AgentFunction:
        if label is not None and label in self.routes:
            return self.routes[label]
        if self.default is not None:
            return self.default
        known = ", ".join(repr(name) for name in sorted(self.routes)) or "none"
        if label is None:
            raise AgentRunnerError(f"FunctionRunner has no default for an agent call without a label (routes: {known})")
        raise AgentRunnerError(f"FunctionRunner has no route for label {label!r} and no default (routes: {known})")

    def __repr__(self) -> str:
        return f"FunctionRunner(routes={sorted(self.routes)!r}, default={self.default!r})"
