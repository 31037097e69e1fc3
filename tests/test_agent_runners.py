"""Agent runners, SPEC §9: FunctionRunner, OpenAIChatRunner and load_runner.

``OpenAIChatRunner`` is tested through the real ``openai`` client against a
real HTTP server on a loopback port that speaks the chat-completions
protocol; each test scripts its replies and inspects the requests it got.
"""

from __future__ import annotations

import json
import pickle
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest

import celery_durable.agents
from celery_durable.agents import (
    AgentEndpointError,
    AgentOutputError,
    AgentRequest,
    AgentResult,
    AgentRunner,
    AgentRunnerError,
    AgentTimeoutError,
    FunctionRunner,
    OpenAIChatRunner,
    load_runner,
)
from celery_durable.config import Settings
from celery_durable.errors import DurableError

API_KEY = "sk-test-0123456789abcdef-secret"
SDK_FIRST_BACKOFF = 0.5 * 0.75
"""The ``openai`` SDK's first pause before a retry: 0.5 s, less at most 25% jitter; the next one doubles."""
SOON = {"retry-after-ms": "10"}
"""A server asking for a 10 ms pause: retries the SDK makes at once, for tests that only count them."""


# -- a scripted chat-completions server ---------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any
    at: float


def completion(content: str | None, *, prompt_tokens: int = 7, completion_tokens: int = 3, model: str = "m") -> Reply:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    return Reply(body=body)


def failure(status: int, message: str = "boom", headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=status, body={"error": {"message": message, "type": "test"}}, headers=headers or {})


class ChatServer:
    """Answers POST /v1/chat/completions from a script; the last reply repeats."""

    def __init__(self) -> None:
        self.script: list[Reply | Callable[[Seen], Reply]] = [completion("hello")]
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                seen = Seen(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw), time.monotonic()
                )
                reply = server._next(seen)
                time.sleep(reply.delay)
                payload = (reply.body if isinstance(reply.body, str) else json.dumps(reply.body)).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # a test's sleeping handler must not hold up the next test
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def _next(self, seen: Seen) -> Reply:
        with self._lock:
            self.requests.append(seen)
            step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return step(seen) if callable(step) else step

    def gaps(self) -> list[float]:
        return [later.at - earlier.at for earlier, later in zip(self.requests, self.requests[1:], strict=False)]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def server() -> Iterator[ChatServer]:
    chat = ChatServer()
    yield chat
    chat.close()


def runner_for(server: ChatServer, **options: Any) -> OpenAIChatRunner:
    options = {"base_url": server.base_url, "api_key": API_KEY, "model": "m", "timeout": 5.0, **options}
    return OpenAIChatRunner(**options)


def request(prompt: str = "Say hello", **fields: Any) -> AgentRequest:
    values: dict[str, Any] = {"label": None, "schema": None, "model": None, "run_id": "run-1", "agent_id": "a1"}
    values.update(fields)
    return AgentRequest(prompt=prompt, **values)


def leaks_key(error: BaseException) -> bool:
    rendered = [str(error), repr(error), "".join(traceback.format_exception(error))]
    return any(API_KEY in text for text in rendered) or API_KEY.encode() in pickle.dumps(error)


# -- OpenAIChatRunner: answers --------------------------------------------------


def test_plain_text_answer(server: ChatServer) -> None:
    server.script = [completion("Hello there", prompt_tokens=11, completion_tokens=2)]

    result = runner_for(server).run(request("Say hello"))

    assert result == AgentResult(
        output="Hello there", usage={"prompt_tokens": 11, "completion_tokens": 2, "ai_credits": 0.0}
    )
    [seen] = server.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.body["model"] == "m"
    assert seen.body["messages"] == [{"role": "user", "content": "Say hello"}]
    assert "response_format" not in seen.body


def test_schema_sends_json_schema_and_parses_the_reply(server: ChatServer) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    server.script = [completion('{"n": 3, "tags": ["a", null]}')]

    result = runner_for(server).run(request("Count", schema=schema, model="big-model"))

    assert result.output == {"n": 3, "tags": ["a", None]}
    [seen] = server.requests
    assert seen.body["model"] == "big-model"
    assert seen.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": False},
    }


def test_json_in_a_markdown_fence_is_accepted(server: ChatServer) -> None:
    server.script = [completion('```json\n[1, 2, {"ok": true}]\n```')]

    assert runner_for(server).run(request(schema={"type": "array"})).output == [1, 2, {"ok": True}]


