"""Record the messages this version of celery-durable sends, as a fixture.

Run at a commit to record what its workers and clients put on the broker:
``python -m tests.messages.record > tests/messages/<commit>.json``. Each
entry is one message as kombu's Redis transport stores it (its headers, and
its body decoded: ``[args, kwargs, embed]``), with fixed values standing in
for the run, the queues and the ids (``PLACEHOLDERS``), so a test can put
the message of an older version back on a queue of its own
(``tests/test_message_formats.py``): what a worker of that version would
have sent to a worker of this one during a rolling upgrade.

Recorded: a coordinator pass, a branch task, an agent turn, a called task
(``ctx.call``, sent by a homed worker: its link and link_error say where the
answer goes), and the call's answer as a worker that ran the task publishes
it: the link with the task's return value, and the old-style errback (the
failed task's id) a worker without the engine's tasks sends.
"""

from __future__ import annotations

import base64
import json
import sys
from types import SimpleNamespace
from typing import Any

import redis
from celery import Celery, group, signature

from celery_durable import Engine, Settings
from celery_durable.local.redis_server import RedisServer
from celery_durable.tasks.calls import publish_call
from celery_durable.tasks.home import home_name, home_queue
from celery_durable.workflows.calls import CallRequest, call_task_id

PLACEHOLDERS = {
    "run_id": "feedfacefeedfacefeedfacefeedface",
    "workflow": "recorded-flow",
    "coordinator_queue": "recorded.coordinator",
    "steps_queue": "recorded.steps",
    "agents_queue": "recorded.agents",
    "task_queue": "recorded.gpu",
    "home": "recorded.coordinator.keeper@recorded-host",
    "key": "render-1",
    "task": "gpu.render",
    "agent": "a" * 32,
    "task_id": "0badc0de0badc0de0badc0de0badc0de",
}


def _frames(raw: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The messages waiting in ``queue``, oldest first, bodies decoded."""
    frames = []
    for text in reversed(raw.lrange(queue, 0, -1)):
        frame = json.loads(text)
        body = json.loads(base64.b64decode(frame["body"]))
        frames.append({"headers": frame["headers"], "content-type": frame["content-type"], "body": body})
    raw.delete(queue)
    return frames


def record() -> dict[str, Any]:
    p = PLACEHOLDERS
    with RedisServer() as server:
        raw = redis.Redis.from_url(server.url, decode_responses=True)
        settings = Settings(
            redis_url=server.url,
            key_prefix="recorded",
            coordinator_queue=p["coordinator_queue"],
            steps_queue=p["steps_queue"],
            agents_queue=p["agents_queue"],
        )
        engine = Engine([], settings)
        app = engine.celery
        messages: dict[str, Any] = {}
        engine.send_coordinator(p["run_id"], 1, p["workflow"], task_id=p["task_id"])
        messages["coordinator"] = _frames(raw, p["coordinator_queue"])
        engine.send_branches(p["run_id"], 1, p["workflow"], "m:1", [0, 1], tasks=1, task_ids=[p["task_id"]])
        messages["branch"] = _frames(raw, p["steps_queue"])
        engine.send_agent(p["run_id"], 1, p["workflow"], p["agent"], "m", task_id=p["task_id"])
        messages["agent"] = _frames(raw, p["agents_queue"])

        # A call sent by a worker whose home queue is known: the link names it.
        engine.home = home_queue(app, settings, p["home"])
        assert home_name(settings, "keeper@recorded-host") == p["home"]
        record = SimpleNamespace(run_id=p["run_id"], epoch=1, workflow=p["workflow"])  # what publish_call reads
        request = CallRequest(
            key=p["key"],
            task_name=p["task"],
            args=["item"],
            kwargs={},
            queue=p["task_queue"],
            task_id=call_task_id(p["run_id"], p["key"]),
            options={},
        )
        publish_call(app, engine, record, request)
        called = _frames(raw, p["task_queue"])
        messages["call"] = called

        # The answer, as the worker that ran the task publishes it (Celery's
        # tracer, celery/app/trace.py; the errback as celery/backends/base.py
        # sends one to a task it does not have): a plain Celery worker's app.
        plain = Celery("plain", broker=server.url)
        callbacks, errbacks = called[0]["body"][2]["callbacks"], called[0]["body"][2]["errbacks"]
        task_id = request.task_id
        signature(callbacks[0], app=plain).apply_async(({"rendered": "item.png"},), parent_id=task_id, root_id=task_id)
        messages["call_result"] = _frames(raw, p["coordinator_queue"])
        group([signature(errbacks[0], app=plain)], app=plain).apply_async(
            (task_id,), parent_id=task_id, root_id=task_id
        )
        messages["call_failed"] = _frames(raw, p["coordinator_queue"])
        return {"placeholders": p, "messages": messages}


if __name__ == "__main__":
    json.dump(record(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
