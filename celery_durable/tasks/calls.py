"""Task calls on the fleet's side: publishing a called task, and its answer.

A called task is the user's own; it runs wherever Celery sends it, on a
worker that may know nothing of celery-durable. It answers through Celery's
own callbacks: ``link`` sends its return value to ``celery_durable.call_result``
on the coordinator queue, ``link_error`` reaches ``celery_durable.call_failed``
— in place, with the exception, on a worker that has the engine's tasks, or
as a message with only the failed task's id on one that does not (Celery's
old-style errback), when the exception is read from the app's result backend
if it has one. Both carry the run, the epoch that published the call and its
key; the answer is journaled fenced by that epoch (``call_done.lua``), so a
stale attempt's answer changes nothing, and what waits for the call is woken
(``in_place``: right there, when this worker consumes the queue its message
would go to).

The link itself skips the broker when it can (``CallAnswerTask``): a called
task that ran on a worker consuming the coordinator queue is answered in
place, so a call costs one message — the task — instead of two. Where the
answer and what it wakes run is decided in ``tasks/wake_route.py``.

The answer's arguments are the ones every version since calls came knows;
the home queue of the worker that keeps the body (``tasks/home.py``) rides
in a message header (``HOME_HEADER``), which Celery hands to no task's
arguments, so a worker of an older version takes the answer all the same
during a rolling upgrade. For the same reason an argument this version does
not know is ignored (``tasks/messages.py``), and a ``home`` argument, which
the versions before this one sent, is still read.
"""

from __future__ import annotations

import contextvars
import logging
from typing import TYPE_CHECKING, Any

from celery import Celery, Task
from kombu.serialization import dumps, loads

from celery_durable import telemetry
from celery_durable.broker import RunRecord, schema
from celery_durable.broker.connection import now_ms
from celery_durable.broker.replies.run import CallDone
from celery_durable.broker.schema import MAIN
from celery_durable.errors import StaleAttemptError, StepFailed
from celery_durable.tasks import throttling
from celery_durable.tasks.app import CALL_FAILED_TASK, CALL_RESULT_TASK, destination, new_task_id
from celery_durable.tasks.home import home_of, is_home_name
from celery_durable.tasks.in_place import consumes, gather, run_taken_pass, take_request, wake_owners
from celery_durable.tasks.messages import BadMessage, parse_run_message
from celery_durable.tasks.retrying import retry_storage
from celery_durable.tasks.sending import SentMessage
from celery_durable.tasks.wake_route import Where, answer_here, route
from celery_durable.workflows.calls import CallRequest, failure_error
from celery_durable.workflows.cursor import is_key
from celery_durable.workflows.jsonvalue import is_utf8
from celery_durable.workflows.steps import result_outcome

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

HOME_HEADER = "celery_durable_home"
"""The message header of an answer that names the home queue of the worker
that sent the call (``tasks/home.py``)."""
CALLED_HEADER = "celery_durable_called"
"""The message header of an answer that says when (ms) its call was
published: the call's latency, for the metrics of the worker that journals it."""


def answer_fields(record: RunRecord, request: CallRequest) -> dict[str, Any]:
    """What a call's answer carries (its link's keyword arguments): the run, the
    attempt that published the call, its key, the task's name. Every version
    since calls came sends these five and no more (``tests/messages``)."""
    return {
        "run_id": record.run_id,
        "epoch": record.epoch,
        "workflow": record.workflow,
        "key": request.key,
        "task_name": request.task_name,
    }


def publish_call(app: Celery, engine: Engine, record: RunRecord, request: CallRequest) -> None:
    """Send the called task, linked to the engine's answer tasks.

    Sent without subscribing to its result, which it still stores. Celery's
    asynchronous result backends (Redis's) subscribe to a task's result
    channel in ``send_task`` when the sender's joins do not block (a
    threads-pool worker, a client), for the ``AsyncResult`` it returns. The
    answer comes by the link and nothing here reads a result: left
    subscribed, a worker kept every call's channel (30 after 30 calls), each
    result's publish queued unread on that connection; let go after the send,
    it paid a SUBSCRIBE and an UNSUBSCRIBE per call, a quarter of a publish's
    CPU. ``ignore_result=True`` skips the subscription and sets the message's
    ``ignore_result`` header; the headers given then put it back to what
    ``send_task`` writes when none is given (None: the task's own option
    decides, on the worker), so the task stores its result, or not, exactly
    as when it is called from plain Celery.
    """
    answer = answer_fields(record, request)
    # When it was published (ms): telemetry.call_answered times its answer from it.
    headers: dict[str, Any] = {CALLED_HEADER: now_ms()}
    if engine.home is not None:
        headers[HOME_HEADER] = engine.home.name  # where the body waiting for it is kept
    options: dict[str, Any] = {
        **destination(app, engine.settings.coordinator_queue), "serializer": "json", "headers": headers
    }
    link = app.signature(CALL_RESULT_TASK, kwargs=answer, **options)
    link_error = app.signature(CALL_FAILED_TASK, kwargs=answer, **options)
    app.send_task(
        request.task_name,
        args=request.args,
        kwargs=request.kwargs,
        task_id=request.task_id,
        # No queue given: none passed, so the task's own routing applies, its
        # own ``queue`` option included (an explicit None would override it).
        **(destination(app, request.queue) if request.queue is not None else {}),
        link=link,
        link_error=link_error,
        serializer="json",
        add_to_parent=False,  # not a child of a task this thread may be running (a pass run in place)
        result_cls=SentMessage,  # the answer comes by the link; nothing reads a result here
        **request.options,
        ignore_result=True,  # no subscription (docstring)
        # The trace context too, when this process traces: the called task's span is the call's child.
        headers=telemetry.inject_headers({"ignore_result": None}),
    )