@pytest.mark.parametrize("reply", ["Sure! Here it is: {n: 3}", "NaN", '{"n": 1'])
def test_invalid_json_under_a_schema_is_an_output_error(server: ChatServer, reply: str) -> None:
    server.script = [completion(reply)]

    with pytest.raises(AgentOutputError, match="not valid JSON") as caught:
        runner_for(server).run(request(schema={"type": "object"}))

    assert reply in caught.value.message  # the engine feeds this back on its schema retry
    assert isinstance(caught.value, AgentRunnerError)
    assert caught.value.code == "agent_output_error"
    # The answer was billed all the same: the engine counts it in the run's usage and credits.
    assert caught.value.usage == {"prompt_tokens": 7, "completion_tokens": 3, "ai_credits": 0.0}


def test_text_without_a_schema_is_not_parsed(server: ChatServer) -> None:
    server.script = [completion('{"n": 1}')]

    assert runner_for(server).run(request()).output == '{"n": 1}'


def test_missing_content_is_an_output_error(server: ChatServer) -> None:
    server.script = [completion(None)]

    with pytest.raises(AgentOutputError, match="returned no text"):
        runner_for(server).run(request())


def test_feedback_is_sent_as_a_second_user_message(server: ChatServer) -> None:
    server.script = [completion('{"n": 2}')]
    feedback = "'n' is a required property"

    runner_for(server).run(request("Count", schema={"type": "object"}, feedback=feedback))

    [seen] = server.requests
    first, second = seen.body["messages"]
    assert first == {"role": "user", "content": "Count"}
    assert second["role"] == "user"
    assert feedback in second["content"]
    assert "JSON" in second["content"]


def test_request_model_wins_over_the_default_and_one_is_required(server: ChatServer) -> None:
    runner_for(server, model="default-model").run(request(model="chosen"))
    runner_for(server, model="default-model").run(request())
    assert [seen.body["model"] for seen in server.requests] == ["chosen", "default-model"]

    with pytest.raises(AgentRunnerError, match="CELERY_DURABLE_OPENAI_MODEL") as caught:
        runner_for(server, model=None).run(request(label="summarize"))
    assert "summarize" in caught.value.message
    assert len(server.requests) == 2  # nothing sent without a model


# -- OpenAIChatRunner: usage and credits ----------------------------------------


def test_usage_is_priced_per_thousand_tokens(server: ChatServer) -> None:
    server.script = [completion("ok", prompt_tokens=1200, completion_tokens=300)]
    runner = runner_for(server, model="priced", prices={"priced": (0.5, 1.5), "other": (9.0, 9.0)})

    usage = runner.run(request()).usage

    assert usage["prompt_tokens"] == 1200
    assert usage["completion_tokens"] == 300
    assert usage["ai_credits"] == pytest.approx(1200 / 1000 * 0.5 + 300 / 1000 * 1.5)


def test_unpriced_model_costs_nothing_and_the_served_model_is_the_fallback(server: ChatServer) -> None:
    server.script = [completion("ok", prompt_tokens=1000, completion_tokens=1000, model="gpt-x-2024-01-01")]
    runner = runner_for(server, model="gpt-x", prices={"gpt-x-2024-01-01": (1.0, 2.0)})
    assert runner.run(request()).usage["ai_credits"] == pytest.approx(3.0)

    assert runner_for(server, model="gpt-x", prices={"elsewhere": (1.0, 2.0)}).run(request()).usage["ai_credits"] == 0


def test_missing_usage_counts_as_zero(server: ChatServer) -> None:
    reply = completion("ok")
    del reply.body["usage"]
    server.script = [reply]

    assert runner_for(server, prices={"m": (1.0, 1.0)}).run(request()).usage == {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "ai_credits": 0.0,
    }


def test_prices_are_checked() -> None:
    with pytest.raises(ValueError, match="finite and not negative"):
        OpenAIChatRunner(api_key="k", prices={"m": (-1.0, 0.0)})
    with pytest.raises(ValueError, match="pair"):
        OpenAIChatRunner(api_key="k", prices={"m": (1.0,)})  # type: ignore[dict-item]


# -- OpenAIChatRunner: retries (the SDK's), timeouts, failures ---------------------


def test_429_is_retried_after_a_backoff(server: ChatServer) -> None:
    server.script = [failure(429, "slow down"), completion("finally")]

    assert runner_for(server).run(request()).output == "finally"

    assert len(server.requests) == 2
    assert server.gaps()[0] >= SDK_FIRST_BACKOFF


def test_retry_after_header_is_honoured(server: ChatServer) -> None:
    server.script = [failure(429, headers={"retry-after-ms": "300"}), completion("ok")]

    assert runner_for(server).run(request()).output == "ok"

    assert server.gaps()[0] >= 0.3


