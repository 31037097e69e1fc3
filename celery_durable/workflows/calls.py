"""``ctx.call``: a Celery task of the fleet, run as a journaled step (SPEC §5a).

The key is the call's identity, exactly as a step's: a hit returns the
journaled result without sending anything. A miss publishes the task with a
task id derived from the run and the key (stable across attempts, so the
task can deduplicate on ``self.request.id``), linked to the engine's result
and error tasks, and suspends the sequence: no worker slot is held while the
task runs, on whatever worker has it — a plain Celery worker knows nothing
of runs and needs nothing of celery-durable. Its result comes back through
the link and is journaled (``call_done.lua``); an exception, through the
link_error, as ``StepFailed`` with the task's exception type and message; no
answer within ``timeout`` seconds, as ``StepFailed(error_type="TaskTimeout")``.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from celery_durable import telemetry
from celery_durable.broker import schema
from celery_durable.broker.journal import CallVerdict, Conflict
from celery_durable.broker.schema import Identity, Outcome
from celery_durable.errors import DurableError, StepFailed, StorageUnavailableError
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.cursor import check_key
from celery_durable.workflows.ops import Ops
from celery_durable.workflows.throttles import Throttled

if TYPE_CHECKING:
    from celery_durable.workflows.cursor import Cursor
    from celery_durable.workflows.replay import Recalled, Replay

MAX_TASK_NAME = 256
MAX_TIMEOUT_SECONDS = 10 * 365 * 86_400
R = TypeVar("R")
TASK_ID_NAMESPACE = uuid.UUID("6f1c2a52-4b8e-4c1f-9d3a-0c8f3e6b2d71")
"""The namespace of call task ids: uuid5 of "<run_id>:<key>" in it."""


def call_task_id(run_id: str, key: str) -> str:
    """The task id of a call: the same for every attempt of the run."""
    return str(uuid.uuid5(TASK_ID_NAMESPACE, f"{run_id}:{key}"))


@dataclass(frozen=True, slots=True)
class CallRequest:
    """A task to publish for a call, and whom its result answers."""

    key: str
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str | None
    options: dict[str, Any]
    task_id: str
    inputs: str = ""
    """``{"args", "kwargs"}`` as JSON text: kept for the run's history (``i:<key>``)."""


