"""A kept body's wakes go home (``tasks/home.py``).

On a fleet of more than one worker process, a call's task often runs in a
process other than the one that keeps the run's body parked at the call.
That process journals the answer, and sends the main body's wake to the
home queue of the process that sent the call, where the body goes on from
the call instead of the whole run being replayed. A wake sent home to a
process that has died is found by liveness, and the run is taken over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.signals import before_task_publish, worker_shutdown

from celery_durable import Engine, Settings, WorkflowContext
from celery_durable.broker.keys import KeySpace
from celery_durable.tasks.app import CALL_RESULT_TASK, COORDINATOR_TASK
from celery_durable.workflows.calls import call_task_id
from tests.conftest import worker_thread
from tests.support.apps import kept_home
from tests.support.apps.gpu import make_app
from tests.support.apps.kept_home import CALLS, adds, hold, render_one, starts_key
from tests.support.fleet import Fleet, WorkerProcess, fleet  # noqa: F401  (the fixture)
from tests.support.gpu_workers import Gpu
from tests.support.poll import RUN_BOUND, poll
from tests.support.workflows import wf


class HomeWakes:
    """The coordinator messages this process sent to a worker's home queue."""

    def __init__(self, settings: Settings) -> None:
        self.prefix = f"{settings.coordinator_queue}."
        self.count = 0
        self._lock = threading.Lock()

    def on_publish(self, sender: Any = None, routing_key: Any = None, **_: Any) -> None:
        if sender == COORDINATOR_TASK and str(routing_key).startswith(self.prefix):
            with self._lock:
                self.count += 1


@pytest.fixture
def home_wakes(settings: Settings) -> Iterator[HomeWakes]:
    seen = HomeWakes(settings)
    before_task_publish.connect(seen.on_publish, weak=False)
    yield seen
    before_task_publish.disconnect(seen.on_publish)