def test_a_retry_after_too_long_to_wait_for_is_an_error_at_once(server: ChatServer) -> None:
    server.script = [failure(429, headers={"retry-after": "3600"}), completion("never")]

    with pytest.raises(AgentEndpointError, match="retry after 3600s") as caught:
        runner_for(server).run(request())

    assert caught.value.status == 429
    assert len(server.requests) == 1


def test_5xx_is_retried_with_growing_backoff(server: ChatServer) -> None:
    server.script = [failure(500), failure(503), completion("third time")]

    assert runner_for(server).run(request()).output == "third time"

    first, second = server.gaps()
    assert len(server.requests) == 3
    assert first >= SDK_FIRST_BACKOFF
    assert second >= 2 * SDK_FIRST_BACKOFF


def test_persistent_5xx_fails_after_max_retries(server: ChatServer) -> None:
    server.script = [failure(500, "the model is on fire", headers=SOON)]

    with pytest.raises(AgentEndpointError) as caught:
        runner_for(server, max_retries=2).run(request())

    assert len(server.requests) == 3
    error = caught.value
    assert (error.status, error.attempts, error.code) == (500, 3, "agent_endpoint_error")
    assert "HTTP 500" in error.message
    assert "after 3 attempts" in error.message
    assert "the model is on fire" in error.message
    assert [seen.headers["x-stainless-retry-count"] for seen in server.requests] == ["0", "1", "2"]


def test_client_errors_are_not_retried(server: ChatServer) -> None:
    server.script = [failure(400, "context length exceeded")]

    with pytest.raises(AgentEndpointError, match="context length exceeded") as caught:
        runner_for(server, max_retries=3).run(request())

    assert caught.value.status == 400
    assert len(server.requests) == 1


def test_timeout_is_an_error_and_not_retried(server: ChatServer) -> None:
    server.script = [Reply(delay=1.5, body=completion("too late").body)]
    started = time.monotonic()

    with pytest.raises(AgentTimeoutError, match=r"within 0\.3s") as caught:
        runner_for(server, timeout=0.3, max_retries=3).run(request())

    assert time.monotonic() - started < 1.2
    assert len(server.requests) == 1
    assert isinstance(caught.value, AgentEndpointError)
    assert caught.value.code == "agent_timeout"


def test_a_timeout_after_a_retry_counts_both_attempts(server: ChatServer) -> None:
    server.script = [failure(503, headers=SOON), Reply(delay=1.5, body=completion("too late").body)]

    with pytest.raises(AgentTimeoutError, match="after 2 attempts") as caught:
        runner_for(server, timeout=0.3, max_retries=3).run(request())

    assert caught.value.attempts == 2
    assert len(server.requests) == 2


def test_unreachable_endpoint_is_retried_then_reported() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    runner = OpenAIChatRunner(base_url=url, api_key=API_KEY, model="m", max_retries=1)

    with pytest.raises(AgentEndpointError, match="Cannot reach agent endpoint") as caught:
        runner.run(request())

    assert caught.value.status is None
    assert caught.value.attempts == 2
    assert "after 2 attempts" in caught.value.message


@pytest.mark.parametrize("max_retries", [0, 1])
def test_a_given_client_takes_the_runners_retries(server: ChatServer, max_retries: int) -> None:
    server.script = [failure(500, headers=SOON)]
    client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=5)

    with pytest.raises(AgentEndpointError) as caught:
        OpenAIChatRunner(client=client, model="m", max_retries=max_retries).run(request())

    assert len(server.requests) == caught.value.attempts == max_retries + 1
    with pytest.raises(ValueError, match="either client"):
        OpenAIChatRunner(client=client, api_key=API_KEY)


# -- OpenAIChatRunner: the key --------------------------------------------------


def test_api_key_is_a_bearer_token_and_never_in_errors(server: ChatServer) -> None:
    # A server that echoes the key back, as some gateways do in 401 bodies.
    def echo(seen: Seen) -> Reply:
        return failure(401, f"Incorrect API key provided: {seen.headers['authorization']}")

    server.script = [echo]
    runner = runner_for(server)

    with pytest.raises(AgentEndpointError) as caught:
        runner.run(request())

    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"
    error = caught.value
    assert error.status == 401
    assert "Incorrect API key provided: Bearer ***" in error.message
    assert not leaks_key(error)
    assert error.__context__ is None  # the client's exception holds the request headers
    assert API_KEY not in repr(runner)


def test_key_is_kept_out_of_retried_errors_too(server: ChatServer) -> None:
    server.script = [failure(503, f"upstream rejected key {API_KEY}")]

    with pytest.raises(AgentEndpointError) as caught:
        runner_for(server, max_retries=1).run(request())

    assert not leaks_key(caught.value)