class CallOps(Ops):
    """``ctx.call`` of one execution."""

    def call(
        self,
        key: str,
        task: Any,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        queue: str | None,
        timeout: float | None,
        throttled: Throttled = None,
    ) -> Any:
        cursor, due_from = start_waited(self._replay, "call", key, timeout)
        identity = Identity.call(key)
        making = partial(self._request, key, task, args, kwargs, queue)
        reached = reach(self._replay, cursor, identity, f"call {key!r}", making)
        if isinstance(reached, Outcome):
            return reached.step_result(key)
        request, found = reached
        # Its slot goes back when the task's answer is journaled (tasks/calls.py).
        self._replay.throttles.gate(cursor, f"c/{key}", throttled, f"call {key!r}")
        within = f"within {timeout:g} s" if timeout is not None else "in time"
        where = f" (queue {request.queue})" if request.queue else ""
        message = f"Task {request.task_name} (call {key}) did not finish {within}{where}"
        timed_out = StepFailed(key, "TaskTimeout", message, found_by_engine=True)
        return self._until_answered(cursor, request, identity, due_from, found.cut, timed_out)

    def _until_answered(
        self,
        cursor: Cursor,
        request: CallRequest,
        identity: str,
        due_from: Callable[[int], int | None],
        cut: str | None,
        timed_out: StepFailed,
    ) -> Any:
        """Journal the call, publish it once, and wait for its answer."""
        replay, key = self._replay, request.key
        failure = schema.failure_outcome(replay.epoch, timed_out).encode()
        while True:
            now = replay.journal.now_ms()
            running = schema.StepRow.running(
                replay.run.attempt,
                now,
                schema.call_id(cursor.seq, cursor.index),
                task=request.task_name,
                queue=request.queue,
            )
            result = replay.journal.call(
                cursor.seq,
                cursor.index,
                key,
                cursor.owner,
                due_from(now),
                cut,
                running.encode(),
                failure,
                request.inputs,
            )
            if isinstance(result, Conflict):
                replay.conflict(cursor, result, identity)
            replay.apply_flags(result.flags)
            if result.verdict is CallVerdict.HIT and result.outcome is not None:
                if result.outcome == failure:  # timed out, journaled by this script: no answer will count it
                    telemetry.call_answered(replay.run.workflow, False, None)
                cursor.advance()
                return replay.decode(result.outcome).step_result(key)
            if result.verdict is CallVerdict.PUBLISH:
                self._publish(request)
            raw = replay.wait_for_answer(cursor, identity)
            if raw is not None:
                answer = replay.decode(raw)
                if not answer.is_live(replay.epoch):
                    raise replay.suspend()  # not this attempt's answer: end the pass, and replay
                cursor.advance()
                return answer.step_result(key)
            # A kept body woken with no answer: a time-out, a cancel, or a
            # wake for something else. Ask the journal again, as a replay
            # reaching this call would (call.lua fails it past its due time).
            replay.check_cancelled()
            cut = None

    def _publish(self, request: CallRequest) -> None:
        """Send the called task. Should the broker refuse it, this attempt's
        publication is undone (``unsent``), so that the pass, run again when
        the broker is back, publishes it (its answer would otherwise be waited
        for, for ever), and the execution breaks: workflow code that catches
        the error cannot go on past the call."""
        replay = self._replay
        try:
            if (watching := telemetry.observer) is None:
                replay.port.send_call(request)
            else:
                watching.call(replay, request, replay.port.send_call)
        except Exception as exc:  # kombu/amqp connection errors have no common base
            with contextlib.suppress(DurableError):
                replay.journal.unsent([], call_key=request.key)
            error = StorageUnavailableError(f"Broker unavailable while calling task {request.task_name}: {exc}")
            raise replay.break_with(error) from None

    def _request(
        self, key: str, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None, queue: str | None
    ) -> CallRequest:
        """The call checked and made JSON, before anything is journaled: a bad
        call is a ``ValueError`` naming its key, and the run is unharmed."""
        name, args, kwargs, options = _unpack(key, task, args, kwargs)
        if queue is not None and (not isinstance(queue, str) or not queue):
            raise ValueError(f"ctx.call {key!r}: queue must be a non-empty queue name or None, got {queue!r}")
        if isinstance(args, str | bytes | Mapping) or not isinstance(args, Sequence):
            raise ValueError(f"ctx.call {key!r}: args must be a list or tuple, got {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ValueError(f"ctx.call {key!r}: kwargs must be a dict, got {type(kwargs).__name__}")
        payload = {"args": list(args), "kwargs": dict(kwargs or {})}
        encoded = jsonvalue.encode_payload(
            payload,
            self._replay.max_payload_bytes,
            noun=f"ctx.call {key!r} arguments",
            not_json="{noun} must be JSON values: {problem}",
            too_large="{noun} are {size} bytes, above max_payload_bytes ({limit})",
        )
        plain = jsonvalue.loads(encoded)
        # The signature's own queue leaves its options whether or not queue= wins
        # (SPEC 5a): left there, it would be sent twice (publish_call).
        routed = options.pop("queue", None)
        return CallRequest(
            key=key,
            task_name=name,
            args=plain["args"],
            kwargs=plain["kwargs"],
            queue=queue or routed,
            options=options,
            task_id=call_task_id(self._replay.run.run_id, key),
            inputs=encoded,
        )


def _unpack(
    key: str, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None
) -> tuple[str, Sequence[Any], Mapping[str, Any] | None, dict[str, Any]]:
    """The task's name, arguments and options, from a task object, a name or a ``Signature``."""
    if isinstance(task, str):
        name = task
        options: dict[str, Any] = {}
    elif _is_signature(task):
        name = task.task
        options = dict(task.options or {})
        for own in ("link", "link_error", "task_id", "chain", "chord"):
            if options.get(own):
                raise ValueError(
                    f"ctx.call {key!r}: the signature carries its own {own}; celery-durable sets the task id and "
                    "links of a call itself"
                )
        if task.args or task.kwargs:
            if args or kwargs:
                raise ValueError(f"ctx.call {key!r}: give the arguments in the signature or to ctx.call, not both")
            args, kwargs = tuple(task.args or ()), dict(task.kwargs or {})
        options = {k: v for k, v in options.items() if k in ("queue", "priority", "expires")}
    elif callable(getattr(task, "apply_async", None)) and isinstance(getattr(task, "name", None), str):
        name = task.name
        options = {}
    else:
        raise ValueError(
            f"ctx.call {key!r}: task must be a Celery task, a task name or a signature, got {type(task).__name__}"
        )
    if not isinstance(name, str) or not name or len(name) > MAX_TASK_NAME:
        raise ValueError(f"ctx.call {key!r}: the task name must be a non-empty string of at most {MAX_TASK_NAME}")
    return name, args, kwargs, options


def _is_signature(task: Any) -> bool:
    """A Celery ``Signature`` (a dict with task, args, kwargs and options),
    told by its shape: replay imports nothing of Celery."""
    return isinstance(task, dict) and isinstance(task.get("task"), str) and hasattr(task, "options")


def start_waited(
    replay: Replay, op: str, key: str, timeout: float | None
) -> tuple[Cursor, Callable[[int], int | None]]:
    """Where a call or a child (``op``) starts, the same for both: its key and
    ``timeout`` checked before anything else, then its cursor, the run not
    cancelled; and its due time from when it is journaled."""
    check_key(op.capitalize(), key)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
            raise ValueError(f"ctx.{op} {key!r}: timeout must be a finite number of seconds or None, got {timeout!r}")
        if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
            raise ValueError(f"ctx.{op} {key!r}: timeout must be above 0 and at most ten years, got {timeout!r}")
    cursor = replay.current()
    replay.check_cancelled()
    due_ms = None if timeout is None else math.ceil(timeout * 1000)
    return cursor, lambda now: None if due_ms is None else now + due_ms


def checked_first(cursor: Cursor, identity: str, request: Callable[[], R]) -> R | None:
    """``request()`` (which raises the op's ``ValueError``) for an op the
    journal does not hold here, before the journal is consulted, so a bad op
    raises alike on every replay; None where the journal holds this op (it
    passed its checks when first made)."""
    journaled_here = cursor.journaled()
    if journaled_here is None or journaled_here[0] != identity:
        return request()
    return None


def reach(
    replay: Replay, cursor: Cursor, identity: str, what: str, request: Callable[[], R], *, check_first: bool = True
) -> Outcome | tuple[R, Recalled]:
    """Where a call or a child stands: its live outcome, else its request and
    the journal's ``Recalled``. An op the journal holds here passed its checks
    when first made: a replay skips them and the JSON copy of the arguments,
    most of a replayed op's cost. Any other is checked first (``check_first``),
    so a bad one raises its ``ValueError`` before the journal is consulted."""
    made = checked_first(cursor, identity, request) if check_first else None
    found = replay.recall(cursor, identity, what, answered_elsewhere=True)
    if found.outcome is not None:
        return found.outcome
    checked = request() if made is None else made
    replay.flush(cursor)
    if not found.journaled:
        replay.check_pause(cursor)
    return checked, found


def failure_error(outcome: schema.Outcome) -> str:
    """The error a settled call's step row shows ('' for a result)."""
    return "" if outcome.kind == "o" else f"{outcome.error_type}: {outcome.message}"