def call_succeeded(
    engine: Engine, args: tuple[Any, ...], fields: dict[str, Any], home: Any = None, called: Any = None
) -> None:
    """The called task returned ``args[0]``: journal it as the call's outcome.
    ``home``, ``called``: the message's ``HOME_HEADER`` and ``CALLED_HEADER``."""
    try:
        run_id, epoch, workflow, key, _, home = _parse(engine, fields, home)
        if len(args) != 1:
            raise BadMessage(f"expected the task's result as the one positional argument, got {len(args)}")
    except BadMessage as exc:
        logger.error("rejected call result message: %s", exc)
        return
    outcome = result_outcome(key, args[0], epoch, engine.settings.max_payload_bytes)
    _journal(engine, run_id, epoch, workflow, key, outcome, home, called)


class CallAnswerTask(Task):  # type: ignore[misc]
    """The task class of ``celery_durable.call_result``: a link that may be answered in place.

    Celery dispatches a finished task's ``link`` by publishing it, from the
    worker that ran the task, before it stores the task's result
    (``celery/app/trace.py``). When that worker consumes the coordinator
    queue, the link's message would come back to this same worker: it is
    answered here instead, and the message is not sent. A worker that does
    not (a GPU pool) sends it, as does one that cannot journal the answer
    now (its task then retries, as always). The called task's message is
    acknowledged after this returns (``acks_late`` tasks), so a worker that
    dies before the answer is journaled has its task delivered again.
    """

    engine: Engine | None = None
    """Set at registration (a task option becomes a class attribute)."""

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> Any:
        engine = self.engine
        if (
            engine is not None
            and answer_here(
                _link_of_running_task(self, options.get("parent_id")),
                consumes(engine, engine.settings.coordinator_queue),
            )
            and answer_in_place(
                engine, tuple(args or ()), dict(kwargs or {}), _home_header(options), _header(options, CALLED_HEADER)
            )
        ):
            return self.AsyncResult(task_id or new_task_id())
        return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow, **options)


def _link_of_running_task(task: Task, parent_id: Any) -> bool:
    """True when Celery's tracer dispatches the link of the task this thread just ran."""
    running = task.app.current_worker_task
    return parent_id is not None and running is not None and running.request.id == parent_id


def _home_header(options: dict[str, Any]) -> Any:
    return _header(options, HOME_HEADER)


def _header(options: dict[str, Any], name: str) -> Any:
    headers = options.get("headers")
    return headers.get(name) if isinstance(headers, dict) else None


def answer_in_place(
    engine: Engine, args: tuple[Any, ...], fields: dict[str, Any], home: Any = None, called: Any = None
) -> bool:
    """Answer a call where its task ran; False when its message must be sent instead.

    The answer is what its message would carry: the return value through
    the link's JSON serializer (a tuple becomes a list, an int key a string,
    as on the wire), and one that does not serialize is left to Celery's own
    publish, which fails the task as it always would. It runs in a context
    of its own: none of the tracer's (Celery's callback-publish retry flag).
    """
    try:
        content_type, encoding, body = dumps(list(args), serializer="json")  # type: ignore[no-untyped-call]
        wired = tuple(loads(body, content_type, encoding, accept={content_type}))  # type: ignore[no-untyped-call]
    except Exception:  # kombu's EncodeError, and whatever a value's own encoder raises
        return False
    try:
        run = contextvars.Context().run
        run(engine.run_here, CALL_RESULT_TASK, "", fields, wired, home=home, called=called)
    except Exception:
        # Nothing journaled (call_succeeded handles what follows the write):
        # the message goes, and its task retries as always.
        logger.warning("the answer of a call could not be journaled in place; its message is sent", exc_info=True)
        return False
    return True