def test_missing_key_is_a_clear_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    with pytest.raises(AgentRunnerError, match="CELERY_DURABLE_OPENAI_API_KEY"):
        OpenAIChatRunner(base_url="http://127.0.0.1:9/v1")


def test_errors_survive_pickling() -> None:
    error = AgentEndpointError("HTTP 503", status=503, attempts=4)

    clone = pickle.loads(pickle.dumps(error))

    assert type(clone) is AgentEndpointError
    assert (clone.message, clone.status, clone.attempts, clone.code) == ("HTTP 503", 503, 4, "agent_endpoint_error")
    assert isinstance(pickle.loads(pickle.dumps(AgentOutputError("bad"))), DurableError)


# -- OpenAIChatRunner: settings --------------------------------------------------


def test_from_settings(server: ChatServer) -> None:
    server.script = [completion("ok", prompt_tokens=2000, completion_tokens=0)]
    settings = Settings(
        openai_base_url=server.base_url,
        openai_api_key=API_KEY,  # type: ignore[arg-type]  # pydantic turns it into a SecretStr
        openai_model="m",
        agent_timeout_seconds=7,
        agent_max_retries=1,
        agent_prices={"m": (0.25, 1.0)},
    )

    runner = OpenAIChatRunner.from_settings(settings)

    assert (runner.timeout, runner.max_retries) == (7.0, 1)
    assert runner.run(request()).usage["ai_credits"] == pytest.approx(0.5)
    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"
    assert API_KEY not in repr(settings)


