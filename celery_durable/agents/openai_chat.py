"""A runner for any OpenAI-compatible chat-completions endpoint (SPEC §9).

One runner covers OpenAI, Azure OpenAI, vLLM, Ollama and LiteLLM, because
they all speak ``POST /v1/chat/completions``. The ``openai`` package does the
HTTP and the retries: ``max_retries`` more requests after a 429, a 5xx or a
failed connection, with exponential backoff and jitter, honouring the
server's ``Retry-After`` (and stopping at once when the server asks for a
longer pause than the SDK will wait). A timeout is the one failure not
retried (see ``_http.py``). The error a user finally sees says what failed,
the last status and how many requests were made: the SDK numbers each
request in its ``x-stainless-retry-count`` header.

``openai`` is imported when a runner is built, not when this module is:
importing it takes about as long as importing the rest of celery-durable, and
most processes (clients, step workers, runs with a ``FunctionRunner``) never
call a model.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from celery_durable.agents.errors import AgentEndpointError, AgentOutputError, AgentRunnerError, AgentTimeoutError
from celery_durable.agents.types import AgentRequest, AgentResult
from celery_durable.config.settings import Settings

if TYPE_CHECKING:
    import httpx2
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
    from openai.types.chat.completion_create_params import ResponseFormat

_DETAIL_CHARS = 500
_FENCED = re.compile(r"^\s*```(?:json)?[ \t]*\n(?P<body>.*?)\n?```\s*$", re.DOTALL | re.IGNORECASE)


class OpenAIChatRunner:
    """Runs one agent turn as one chat completion.

    The prompt is sent as a single user message; on the engine's schema
    retry the validation error follows as a second user message asking for a
    fixed answer. With a schema the request carries a ``json_schema``
    response format (non-strict, so ordinary JSON Schemas work) and the reply
    is parsed as JSON. ``ai_credits`` come from ``prices``: credits per 1000
    prompt and completion tokens, keyed by model name.

    Every argument left out comes from ``settings`` (by default ``Settings()``,
    the ``CELERY_DURABLE_*`` environment): ``base_url``, ``api_key`` and
    ``model`` from ``openai_base_url``, ``openai_api_key`` and
    ``openai_model``; ``timeout``, ``max_retries`` and ``prices`` from
    ``agent_timeout_seconds``, ``agent_max_retries`` and ``agent_prices``.
    So ``OpenAIChatRunner()`` is configured by the variables its errors name.

    ``timeout`` bounds each request (connect, and each read: a non-streamed
    completion sends nothing until it is done). ``max_retries`` counts the
    extra requests after a 429, a 5xx or a failed connection.

    Pass ``client`` to use a preconfigured ``openai.OpenAI`` (for instance an
    ``openai.AzureOpenAI``); the runner applies its timeout and retries to it,
    and ``base_url``/``api_key`` must not be given. Such a client keeps its
    own HTTP client, and with it the SDK's habit of retrying timeouts.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        prices: Mapping[str, tuple[float, float]] | None = None,
        client: openai.OpenAI | None = None,
        settings: Settings | None = None,
    ) -> None:
        wanted = [model, timeout, max_retries, prices] + ([base_url, api_key] if client is None else [])
        if settings is None and any(value is None for value in wanted):
            settings = Settings()
        if settings is not None:
            if client is None:
                key = settings.openai_api_key
                base_url = base_url if base_url is not None else settings.openai_base_url
                api_key = api_key if api_key is not None else key.get_secret_value() if key is not None else None
            model = model if model is not None else settings.openai_model
            timeout = timeout if timeout is not None else settings.agent_timeout_seconds
            max_retries = max_retries if max_retries is not None else settings.agent_max_retries
            prices = prices if prices is not None else settings.agent_prices
        if timeout is None or not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be a non-negative integer, got {max_retries!r}")
        self.model = model
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.prices = _check_prices(prices or {})
        self._secrets = [api_key] if api_key else []
        self._client = self._build_client(client, base_url, api_key)
        client_key = getattr(self._client, "api_key", None)
        if isinstance(client_key, str) and client_key and client_key not in self._secrets:
            self._secrets.append(client_key)  # read from OPENAI_API_KEY or given inside `client`

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAIChatRunner:
        """Build the runner from ``openai_*`` and ``agent_*`` settings (SPEC §10)."""
        return cls(settings=settings)

    def run(self, request: AgentRequest) -> AgentResult:
        model = request.model or self.model
        if not model:
            raise AgentRunnerError(
                f"No model for agent call {request.label or request.agent_id!r}: pass model= to ctx.agent, "
                "or set CELERY_DURABLE_OPENAI_MODEL (OpenAIChatRunner(model=...))"
            )
        response_format: ResponseFormat | None = None
        if request.schema is not None:
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": request.schema, "strict": False},
            }
        completion = self._complete(model, _messages(request), response_format)
        usage = self._usage(completion, model)
        try:
            text = _reply_text(completion, model)
            output = text if request.schema is None else _parse_json(text)
        except AgentOutputError as exc:
            exc.usage = usage  # an answer the run cannot use was billed all the same
            raise
        return AgentResult(output=output, usage=usage)

    def __repr__(self) -> str:
        # Deliberately without the key: runners end up in logs and error reports.
        return f"OpenAIChatRunner(base_url={_safe_url(self._client.base_url)!r}, model={self.model!r})"

    # -- transport -----------------------------------------------------------

    def _build_client(self, client: openai.OpenAI | None, base_url: str | None, api_key: str | None) -> openai.OpenAI:
        try:
            import openai

            from celery_durable.agents._http import TimeoutsNotRetried
        except ImportError as exc:  # the `openai` extra: one runner's dependency, not every worker's
            raise AgentRunnerError(
                f"OpenAIChatRunner needs the openai package ({exc}): pip install 'celery-durable[openai]'"
            ) from None

        if client is not None:
            if base_url is not None or api_key is not None:
                raise ValueError("Pass either client= or base_url=/api_key=, not both")
            return client.with_options(timeout=self.timeout, max_retries=self.max_retries)
        http_client = TimeoutsNotRetried()
        try:
            return openai.OpenAI(
                base_url=base_url,
                api_key=api_key,
                timeout=self.timeout,
                max_retries=self.max_retries,
                http_client=http_client,
            )
        except openai.OpenAIError as exc:
            http_client.close()
            raise AgentRunnerError(
                f"Cannot configure the OpenAI client: {self._redact(str(exc))} "
                "(set CELERY_DURABLE_OPENAI_API_KEY; servers that need no key accept any value)"
            ) from None

    def _complete(
        self, model: str, messages: list[ChatCompletionMessageParam], response_format: ResponseFormat | None
    ) -> ChatCompletion:
        import openai

        error: AgentRunnerError
        try:
            return self._client.chat.completions.create(
                model=model,
                messages=messages,
                response_format=openai.omit if response_format is None else response_format,
            )
        except openai.APITimeoutError as exc:
            attempts = _attempts(exc.request)
            error = AgentTimeoutError(
                f"Agent endpoint {_safe_url(self._client.base_url)} did not answer within "
                f"{self.timeout:g}s (model {model!r}){_tries(attempts)}",
                attempts=attempts,
            )
        except openai.APIConnectionError as exc:
            attempts = _attempts(exc.request)
            cause = f"{exc}: {exc.__cause__}" if exc.__cause__ is not None else str(exc)
            error = AgentEndpointError(
                f"Cannot reach agent endpoint {_safe_url(self._client.base_url)}{_tries(attempts)}: "
                f"{self._detail(cause)}",
                attempts=attempts,
            )
        except openai.APIStatusError as exc:
            error = self._status_error(exc, model)
        except openai.OpenAIError as exc:
            error = AgentRunnerError(f"OpenAI client error (model {model!r}): {self._detail(str(exc))}")
        # Raised here, outside the handler that caught the client's exception,
        # so the error has no __context__: that exception holds the request,
        # Authorization header included.
        raise error

    def _status_error(self, exc: openai.APIStatusError, model: str) -> AgentEndpointError:
        status = exc.status_code
        body = exc.body
        detail = body.get("message") if isinstance(body, Mapping) else None
        attempts = _attempts(exc.request)
        message = (
            f"Agent endpoint answered HTTP {status} (model {model!r}){_tries(attempts)}: "
            f"{self._detail(str(detail) if detail else str(exc))}"
        )
        asked = _retry_after(exc.response.headers)
        if asked is not None and (status == 429 or status >= 500) and attempts <= self.max_retries:
            # Retries were left, so the SDK stopped because the pause asked for was too long.
            message += f" (server asked to retry after {asked})"
        return AgentEndpointError(message, status=status, attempts=attempts)

    # -- results -------------------------------------------------------------

    def _usage(self, completion: ChatCompletion, model: str) -> dict[str, Any]:
        usage = getattr(completion, "usage", None)
        prompt_tokens = _count(getattr(usage, "prompt_tokens", 0))
        completion_tokens = _count(getattr(usage, "completion_tokens", 0))
        # The price of the model asked for; the served model (often a dated
        # snapshot of it) is the fallback.
        price = self.prices.get(model) or self.prices.get(str(getattr(completion, "model", "") or ""))
        credits = 0.0
        if price is not None:
            credits = prompt_tokens / 1000 * price[0] + completion_tokens / 1000 * price[1]
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "ai_credits": credits}

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _detail(self, text: str) -> str:
        # Redact before cutting, so a key split by the cut cannot slip through.
        text = self._redact(text)
        return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS] + "…"