@pytest.mark.topologies("redis", "rabbitmq")
def test_an_answer_journaled_by_another_worker_wakes_the_kept_body_at_home(
    settings: Settings,
    fleet: Fleet,  # noqa: F811
    home_wakes: HomeWakes,
    raw_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keeper takes the run's first pass and keeps the body at each call;
    the tasks run on the worker here, which journals each answer. Before
    home queues, the first answer replayed the run here (and the body moved
    here with it); on a fleet where tasks run on either worker, about half
    the answers did, each replaying every call before it."""
    monkeypatch.setattr(kept_home, "counter", (raw_redis, settings.key_prefix))
    gpu_queue = f"{settings.key_prefix}.gpu"
    _keeper(settings, fleet, gpu_queue)
    engine = Engine([adds, render_one, hold], _homed(settings), celery_app=_gpu_app(settings, gpu_queue))
    client = engine.client()
    run_id = client.start_workflow("adds")
    running = KeySpace(settings.key_prefix).run(run_id).running
    poll(lambda: raw_redis.hlen(running), within=RUN_BOUND, what="the first call sent")
    with worker_thread(engine, concurrency=4, queues=[settings.coordinator_queue, settings.steps_queue, gpu_queue]):
        envelope = client.wait_for_workflow_run(run_id, timeout=RUN_BOUND)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == sum(range(CALLS))
    assert raw_redis.get(starts_key(settings.key_prefix, run_id)) == "1", "no answer replayed the run"
    assert home_wakes.count >= 1, "the answers journaled here woke the body where it was kept"
    assert envelope.attempt == 1


@pytest.mark.slow
def test_a_wake_sent_home_to_a_dead_worker_goes_to_the_coordinator_queue_in_the_same_attempt(
    settings: Settings, fleet: Fleet, tmp_path: Path, raw_redis: redis.Redis  # noqa: F811
) -> None:
    """The worker keeping the body is killed while the call's task waits for
    a GPU worker; the task then runs here, its answer is journaled here, and
    the wake goes to the dead worker's home queue, where nothing will take
    it. Not started in time, it is sent again to the coordinator queue: the
    run goes on here by a replay, in the same attempt, and the task ran once.
    (Redis as the broker: the test reads its queue and its unacknowledged
    messages.)"""
    gpu_queue = f"{settings.key_prefix}.gpu"
    keeper = _keeper(settings, fleet, gpu_queue)
    engine = Engine([render_one, adds, hold], _homed(settings), celery_app=_gpu_app(settings, gpu_queue))
    client = engine.client()
    run_id = client.start_workflow("render-one")
    task_id = call_task_id(run_id, "render")
    live = KeySpace(settings.key_prefix).run(run_id).live

    def kept() -> bool:
        """The call sent, the pass over and its message acknowledged (a message
        the keeper had not acknowledged would come back, and its pass wake the
        run by itself)."""
        # This run's unacknowledged messages only (their headers name it): the
        # hash is the broker's, shared with whatever ran on this Redis before.
        unacked = any(run_id in message for message in raw_redis.hvals("unacked"))
        return _queued(raw_redis, gpu_queue, task_id) and not raw_redis.hlen(live) and not unacked

    poll(kept, within=RUN_BOUND, what="the body kept at the call")
    keeper.kill()
    with worker_thread(engine, concurrency=4, queues=[settings.coordinator_queue, settings.steps_queue, gpu_queue]):
        envelope = client.wait_for_workflow_run(run_id, timeout=RUN_BOUND)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == {"item": "x", "rendered": "x.png", "runs": 1}
    assert Gpu(settings, gpu_queue, tmp_path).runs(task_id) == 1, "the task ran once"
    assert envelope.attempt == 1, "not taken over: the wake went to the coordinator queue"


@pytest.mark.slow
def test_a_wake_sent_home_to_a_busy_worker_goes_on_elsewhere_in_the_same_attempt(
    settings: Settings,
    fleet: Fleet,  # noqa: F811
    raw_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keeper has one thread. It keeps a run's body at its first call,
    then takes another run whose inline step holds that thread for 15 s. The
    answer journaled here is sent home, where nothing can start it: sent
    again to the coordinator queue, it goes on here long before the step
    ends, in the same attempt. Before, liveness took it for lost and the run
    was taken over."""
    monkeypatch.setattr(kept_home, "counter", (raw_redis, settings.key_prefix))
    gpu_queue = f"{settings.key_prefix}.gpu"
    _keeper(settings, fleet, gpu_queue, concurrency=1)
    engine = Engine([adds, render_one, hold], _homed(settings), celery_app=_gpu_app(settings, gpu_queue))
    client = engine.client()
    calls = client.start_workflow("adds")
    running = KeySpace(settings.key_prefix).run(calls).running
    poll(lambda: raw_redis.hlen(running), within=RUN_BOUND, what="the first call sent")
    held = client.start_workflow("hold", args={"seconds": 15})
    poll(
        lambda: client.get_workflow_run(held).status == "running",
        within=RUN_BOUND,
        what="the keeper's one thread held",
    )
    started = time.monotonic()
    with worker_thread(engine, concurrency=4, queues=[settings.coordinator_queue, settings.steps_queue, gpu_queue]):
        envelope = client.wait_for_workflow_run(calls, timeout=RUN_BOUND)
        took = time.monotonic() - started
    assert envelope.status == "completed", envelope.error
    assert envelope.result == sum(range(CALLS))
    assert envelope.attempt == 1, "not taken over"
    assert took < 12, f"went on while the keeper's thread was held ({took:.1f} s)"
    assert client.get_workflow_run(held).status == "running", "the long step still runs"


def _keeper(settings: Settings, fleet: Fleet, gpu_queue: str, concurrency: int = 4) -> WorkerProcess:  # noqa: F811
    """The worker process that keeps the bodies: no gpu queue, so its calls run elsewhere."""
    queues = [settings.coordinator_queue, settings.steps_queue]
    env = {"GPU_QUEUE": gpu_queue, "CELERY_DURABLE_HOME_QUEUES": "true"}
    return fleet.start(
        "tests.support.apps.kept_home:engine", name="keeper", queues=queues, env=env, concurrency=concurrency
    )


def _homed(settings: Settings) -> Settings:
    return settings.model_copy(update={"home_queues": True})


def _gpu_app(settings: Settings, gpu_queue: str) -> Celery:
    return make_app(settings.effective_broker_url, gpu_queue, results=settings.redis_url)


def _queued(raw: redis.Redis, queue: str, task_id: str) -> bool:
    """A task's message waits in ``queue`` (nobody consumes it yet)."""
    return any(task_id in message for message in raw.lrange(queue, 0, -1))


def test_an_answer_naming_a_home_that_is_not_this_engines_is_rejected_and_sends_nothing(
    settings: Settings, home_wakes: HomeWakes, caplog: pytest.LogCaptureFixture
) -> None:
    """A message's ``home`` names where a wake is sent: one that is not a
    home queue of this engine (another engine's, or anything else) is refused
    with the rest of the message, before anything is journaled."""
    caplog.set_level(logging.ERROR, logger="celery_durable")
    engine = Engine([render_one], _homed(settings))
    answer = {"run_id": "0" * 32, "epoch": 1, "workflow": "render-one", "key": "render", "task_name": "gpu.render"}
    homes: list[Any] = [
        "elsewhere",
        f"{settings.coordinator_queue}.",
        f"{settings.coordinator_queue}.{settings.steps_queue}",
        "other.coordinator.w@host",
        f"{settings.coordinator_queue}.{'w' * 500}",
        7,
        ["a"],
    ]
    with worker_thread(engine, concurrency=2, queues=[settings.coordinator_queue]):
        for home in homes:
            engine.celery.send_task(
                CALL_RESULT_TASK, args=[1], kwargs={**answer, "home": home}, queue=settings.coordinator_queue
            )

        def rejected() -> list[str]:
            return [r.getMessage() for r in caplog.records if "home is not a home queue" in r.getMessage()]

        poll(lambda: len(rejected()) == len(homes), within=RUN_BOUND, what="every answer to be rejected")
    assert all(message.startswith("rejected call result message") for message in rejected())
    assert home_wakes.count == 0
    assert engine.store.load_run("0" * 32) is None


def test_a_worker_has_a_home_unless_turned_off_and_forgets_it_when_it_stops(settings: Settings) -> None:
    """A stopped worker's bodies are unwound: a call this process sends
    afterwards must not name a queue no one consumes. (A worker stopped by
    a signal sends ``worker_shutdown``; the test's worker thread stops
    another way, so the test sends it, as from another worker first.)"""
    engine = Engine([render_one], _homed(settings))
    with worker_thread(engine, concurrency=2, queues=[settings.coordinator_queue], hostname="homed@test") as worker:
        assert engine.home is not None and engine.home.name == f"{settings.coordinator_queue}.homed@test"
        worker_shutdown.send(sender=object())
        assert engine.home is not None, "another worker's shutdown"
        worker_shutdown.send(sender=worker)
        assert engine.home is None
    gpu_only = Engine([render_one], _homed(settings))
    with worker_thread(gpu_only, concurrency=2, queues=[f"{settings.key_prefix}.gpu"], hostname="gpu@test"):
        assert gpu_only.home is None, "a worker that does not consume the coordinator queue keeps no bodies"
    off = Engine([render_one], settings.model_copy(update={"home_queues": False}))
    with worker_thread(off, concurrency=2, queues=[settings.coordinator_queue], hostname="off@test"):
        assert off.home is None, "settings.home_queues turned off (an upgrade from a version without it)"


def test_a_wake_that_cannot_run_where_the_body_is_kept_goes_to_its_own_home(
    settings: Settings, home_wakes: HomeWakes
) -> None:
    """``gpu.render`` is ``acks_late``, so its answer journaled in place sends
    the wake rather than run the pass inside the user's task. Sent to the
    coordinator queue, any worker of a fleet could take it and replay the
    run; sent home, it comes back to the body here."""

    def run(ctx: WorkflowContext) -> Any:
        return [ctx.call(f"r{i}", "gpu.render", args=(f"i{i}",))["runs"] for i in range(3)]

    gpu_queue = f"{settings.key_prefix}.gpu"
    engine = Engine([wf("own-home", run)], _homed(settings), celery_app=_gpu_app(settings, gpu_queue))
    queues = [settings.coordinator_queue, settings.steps_queue, gpu_queue]
    with worker_thread(engine, concurrency=4, queues=queues, hostname="own@test"):
        envelope = engine.client().run_workflow("own-home", timeout=RUN_BOUND)
        resumed = engine.parked.resumed
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [1, 1, 1]
    assert home_wakes.count == 3, "each wake went to this worker's own home queue"
    assert resumed == 3, "and the kept body went on at each"