def test_settings_from_environment_and_the_factory_path(server: ChatServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_DURABLE_OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("CELERY_DURABLE_OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("CELERY_DURABLE_OPENAI_MODEL", "env-model")
    monkeypatch.setenv("CELERY_DURABLE_AGENT_PRICES", '{"env-model": [1, 2]}')

    assert Settings().agent_prices == {"env-model": (1.0, 2.0)}
    runner = load_runner("celery_durable.agents:openai_runner")

    assert isinstance(runner, OpenAIChatRunner)
    assert runner.run(request()).output == "hello"
    assert server.requests[0].body["model"] == "env-model"


def test_a_runner_built_without_arguments_reads_the_variables_its_errors_name(
    server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELERY_DURABLE_OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("CELERY_DURABLE_OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("CELERY_DURABLE_OPENAI_MODEL", "env-model")
    monkeypatch.setenv("CELERY_DURABLE_AGENT_TIMEOUT_SECONDS", "9")
    monkeypatch.setenv("CELERY_DURABLE_AGENT_MAX_RETRIES", "1")
    monkeypatch.setenv("CELERY_DURABLE_AGENT_PRICES", '{"env-model": [1, 0]}')
    server.script = [failure(503, headers=SOON), completion("ok", prompt_tokens=500)]

    runner = OpenAIChatRunner()

    assert (runner.model, runner.timeout, runner.max_retries) == ("env-model", 9.0, 1)
    assert runner.run(request()).usage["ai_credits"] == pytest.approx(0.5)
    assert [seen.body["model"] for seen in server.requests] == ["env-model", "env-model"]
    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_arguments_win_over_the_settings(server: ChatServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_DURABLE_OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("CELERY_DURABLE_OPENAI_MODEL", "env-model")
    monkeypatch.setenv("CELERY_DURABLE_AGENT_MAX_RETRIES", "7")
    server.script = [failure(500, headers=SOON)]

    runner = OpenAIChatRunner(base_url=server.base_url, api_key=API_KEY, model="mine", max_retries=0)

    with pytest.raises(AgentEndpointError):
        runner.run(request())
    assert [seen.body["model"] for seen in server.requests] == ["mine"]


def test_settings_reject_bad_prices() -> None:
    with pytest.raises(ValueError, match="finite and not negative"):
        Settings(agent_prices={"m": (float("inf"), 1.0)})


# -- the package ------------------------------------------------------------------


def test_exported_names() -> None:
    assert set(celery_durable.agents.__all__) == {
        "AgentRequest",
        "AgentResult",
        "AgentRunner",
        "FunctionRunner",
        "OpenAIChatRunner",
        "openai_runner",
        "load_runner",
        "AgentRunnerError",
        "AgentOutputError",
        "AgentEndpointError",
        "AgentTimeoutError",
    }


def test_importing_celery_durable_does_not_import_openai() -> None:
    # openai takes about as long to import as everything else; only processes
    # that build an OpenAIChatRunner should pay for it.
    code = "import sys, celery_durable, celery_durable.agents; sys.exit('openai' in sys.modules)"

    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=60).returncode == 0


# -- FunctionRunner ---------------------------------------------------------------


def test_function_runner_routes_by_label_then_default() -> None:
    runner = FunctionRunner(
        routes={"upper": lambda r: r.prompt.upper(), "count": lambda r: {"n": len(r.prompt)}},
        default=lambda r: f"default:{r.label}",
    )

    assert runner.run(request("abc", label="upper")).output == "ABC"
    assert runner.run(request("abcd", label="count")).output == {"n": 4}
    assert runner.run(request(label="unknown")).output == "default:unknown"
    assert runner.run(request(label=None)).output == "default:None"
    assert runner.run(request(label="upper")).usage == {"prompt_tokens": 0, "completion_tokens": 0, "ai_credits": 0.0}
    assert isinstance(runner, AgentRunner)


def test_function_runner_passes_agent_results_through() -> None:
    result = AgentResult(output="costly", usage={"prompt_tokens": 10, "completion_tokens": 5, "ai_credits": 2.5})
    runner = FunctionRunner(routes={"paid": lambda r: result})

    assert runner.run(request(label="paid")) is result


def test_function_runner_without_route_names_the_label() -> None:
    runner = FunctionRunner(routes={"known": lambda r: "x"})

    with pytest.raises(AgentRunnerError, match="'missing'") as caught:
        runner.run(request(label="missing"))
    assert "'known'" in caught.value.message
    with pytest.raises(AgentRunnerError, match="without a label"):
        runner.run(request(label=None))
    with pytest.raises(AgentRunnerError, match="no route"):
        FunctionRunner().run(request(label="any"))


def test_function_runner_lets_callable_errors_through() -> None:
    def broken(req: AgentRequest) -> str:
        raise KeyError("tool failed")

    with pytest.raises(KeyError, match="tool failed"):
        FunctionRunner(default=broken).run(request())
    with pytest.raises(TypeError, match="not callable"):
        FunctionRunner(routes={"x": "not a function"})  # type: ignore[dict-item]


def test_function_runner_copies_its_routes() -> None:
    routes: dict[str, Callable[[AgentRequest], Any]] = {"a": lambda r: 1}
    runner = FunctionRunner(routes=routes)
    routes["a"] = lambda r: 2

    assert runner.run(request(label="a")).output == 1


# -- load_runner ------------------------------------------------------------------

RUNNER = FunctionRunner(default=lambda r: "from instance")


def make_runner() -> FunctionRunner:
    return FunctionRunner(default=lambda r: "from factory")


class ClassRunner:
    def run(self, request: AgentRequest) -> AgentResult:
        return AgentResult(output="from class", usage={"prompt_tokens": 0, "completion_tokens": 0, "ai_credits": 0.0})


class Holder:
    runner = RUNNER


def needs_arguments(settings: Settings) -> FunctionRunner:
    return FunctionRunner()


def not_a_factory() -> int:
    return 42


NOT_A_RUNNER = 42


@pytest.mark.parametrize(
    ("attribute", "output"),
    [
        ("RUNNER", "from instance"),
        ("make_runner", "from factory"),
        ("ClassRunner", "from class"),
        ("Holder.runner", "from instance"),
    ],
)
def test_load_runner(attribute: str, output: str) -> None:
    runner = load_runner(f"{__name__}:{attribute}")

    assert runner.run(request()).output == output


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_colon_here", "must look like"),
        ("pkg.mod:", "must look like"),
        (":attr", "must look like"),
        ("pkg..mod:attr", "must look like"),
        ("pkg.mod:1attr", "must look like"),
        ("celery_durable_no_such_module.sub:runner", "cannot import module"),
        ("celery_durable.no_such_module:runner", "cannot import module"),
        (f"{__name__}:MISSING", "has no attribute 'MISSING'"),
        (f"{__name__}:Holder.missing", "has no attribute 'Holder.missing'"),
        (f"{__name__}:NOT_A_RUNNER", "neither a runner"),
        (f"{__name__}:not_a_factory", "returned int"),
        (f"{__name__}:needs_arguments", "must take no arguments"),
    ],
)
def test_load_runner_rejects_bad_paths(path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_runner(path)


def test_load_runner_does_not_hide_errors_inside_the_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "runner_with_missing_dep.py").write_text("import celery_durable_missing_dependency\nrunner = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "runner_with_missing_dep", raising=False)

    with pytest.raises(ModuleNotFoundError, match="celery_durable_missing_dependency"):
        load_runner("runner_with_missing_dep:runner")
