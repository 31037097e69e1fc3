"""The agent task: one agent turn on the agents queue.

The turn's request was journaled by the workflow's ``ctx.agent`` call
(``agent_call.lua``), so this task replays nothing: it takes a slot under the
run's concurrency ceiling (or comes back later without holding a worker),
calls the configured runner, checks the output against the schema — retrying
once with the validation error fed back — journals the outcome with the
turn's usage, and wakes every sequence that waits for it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import random
import re
import threading
import time
from typing import TYPE_CHECKING, Any

import jsonschema.exceptions

from celery_durable import telemetry
from celery_durable.agents import AgentRequest, AgentResult
from celery_durable.agents.errors import AgentOutputError
from celery_durable.broker import Flags, RunRecord, schema
from celery_durable.broker.replies.run import TurnVerdict
from celery_durable.broker.schema import Outcome
from celery_durable.errors import StaleAttemptError
from celery_durable.tasks import throttling
from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.heartbeat import Heartbeat
from celery_durable.tasks.in_place import wake_owners
from celery_durable.tasks.messages import CALL_PATTERN, BadMessage, RunMessage, knows, parse_run_message, pass_on
from celery_durable.tasks.retrying import retry_storage
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.json_schemas import validator_for
from celery_durable.workflows.limits import nano_credits

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

AGENT_ID = re.compile(r"[0-9a-f]{32}")
_random = random.Random()


@dataclasses.dataclass
class AgentAttempt:
    """What a heartbeat needs of the attempt an agent turn works for."""

    run: RunRecord
    epoch: int
    cancel_event: threading.Event = dataclasses.field(default_factory=threading.Event)

    def apply_flags(self, flags: Flags) -> None:
        if flags.cancel:
            self.cancel_event.set()

    def lose_authority(self) -> None:
        self.cancel_event.set()


@dataclasses.dataclass
class Turn:
    outcome: Outcome
    usage: dict[str, Any]
    error: str | None


def parse_owner(owner: Any) -> str:
    if owner == "m":
        return "m"
    if isinstance(owner, str) and "/" in owner:
        call, _, branch = owner.rpartition("/")
        if CALL_PATTERN.fullmatch(call) and branch.isdigit():
            return str(owner)
    raise BadMessage(f"owner is not a sequence owner: {owner!r:.80}")


def run_agent_task(
    engine: Engine,
    *,
    task_id: str,
    run_id: Any,
    epoch: Any,
    workflow: Any,
    agent: Any,
    owner: Any,
    extra: dict[str, Any],
) -> None:
    try:
        message = parse_run_message(run_id, epoch, workflow, extra)
        if not isinstance(agent, str) or not AGENT_ID.fullmatch(agent):
            raise BadMessage(f"agent is not an agent id: {agent!r:.80}")
        owner = parse_owner(owner)
    except BadMessage as exc:
        logger.error("rejected agent message: %s", exc)
        return
    token = task_id or new_task_id()
    what = f"run {message.run_id}: agent turn {agent}"
    try:
        started = retry_storage(what, lambda: _start(engine, message, agent, owner, token))
        if started is None:
            return
        record, request_json = started
        attempt = AgentAttempt(record, record.epoch)
        wake_coordinator = functools.partial(engine.wake_main, record)
        with Heartbeat(engine.store, attempt, token=token, interval=engine.heartbeat_interval, wake=wake_coordinator):
            begun, clock = engine.store.now_ms(), time.monotonic()
            request = json.loads(request_json)
            turn = telemetry.agent_turn(record, agent, token, lambda: run_turn(engine, record, agent, request))
            active_ms = int((time.monotonic() - clock) * 1000)
        # The turn ran: only its journaling is retried, never the turn itself.
        retry_storage(what, lambda: _finish(engine, record, agent, token, turn, begun, active_ms))
    except StaleAttemptError:
        engine.count_refused()


def _start(engine: Engine, message: RunMessage, agent: str, owner: str, token: str) -> tuple[RunRecord, str] | None:
    store = engine.store
    if not knows(engine, message):
        # Its runner is this engine's: another team's engine may answer with another model, or none.
        def send_again(new: str, countdown: float) -> None:
            engine.send_agent(message.run_id, message.epoch, message.workflow, agent, owner, countdown, task_id=new)

        pass_on(engine, message, token, "a", send_again)
        return None
    record = store.load_run(message.run_id)
    if record is None or record.epoch != message.epoch or record.workflow != message.workflow:
        engine.count_refused()
        logger.warning("refused stale or forged agent message for run %s", message.run_id)
        return None
    resend, delay = new_task_id(), _random.uniform(0.05, 0.3)
    start = store.agent_start(record.run_id, record.epoch, agent, token, resend, int(delay * 1000))
    if start.verdict is TurnVerdict.WAIT:
        # At the concurrency ceiling: come back soon without holding a worker slot.
        engine.send_agent(record.run_id, record.epoch, record.workflow, agent, owner, delay, task_id=resend)
        return None
    if start.verdict is not TurnVerdict.GO:
        return None  # done already, or this message runs it already
    return record, start.request_json


def _finish(engine: Engine, record: RunRecord, agent: str, token: str, turn: Turn, begun: int, active_ms: int) -> None:
    store = engine.store
    row = schema.finished_agent_row(
        store.agent_rows(record.run_id).get(schema.agent_row_key(agent, record.epoch)),
        failed=turn.error is not None,
        started_at=begun,
        completed_at=engine.store.now_ms(),
        active_ms=active_ms,
        usage=turn.usage,
        error=turn.error,
    )
    usage = (
        nano_credits(turn.usage.get("ai_credits") or 0),
        int(turn.usage.get("prompt_tokens") or 0),
        int(turn.usage.get("completion_tokens") or 0),
    )
    prefix = new_task_id()
    done = store.agent_finish(record.run_id, record.epoch, agent, turn.outcome.encode(), row, usage, token, prefix)
    if done.throttled:  # else no op of the run holds a slot: no round trip to look
        throttling.answered(engine, record.run_id, record.epoch, f"a/{agent}")
    wake_owners(engine, record.run_id, record.epoch, record.workflow, done.owners, prefix, namespace=record.namespace)


def run_turn(engine: Engine, record: RunRecord, agent_id: str, request: dict[str, Any]) -> Turn:
    """Call the runner; one retry with the validation error when the output breaks the schema."""
    usage: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0, "ai_credits": 0.0}
    output_schema = request.get("schema")
    base = AgentRequest(
        prompt=request["prompt"],
        label=request.get("label"),
        schema=output_schema,
        model=request.get("model"),
        run_id=record.run_id,
        agent_id=agent_id,
    )
    try:
        runner = engine.agent_runner
    except Exception as exc:  # a path that does not resolve, or a factory that raises: the turn fails
        return _failed(record.epoch, usage, f"The agent runner setting cannot be loaded: {type(exc).__name__}: {exc}")
    if runner is None:
        missing = "No agent runner is configured (Engine(agent_runner=...) or CELERY_DURABLE_AGENT_RUNNER)"
        return _failed(record.epoch, usage, missing)
    feedback: str | None = None
    problem: str | None = None
    for _ in range(2):
        try:
            result = runner.run(dataclasses.replace(base, feedback=feedback))
        except AgentOutputError as exc:
            problem = str(exc)
            if (bad := _add_usage(usage, exc.usage or {})) is not None:
                return _failed(record.epoch, usage, bad)
        except Exception as exc:
            return _failed(record.epoch, usage, f"{type(exc).__name__}: {exc}")
        else:
            output = result.output if isinstance(result, AgentResult) else result
            if isinstance(result, AgentResult) and (bad := _add_usage(usage, result.usage)) is not None:
                return _failed(record.epoch, usage, bad)
            problem = _output_problem(output, output_schema, engine.settings.max_payload_bytes)
            if problem is None:
                return Turn(schema.value_outcome(jsonvalue.loads(jsonvalue.dumps(output))), usage, None)
        if output_schema is None:
            return _failed(record.epoch, usage, str(problem))
        feedback = problem
    return _failed(record.epoch, usage, f"Output still violates the schema after one retry: {problem}")


USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "ai_credits")


def _add_usage(total: dict[str, Any], usage: Any) -> str | None:
    """Add a runner's usage to ``total``; what is wrong with it, else None: a
    runner that reports nonsense fails its turn, it does not kill the task."""
    if not isinstance(usage, dict):
        return f"AgentResult.usage must be a dict, got {type(usage).__name__}"
    for name in USAGE_FIELDS:
        value = usage.get(name) or 0
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            return f"AgentResult.usage[{name!r}] must be a finite number >= 0, got {value!r:.40}"
    for name in USAGE_FIELDS:
        total[name] += usage.get(name) or 0
    return None


def _output_problem(output: Any, schema: dict[str, Any] | None, max_bytes: int) -> str | None:
    try:
        jsonvalue.encode_payload(
            output, max_bytes, noun="Agent output", not_json="{noun} is not a JSON value: {problem}"
        )
    except jsonvalue.PayloadError as exc:
        return str(exc)
    if schema is not None:
        error = jsonschema.exceptions.best_match(validator_for(schema)(schema).iter_errors(output))
        if error is not None:
            path = "$" + "".join(f"[{part!r}]" for part in error.absolute_path)
            return f"at {path}: {error.message}"
    return None


def _failed(epoch: int, usage: dict[str, Any], error: str) -> Turn:
    """A failed turn: None to the workflow, retried by a later attempt like a failed step."""
    return Turn(Outcome("e", epoch, error_type="AgentFailed", message=error), usage, error)