def openai_runner() -> OpenAIChatRunner:
    """Zero-argument factory for ``CELERY_DURABLE_AGENT_RUNNER=celery_durable.agents:openai_runner``.

    The same as ``OpenAIChatRunner()``: both read the settings from the
    environment, as workers and clients do.
    """
    return OpenAIChatRunner()


def _messages(request: AgentRequest) -> list[ChatCompletionMessageParam]:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": request.prompt}]
    if request.feedback is not None:
        fix = "Reply with only the corrected JSON." if request.schema is not None else "Reply with a corrected answer."
        messages.append({"role": "user", "content": f"Your previous answer was rejected: {request.feedback}\n{fix}"})
    return messages


def _reply_text(completion: Any, model: str) -> str:
    choices = getattr(completion, "choices", None)
    if not choices:
        raise AgentOutputError(f"Model {model!r} returned no choices")
    message = choices[0].message
    refusal = getattr(message, "refusal", None)
    if refusal:
        raise AgentOutputError(f"Model {model!r} refused: {refusal}")
    content = getattr(message, "content", None)
    if not isinstance(content, str):
        reason = getattr(choices[0], "finish_reason", None)
        raise AgentOutputError(f"Model {model!r} returned no text (finish_reason {reason!r})")
    return content


def _parse_json(text: str) -> Any:
    """The reply as a JSON value; the error message is what the engine feeds back on its schema retry."""
    fenced = _FENCED.match(text)  # local models often wrap JSON in a Markdown fence anyway
    try:
        return json.loads(fenced["body"] if fenced else text, parse_constant=_reject_constant)
    except ValueError as exc:
        snippet = text if len(text) <= 200 else text[:200] + "…"
        raise AgentOutputError(f"Output is not valid JSON ({exc}); the output was: {snippet!r}") from None


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON value")