def call_failed(engine: Engine, args: tuple[Any, ...], fields: dict[str, Any], home: Any = None) -> None:
    """The called task raised: in place ``(request, exception, traceback)``,
    or by message ``(task_id,)`` from a worker without the engine's tasks.
    ``home``: the message's ``HOME_HEADER``; in place, Celery calls the errback
    with the failed task's request and without its own options, and the
    header is read from that request's errbacks."""
    if home is None and len(args) == 3:
        home = _errback_home(args[0], fields)
    try:
        run_id, epoch, workflow, key, task, home = _parse(engine, fields, home)
    except BadMessage as exc:
        logger.error("rejected call error message: %s", exc)
        return
    if len(args) == 3 and isinstance(args[1], BaseException):
        error_type, message = type(args[1]).__name__, str(args[1])
    elif len(args) == 1 and isinstance(args[0], str):
        error_type, message = _stored_exception(engine, args[0], task)
    else:
        logger.error("rejected call error message for run %s: unexpected arguments %.80r", run_id, args)
        return
    outcome = schema.failure_outcome(epoch, StepFailed(key, error_type, message))
    _journal(engine, run_id, epoch, workflow, key, outcome, home)


def _errback_home(request: Any, fields: dict[str, Any]) -> Any:
    """The home header of the failed task's link_error that carries ``fields``."""
    for errback in getattr(request, "errbacks", None) or ():
        if isinstance(errback, dict) and errback.get("task") == CALL_FAILED_TASK and errback.get("kwargs") == fields:
            return _home_header(errback.get("options") or {})
    return None


def _stored_exception(engine: Engine, task_id: str, task: str) -> tuple[str, str]:
    """The exception of a failed task, as the app's result backend keeps it."""
    backend = engine.celery.backend
    if type(backend).__name__ == "DisabledBackend":
        return (
            "TaskFailed",
            f"Task {task} failed on a worker that has not celery-durable's tasks, and the Celery app has no "
            "result backend to tell its exception (configure one, or mount the engine on the app that worker runs)",
        )
    try:
        meta = backend.get_task_meta(task_id)
        error = backend.exception_to_python(meta.get("result"))
    except Exception as exc:  # a backend's own errors have no common base
        return "TaskFailed", f"Task {task} failed; its exception could not be read from the result backend: {exc}"
    if isinstance(error, BaseException):
        return type(error).__name__, str(error)
    return "TaskFailed", f"Task {task} failed: {error!r:.200}"


def _journal(
    engine: Engine,
    run_id: str,
    epoch: int,
    workflow: str,
    key: str,
    outcome: schema.Outcome,
    home: str | None,
    called: Any = None,
) -> None:
    """Journal the call's answer and continue what waits for it, where
    ``wake_route`` says. The main body's pass may be taken by the script that
    journals the answer (``Where.TAKE``): a call in a row then costs one
    script fewer."""
    error = failure_error(outcome)
    prefix = new_task_id()
    place, queue = home_of(engine, home)
    verdict = route(gather(engine, run_id, epoch, workflow, MAIN, place, takeable=True))
    kept = None
    if verdict.where is Where.TAKE:
        kept = take_request(engine, run_id, epoch, workflow, prefix, soft=verdict.wait_let_go)

    def write() -> CallDone | None:
        here = kept[1] if kept is not None else None
        return engine.store.call_done_here(run_id, epoch, key, outcome.encode(), error, prefix, here)

    try:
        done = retry_storage(f"run {run_id}: the answer of call {key!r}", write)
    except StaleAttemptError as exc:
        engine.count_refused()
        logger.info("refused stale or forged call answer for run %s (call %r): %s", run_id, key, exc)
        return
    if done is not None:
        telemetry.call_answered(workflow, outcome.kind == "o", called)
        if done.throttled:  # else no op of the run holds a slot: no round trip to look
            throttling.answered(engine, run_id, epoch, f"c/{key}")
    if done is None or not done.owners:
        return
    if kept is not None and done.activation is not None:
        run_taken_pass(engine, run_id, epoch, workflow, kept, done.activation)
        return
    # Journaled: from here on, a failure must not send the answer again (it
    # would find the call answered and wake no one). A wake that cannot be
    # sent is left to liveness, which takes the run over.
    try:
        wake_owners(engine, run_id, epoch, workflow, done.owners, prefix, place, queue)
    except Exception:
        logger.exception("run %s: the answer of call %r is journaled, but what waits for it was not woken", run_id, key)


def _parse(engine: Engine, fields: dict[str, Any], header: Any) -> tuple[str, int, str, str, str, str | None]:
    """The answer's fields; its home from the header, or from the argument
    the versions before the header sent."""
    known = {name: fields.pop(name, None) for name in ("key", "task_name", "home")}
    key, task = known["key"], known["task_name"]
    home = known["home"] if known["home"] is not None else header
    run_id, epoch, workflow = (fields.pop(name, None) for name in ("run_id", "epoch", "workflow"))
    message = parse_run_message(run_id, epoch, workflow, fields)
    if not is_key(key):
        raise BadMessage(f"key is not a call key: {key!r:.80}")
    if not isinstance(task, str) or not is_utf8(task):
        raise BadMessage(f"task is not a task name: {task!r:.80}")
    if home is not None and not is_home_name(engine.settings, home):
        raise BadMessage(f"home is not a home queue of this engine: {home!r:.80}")
    return message.run_id, message.epoch, message.workflow, key, task, home
