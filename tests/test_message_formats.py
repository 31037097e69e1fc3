"""A rolling upgrade: the messages of one version reach workers of the next, and back.

During an upgrade, workers of two versions share the queues, and each takes
the other's messages. A worker that refuses what the other version sends
acknowledges the message and drops it: a call's answer dropped so leaves a
call with no timeout waiting for ever (issue 25, item 5: workers before
home queues refused every answer that named a home).

So, both ways:

- the messages of the previous version (``tests/messages/697bc7b.json``,
  recorded by ``tests/messages/record.py`` at that commit) are taken by this
  one, as recorded and with a field or header a later version might add;
- the answers this version sends carry no field a previous version refuses:
  the home queue travels in a message header (``tasks/calls.py``), which
  Celery hands to no task's arguments.

The recorded messages are put on the queues as kombu's Redis transport
stores them, and a real worker takes them.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, group, signature
from celery.signals import before_task_publish

from celery_durable import Engine, Settings, StepFailed, WorkflowContext
from celery_durable.tasks.app import COORDINATOR_TASK
from celery_durable.tasks.calls import publish_call
from celery_durable.tasks.home import home_queue
from celery_durable.workflows.calls import CallRequest, call_task_id
from tests.conftest import worker_thread
from tests.support.apps.gpu import make_app
from tests.support.poll import RUN_BOUND, poll
from tests.support.workflows import wf

RECORDED = Path(__file__).parent / "messages" / "697bc7b.json"
LATER_FIELD = {"added_by_a_later_version": {"any": ["json", 1]}}
LATER_HEADER = {"celery_durable_added_later": "x"}
HOME_HEADER = "celery_durable_home"
"""The header that names the home queue of the worker that sent a call."""
ANSWER_FIELDS = {"run_id", "epoch", "workflow", "key", "task_name"}
"""What an answer's arguments may hold for every version since calls came
(``edc81d0``): versions before home queues (``6ede0e4``) refuse any other."""


def recorded() -> dict[str, Any]:
    return dict(json.loads(RECORDED.read_text()))


def frame(entry: dict[str, Any], values: dict[str, str], queue: str, later: bool = False) -> str:
    """A recorded message as kombu's Redis transport stores it, with the
    test's run, queues and ids in place of the recorded ones; ``later`` adds
    an argument and a header that a later version might send."""
    record = recorded()
    text = json.dumps(entry)
    placeholders = dict(record["placeholders"])
    placeholders["call_task_id"] = call_task_id(placeholders["run_id"], placeholders["key"])
    for name in sorted(values, key=lambda n: -len(placeholders[n])):  # a home holds its coordinator queue's name
        text = text.replace(placeholders[name], values[name])
    message = json.loads(text)
    args, kwargs, embed = message["body"]
    headers = dict(message["headers"])
    if later:
        kwargs = {**kwargs, **LATER_FIELD}
        headers.update(LATER_HEADER)
    body = json.dumps([args, kwargs, embed]).encode()
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": message["content-type"],
            "headers": headers,
            "properties": {
                "correlation_id": headers["id"],
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_tag": uuid.uuid4().hex,
                "body_encoding": "base64",
                "delivery_info": {"exchange": queue, "routing_key": queue},
                "priority": 0,
            },
        }
    )


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="celery_durable")
    yield caplog


def _messages(caplog: pytest.LogCaptureFixture, *words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if all(word in r.getMessage() for word in words)]


@pytest.mark.parametrize("later", [False, True], ids=["as-recorded", "with-a-later-field"])
def test_the_previous_versions_pass_branch_and_agent_messages_are_checked_against_their_run_not_refused(
    settings: Settings, raw_redis: redis.Redis, logged: pytest.LogCaptureFixture, later: bool
) -> None:
    """Each names a run this store does not have: a message whose format is
    taken goes on to the run, where the fence refuses it ("refused stale or
    forged"); one whose format is refused never gets there ("rejected")."""
    engine = Engine([wf("recorded-flow", lambda ctx: None)], settings)
    queues = {
        "coordinator": settings.coordinator_queue,
        "branch": settings.steps_queue,
        "agent": settings.agents_queue,
    }
    values = {
        "run_id": uuid.uuid4().hex,
        "coordinator_queue": settings.coordinator_queue,
        "steps_queue": settings.steps_queue,
        "agents_queue": settings.agents_queue,
        "task_id": uuid.uuid4().hex,
    }
    messages = recorded()["messages"]
    with worker_thread(engine, concurrency=4, queues=list(queues.values())):
        for kind, queue in queues.items():
            raw_redis.lpush(queue, frame(messages[kind][0], values, queue, later))

        def handled() -> bool:
            return all(_messages(logged, kind, "message") for kind in queues)

        poll(handled, within=RUN_BOUND, what="each message to be handled")
    for kind in queues:
        assert not _messages(logged, "rejected", kind), _messages(logged, "rejected")
        assert _messages(logged, f"refused stale or forged {kind} message for run {values['run_id']}")


def _render(queue: str) -> Any:
    def run(ctx: WorkflowContext) -> Any:
        try:
            return ctx.call("render-1", "gpu.render", args=("item",), queue=queue)
        except StepFailed as failure:
            return {"failed": failure.error_type}

    return wf("upgrade-flow", run)


@pytest.mark.parametrize(
    ("kind", "later", "result"),
    [
        ("call_result", False, {"rendered": "item.png"}),
        ("call_result", True, {"rendered": "item.png"}),
        ("call_failed", False, {"failed": "TaskFailed"}),
        ("call_failed", True, {"failed": "TaskFailed"}),
    ],
)
def test_the_previous_versions_answer_of_a_call_is_journaled_and_the_run_goes_on(
    settings: Settings, raw_redis: redis.Redis, logged: pytest.LogCaptureFixture, kind: str, later: bool, result: Any
) -> None:
    """The run waits at its call, kept here; the task's message waits in a
    queue nobody serves. The answer then comes as a worker of the previous
    version that ran the task sent it: the return value by the link, or the
    failed task's id by the old-style errback, naming this worker's home in
    its arguments. Before, an answer with anything more than this version
    knew was refused, and the call waited for ever."""
    homed = settings.model_copy(update={"home_queues": True})
    gpu_queue = f"{settings.key_prefix}.gpu"
    engine = Engine([_render(gpu_queue)], homed)
    queues = [settings.coordinator_queue, settings.steps_queue]
    with worker_thread(engine, concurrency=4, queues=queues, hostname="upgraded@test"):
        client = engine.client()
        run_id = client.start_workflow("upgrade-flow")
        task_id = call_task_id(run_id, "render-1")
        poll(
            lambda: raw_redis.llen(gpu_queue) == 1 and len(engine.parked) == 1,
            within=RUN_BOUND,
            what="the call sent, the body kept",
        )
        assert engine.home is not None
        values = {
            "run_id": run_id,
            "workflow": "upgrade-flow",
            "home": engine.home.name,
            "coordinator_queue": settings.coordinator_queue,
            "call_task_id": task_id,
        }
        entry = recorded()["messages"][kind][0]
        raw_redis.lpush(settings.coordinator_queue, frame(entry, values, settings.coordinator_queue, later))
        poll(
            lambda: _messages(logged, "rejected") or client.get_workflow_run(run_id).status != "running",
            within=RUN_BOUND,
            what="the answer to be taken or refused",
        )
        assert not _messages(logged, "rejected"), _messages(logged, "rejected")
        envelope = client.wait_for_workflow_run(run_id, timeout=RUN_BOUND)
        resumed = engine.parked.resumed
    assert envelope.status == "completed", envelope.error
    assert envelope.result == result
    assert envelope.attempt == 1
    assert resumed == 1, "the home the answer named is this worker's: the kept body went on"


def test_this_versions_answers_carry_only_what_every_previous_version_takes(settings: Settings) -> None:
    """The called task's link and link_error, as this version sends them from
    a homed worker: their arguments hold only the fields every version since
    calls came knows, and the home queue rides in a header, as does when the
    call was published (its latency, for the metrics)."""
    engine = Engine([], settings)
    app = engine.celery
    engine.home = home_queue(app, settings, f"{settings.coordinator_queue}.keeper@host")
    run_id = uuid.uuid4().hex
    gpu_queue = f"{settings.key_prefix}.gpu"
    request = CallRequest(
        key="render-1",
        task_name="gpu.render",
        args=["item"],
        kwargs={},
        queue=gpu_queue,
        task_id=call_task_id(run_id, "render-1"),
        options={},
    )
    record = type("Record", (), {"run_id": run_id, "epoch": 1, "workflow": "recorded-flow"})()
    before = int(time.time() * 1000)
    publish_call(app, engine, record, request)  # type: ignore[arg-type]
    raw = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    (sent,) = raw.lrange(gpu_queue, 0, -1)
    embed = json.loads(base64.b64decode(json.loads(sent)["body"]))[2]
    for answer in (*embed["callbacks"], *embed["errbacks"]):
        assert set(answer["kwargs"]) == ANSWER_FIELDS, answer["task"]
        headers = answer["options"]["headers"]
        assert set(headers) == {HOME_HEADER, "celery_durable_called"}, answer["task"]
        assert headers[HOME_HEADER] == engine.home.name
        assert before <= headers["celery_durable_called"] <= int(time.time() * 1000)


@pytest.mark.parametrize(
    ("task", "args", "in_place", "result"),
    [
        ("gpu.add", (1, 2), False, 3),
        ("gpu.broken", ("why",), False, {"failed": "TaskFailed"}),
        ("gpu.add", (1, 2), True, 3),
        ("gpu.broken", ("why",), True, {"failed": "KeyError"}),
    ],
    ids=["link-by-message", "errback-by-message", "link-in-place", "errback-in-place"],
)
def test_the_home_header_is_read_on_every_path_of_an_answer(
    settings: Settings, raw_redis: redis.Redis, task: str, args: tuple[Any, ...], in_place: bool, result: Any
) -> None:
    """The call is sent again as another worker process would have sent it
    (its home queue in the answer's header); the answer then comes by message
    as a plain worker publishes it (the link, or the old-style errback), or
    from the task run here (Celery calls the errback in place with the failed
    task's request, not the errback's own options). Each time the main
    body's wake goes to that other home: nobody consumes it there, so it is
    sent again to the coordinator queue and the run goes on, in the same
    attempt."""
    parked_queue, gpu_queue = f"{settings.key_prefix}.parked", f"{settings.key_prefix}.gpu"
    homed = settings.model_copy(update={"home_queues": True})
    elsewhere = f"{settings.coordinator_queue}.elsewhere@test"

    def run(ctx: WorkflowContext) -> Any:
        try:
            return ctx.call("c", task, args=args, queue=parked_queue)
        except StepFailed as failure:
            return {"failed": failure.error_type}

    engine = Engine([wf("homed", run)], homed, celery_app=make_app(settings.redis_url, gpu_queue))
    sent_home: list[str] = []

    def on_publish(sender: Any = None, routing_key: Any = None, **_: Any) -> None:
        if sender == COORDINATOR_TASK and routing_key == elsewhere:
            sent_home.append(routing_key)

    before_task_publish.connect(on_publish, weak=False)
    queues = [settings.coordinator_queue, settings.steps_queue, gpu_queue]
    try:
        with worker_thread(engine, concurrency=4, queues=queues, hostname="here@test"):
            client = engine.client()
            run_id = client.start_workflow("homed")
            poll(
                lambda: raw_redis.llen(parked_queue) == 1 and len(engine.parked) == 1,
                within=RUN_BOUND,
                what="the body kept",
            )
            raw_redis.delete(parked_queue)
            other = Engine([], homed, celery_app=make_app(settings.redis_url, gpu_queue))
            other.home = home_queue(other.celery, homed, elsewhere)
            record = engine.store.load_run(run_id)
            request = CallRequest(
                key="c",
                task_name=task,
                args=list(args),
                kwargs={},
                queue=gpu_queue if in_place else parked_queue,
                task_id=call_task_id(run_id, "c"),
                options={},
            )
            publish_call(other.celery, other, record, request)  # type: ignore[arg-type]
            if not in_place:
                (sent,) = raw_redis.lrange(parked_queue, 0, -1)
                embed = json.loads(base64.b64decode(json.loads(sent)["body"]))[2]
                plain = Celery("plain", broker=settings.redis_url)
                if task == "gpu.add":
                    signature(embed["callbacks"][0], app=plain).apply_async((3,), parent_id=request.task_id)
                else:
                    group([signature(embed["errbacks"][0], app=plain)], app=plain).apply_async(
                        (request.task_id,), parent_id=request.task_id
                    )
            envelope = client.wait_for_workflow_run(run_id, timeout=RUN_BOUND)
    finally:
        before_task_publish.disconnect(on_publish)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == result
    assert sent_home == [elsewhere], "the wake went to the home the header named"
    assert envelope.attempt == 1