def _retry_after(headers: Mapping[str, str]) -> str | None:
    """The pause the server asked for, as it said it (for the message; the SDK does the waiting)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        return f"{millis}ms"
    value = headers.get("retry-after")
    if value is None:
        return None
    return f"{value}s" if re.fullmatch(r"\d+(?:\.\d+)?", value.strip()) else value


def _attempts(request: httpx2.Request) -> int:
    """How many requests the SDK sent: it numbers them from 0 in a header."""
    count = request.headers.get("x-stainless-retry-count", "0")
    return int(count) + 1 if count.isdigit() else 1


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _check_prices(prices: Mapping[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    checked: dict[str, tuple[float, float]] = {}
    for model, pair in prices.items():
        try:
            price_in, price_out = (float(price) for price in pair)
        except (TypeError, ValueError):
            raise ValueError(f"Prices of model {model!r} must be a (prompt, completion) pair, got {pair!r}") from None
        if not all(math.isfinite(price) and price >= 0 for price in (price_in, price_out)):
            raise ValueError(f"Prices of model {model!r} must be finite and not negative, got {pair!r}")
        checked[model] = (price_in, price_out)
    return checked


def _tries(attempt: int) -> str:
    return f" after {attempt} attempts" if attempt > 1 else ""


def _safe_url(url: object) -> str:
    """The endpoint without user info or query string, either of which may hold a credential."""
    text = str(url)
    text = re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", r"\1", text, flags=re.IGNORECASE)
    return text.split("?", 1)[0]
