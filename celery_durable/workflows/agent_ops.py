"""Agent turns: ``ctx.agent`` journals a request and waits for its turn's task.

The request's identity is a hash of prompt, label, schema and model, so
identical calls in a run are one turn (memoized). A new turn is dispatched
to the agents queue within the run's ceilings (``agent_call.lua`` checks them
in the same script that journals the request); the sequence then waits
without holding a worker, and the turn's task wakes it.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import TYPE_CHECKING, Any

import jsonschema
import jsonschema.exceptions

from celery_durable import telemetry
from celery_durable.broker import schema
from celery_durable.broker.journal import AgentVerdict, Conflict
from celery_durable.broker.schema import Identity
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.json_schemas import unresolved_ref, validator_for
from celery_durable.workflows.ops import Ops
from celery_durable.workflows.throttles import Throttled

if TYPE_CHECKING:
    pass

MAX_LABEL = 256


def _agent_id(request: dict[str, Any], journaled: tuple[str, str | None] | None) -> str:
    """The turn's id: a hash of its request with every key sorted, so identical
    calls are one turn whatever order a schema's keys were written in (SPEC §4).
    A turn journaled here before ids sorted keys keeps the id it has (the hash
    of the request as written), so a run in flight across the upgrade replays."""
    canonical = _hash(jsonvalue.dumps(request, sort_keys=True))
    if journaled is not None and journaled[0] != Identity.agent(canonical):
        as_written = _hash(jsonvalue.dumps(request))
        if journaled[0] == Identity.agent(as_written):
            return as_written
    return canonical


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class AgentOps(Ops):
    """``ctx.agent`` of one execution."""

    def agent(
        self,
        prompt: str,
        *,
        label: str | None,
        schema_: Any,
        model: str | None,
        throttled: Throttled = None,
    ) -> Any:
        replay = self._replay
        request = self._request(prompt, label, schema_, model)
        cursor = replay.current()
        agent_id = _agent_id(request, cursor.journaled())
        replay.check_cancelled()
        identity = Identity.agent(agent_id)
        found = replay.recall(cursor, identity, f"agent turn {agent_id}", answered_elsewhere=True)
        if found.outcome is not None:
            return found.outcome.result
        replay.flush(cursor)
        replay.check_pause(cursor)
        # Its slot goes back when the turn's outcome is journaled (tasks/agent.py).
        replay.throttles.gate(cursor, f"a/{agent_id}", throttled, f"agent turn {agent_id}")
        message = uuid.uuid4().hex
        row = schema.queued_agent_row(agent_id, label, model, replay.run.attempt, replay.journal.now_ms(), message)
        result = replay.journal.agent_call(
            cursor.seq, cursor.index, agent_id, jsonvalue.dumps(request), cursor.owner, row, found.cut, message
        )
        if isinstance(result, Conflict):
            replay.conflict(cursor, result, identity)
        replay.apply_flags(result.flags)
        if result.verdict is AgentVerdict.HIT and result.outcome is not None:
            outcome = replay.decode(result.outcome)
            cursor.advance()
            return outcome.result
        if result.verdict is AgentVerdict.LIMIT:
            replay.check_cancelled()
        if result.verdict is AgentVerdict.DISPATCH:
            replay.port.send_agent(agent_id, cursor.owner, message)
            if (watching := telemetry.observer) is not None:
                watching.agent_dispatched(replay)
        replay.wait_for_wake(cursor)

    def _request(self, prompt: str, label: str | None, schema_: Any, model: str | None) -> dict[str, Any]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("ctx.agent prompt must be a non-empty string")
        jsonvalue.encode_payload(
            prompt,
            self._replay.max_payload_bytes,
            noun="ctx.agent prompt",
            text=True,
            not_json="{noun} holds a lone surrogate",
        )
        for name, value in (("label", label), ("model", model)):
            if value is not None and (not isinstance(value, str) or not value or len(value) > MAX_LABEL):
                raise ValueError(
                    f"ctx.agent {name} must be a non-empty string of at most {MAX_LABEL} characters or None"
                )
        if schema_ is not None:
            if not isinstance(schema_, dict) or jsonvalue.json_problem(schema_) is not None:
                raise ValueError("ctx.agent schema must be a JSON Schema given as a dict")
            validator = validator_for(schema_)
            try:
                validator.check_schema(schema_)
            except jsonschema.exceptions.SchemaError as exc:
                raise ValueError(f"ctx.agent schema is not a valid JSON Schema: {exc.message}") from None
            # Else the agent task died on it every time, and the run was taken over again and again.
            unresolved = unresolved_ref(validator, schema_)
            if unresolved is not None:
                raise ValueError(
                    f"ctx.agent schema has a $ref that does not resolve within it: {jsonvalue.short_repr(unresolved)}"
                )
        return {"prompt": prompt, "label": label, "schema": schema_, "model": model}
