"""Celery-native (SPEC §5a): an engine mounted on a team's app, calling its tasks.

The called tasks run on a plain ``celery worker`` process that imports only
``tests/support/apps/gpu.py`` — no engine, no celery-durable task. The durable side
runs on a worker in the test process, on the same app.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_durable import Engine, Settings, StepFailed, WorkflowContext
from celery_durable.tasks.app import AGENT_TASK, BRANCH_TASK, COORDINATOR_TASK
from celery_durable.workflows.calls import call_task_id
from tests.conftest import worker_thread
from tests.support.apps.gpu import make_app
from tests.support.fleet import ROOT, Fleet, settings_env
from tests.support.gpu_workers import Gpu
from tests.support.hostile import UNPICKLED, Unpickles
from tests.support.poll import RUN_BOUND, START_BOUND, lease_bound, poll
from tests.support.workflows import refusal_of, wf

TIMEOUT = 40


@pytest.fixture
def gpu(settings: Settings, tmp_path: Path) -> Iterator[Gpu]:
    fleet = Gpu(settings, f"{settings.key_prefix}.gpu", tmp_path)
    fleet.start()
    yield fleet
    for process in fleet.processes:
        fleet.kill(process)


@contextlib.contextmanager
def mounted(
    settings: Settings, gpu: Gpu, workflows: list[Any], concurrency: int = 4
) -> Iterator[tuple[Engine, Celery]]:
    """The team's app in this process, an engine mounted on it, a durable worker."""
    app = make_app(settings.redis_url, gpu.queue)
    engine = Engine(workflows, settings, celery_app=app)
    with worker_thread(engine, concurrency=concurrency, queues=[settings.coordinator_queue, settings.steps_queue]):
        yield engine, app


def test_calls_run_on_a_plain_worker_and_their_results_are_journaled(settings: Settings, gpu: Gpu) -> None:
    app = make_app(settings.redis_url, gpu.queue)
    signature = app.signature("gpu.render", args=("c",))

    def run(ctx: WorkflowContext) -> Any:
        first = ctx.call("a", app.tasks["gpu.render"], args=("a",))
        rest = ctx.parallel([
            lambda: ctx.call("b", "gpu.render", kwargs={"item": "b"}),
            lambda: ctx.call("c", signature),
        ])
        again = ctx.call("a", "gpu.render", args=("ignored",))  # the key is the identity: a hit
        return [first["rendered"], *(r["rendered"] for r in rest), again["item"]]

    engine = Engine([wf("render", run)], settings, celery_app=app)
    with worker_thread(engine, concurrency=2, queues=[settings.coordinator_queue, settings.steps_queue]):
        envelope = engine.client().run_workflow("render", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == ["a.png", "b.png", "c.png", "a"]
    for key in "abc":
        assert gpu.runs(call_task_id(envelope.run_id, key)) == 1, key
    steps = {row.key: row.status for row in engine.client().get_workflow_run_detail(envelope.run_id).steps}
    assert steps == {"a": "completed", "b": "completed", "c": "completed"}


def test_a_call_holds_no_worker_slot(settings: Settings, gpu: Gpu) -> None:
    def run(ctx: WorkflowContext) -> Any:
        return ctx.call("slow", "gpu.render", args=(ctx.run_id, 1.0))["item"]

    with mounted(settings, gpu, [wf("slow", run)], concurrency=1) as (engine, _):
        client = engine.client()
        gpu.ready()
        started = time.monotonic()
        run_ids = [client.start_workflow("slow") for _ in range(2)]
        results = [client.wait_for_workflow_run(r, timeout=TIMEOUT).result for r in run_ids]
        took = time.monotonic() - started
    assert results == run_ids
    assert took < 1.9, f"two 1 s calls on one durable slot took {took:.1f}s: the slot was held"


@pytest.mark.parametrize("parked", [64, 0])
def test_calls_in_a_row_go_on_from_the_kept_body_or_replay_alike(settings: Settings, gpu: Gpu, parked: int) -> None:
    """A main body waiting for a call stays parked in its worker process; the
    answer's pass goes on from the call instead of replaying the run. With
    nothing kept, every pass replays; the run is the same either way."""
    tops: list[str] = []

    def run(ctx: WorkflowContext) -> Any:
        tops.append(ctx.run_id)
        total = 0
        for i in range(12):
            total = ctx.call(f"add-{i}", "gpu.add", args=(total, i))
        return total

    settings = settings.model_copy(update={"parked_executions": parked})
    with mounted(settings, gpu, [wf("adds", run)]) as (engine, _):
        envelope = engine.client().run_workflow("adds", timeout=TIMEOUT)
        resumed = engine.parked.resumed
        assert len(engine.parked) == 0, "a body that ended is not kept"
    assert envelope.status == "completed", envelope.error
    assert envelope.result == sum(range(12))
    steps = engine.client().get_workflow_run_detail(envelope.run_id).steps
    assert [row.status for row in steps] == ["completed"] * 12
    if parked:
        assert (len(tops), resumed) == (1, 12), "one execution from the top, resumed at each answer"
    else:
        assert (len(tops), resumed) == (13, 0), "a replay per answer"


def test_a_run_parked_at_a_call_is_cancelled_at_once_and_its_body_let_go(settings: Settings, gpu: Gpu) -> None:
    def run(ctx: WorkflowContext) -> Any:
        return ctx.call("slow", "gpu.render", args=(ctx.run_id, 20.0))

    with mounted(settings, gpu, [wf("parked", run)]) as (engine, _):
        client = engine.client()
        run_id = client.start_workflow("parked")
        poll(lambda: len(engine.parked) == 1, within=RUN_BOUND, what="the body parked at its call")
        started = time.monotonic()
        envelope = client.cancel_workflow_run(run_id, timeout=TIMEOUT)
        took = time.monotonic() - started
        assert envelope.status == "cancelled", envelope.error
        assert len(engine.parked) == 0
    assert took < 5, f"cancelling a run parked at a 20 s call took {took:.1f}s"


def test_a_failed_call_is_a_step_failure_with_the_tasks_exception(settings: Settings, gpu: Gpu) -> None:
    def run(ctx: WorkflowContext) -> Any:
        try:
            ctx.call("broken", "gpu.broken", args=("frame 7",), timeout=20)
        except StepFailed as exc:
            return [exc.key, exc.error_type, exc.error_message]
        return "no failure"

    with mounted(settings, gpu, [wf("broken", run)]) as (engine, _):
        envelope = engine.client().run_workflow("broken", timeout=TIMEOUT)
    assert envelope.result == ["broken", "KeyError", "'frame 7'"]


def test_a_call_nobody_answers_times_out_with_a_clear_error(settings: Settings, gpu: Gpu) -> None:
    def run(ctx: WorkflowContext) -> Any:
        answers = []
        for key, task, queue in (("unknown", "gpu.no_such_task", None), ("unserved", "gpu.render", "nobody.serves")):
            try:
                ctx.call(key, task, args=("x",), queue=queue, timeout=1)
            except StepFailed as exc:
                answers.append([exc.error_type, str(exc)])
        return answers

    with mounted(settings, gpu, [wf("silent", run)]) as (engine, _):
        envelope = engine.client().run_workflow("silent", timeout=TIMEOUT)
    assert envelope.result == [
        ["TaskTimeout", "Task gpu.no_such_task (call unknown) did not finish within 1 s"],
        ["TaskTimeout", "Task gpu.render (call unserved) did not finish within 1 s (queue nobody.serves)"],
    ]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ctx: ctx.call("k", "gpu.render", args=({1, 2},)), "'k' arguments must be JSON values"),
        (lambda ctx: ctx.call("k", "gpu.render", args="ab"), "args must be a list"),
        (lambda ctx: ctx.call("k", 42), "task must be a Celery task, a task name or a signature"),
        (lambda ctx: ctx.call("k", ""), "task name must be a non-empty string"),
        (lambda ctx: ctx.call("", "gpu.render"), "Call key must be a non-empty string"),
        (lambda ctx: ctx.call("\ud800", "gpu.render"), "Call key holds a lone surrogate: '\\ud800'"),
        (lambda ctx: ctx.call("k", "gpu.render", timeout=-1), "timeout must be above 0"),
        (lambda ctx: ctx.call("k", ctx.args["linked"]), "carries its own link"),
        (lambda ctx: ctx.call("k", ctx.args["with_id"]), "carries its own task_id"),
    ],
)
def test_bad_calls_are_refused_at_the_call_and_journal_nothing(
    settings: Settings, gpu: Gpu, call: Any, message: str
) -> None:
    app = make_app(settings.redis_url, gpu.queue)
    signatures = {
        "linked": app.signature("gpu.render", args=("x",), link=app.signature("gpu.add", args=(1,))),
        "with_id": app.signature("gpu.render", args=("x",), task_id="mine"),
    }

    def run(ctx: WorkflowContext) -> Any:
        ctx.args.update(signatures)
        return {"caught": refusal_of(lambda: call(ctx)), "after": ctx.call("after", "gpu.add", args=(2, 3))}

    engine = Engine([wf("bad-call", run)], settings, celery_app=app)
    with worker_thread(engine, concurrency=2, queues=[settings.coordinator_queue, settings.steps_queue]):
        envelope = engine.client().run_workflow("bad-call", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert message in envelope.result["caught"]
    assert envelope.result["after"] == 5
    record = engine.store.load_run(envelope.run_id)
    assert record is not None
    journal = engine.store.replay_journal(record).read_sequence("m")  # archived or not (issue 42)
    assert [identity for _, identity, _ in journal.entries] == ["c|after"]


def test_a_result_that_is_not_json_fails_the_call_naming_it(settings: Settings, gpu: Gpu) -> None:
    def run(ctx: WorkflowContext) -> Any:
        try:
            ctx.call("nan", "gpu.not_json", timeout=20)
        except StepFailed as exc:
            return str(exc)
        return "no failure"

    with mounted(settings, gpu, [wf("nan", run)]) as (engine, _):
        assert engine.client().run_workflow("nan", timeout=TIMEOUT).result == "Step result must be a JSON value: nan"


def test_a_stale_attempts_call_result_is_refused_by_the_fence(settings: Settings, gpu: Gpu) -> None:
    def run(ctx: WorkflowContext) -> Any:
        return ctx.call("slow", "gpu.render", args=("s", 1.5))

    with mounted(settings, gpu, [wf("stale-call", run)]) as (engine, _):
        client = engine.client()
        run_id = client.start_workflow("stale-call")
        task_id = call_task_id(run_id, "slow")
        poll(lambda: gpu.runs(task_id) == 1, within=RUN_BOUND, what="the first delivery to start")
        resumed = client.resume_workflow(run_id, force=True, timeout=TIMEOUT)
        assert resumed.status == "completed" and resumed.attempt == 2
        poll(
            lambda: engine.store.refused_writes(run_id) >= 1,
            within=RUN_BOUND,
            what="the first attempt's answer to be refused",
        )
    assert gpu.runs(task_id) == 2, "the same task id, published again by the new attempt"
    assert resumed.result["runs"] == 2, "the new attempt's answer, not the old one's"


@pytest.mark.slow
def test_a_calls_worker_killed_mid_task_is_redelivered_and_one_result_journaled(settings: Settings, gpu: Gpu) -> None:
    def run(ctx: WorkflowContext) -> Any:
        return ctx.call("render", "gpu.render", args=("k", 2.0))

    with mounted(settings, gpu, [wf("killed-call", run)]) as (engine, _):
        client = engine.client()
        run_id = client.start_workflow("killed-call")
        task_id = call_task_id(run_id, "render")
        poll(lambda: gpu.runs(task_id) == 1, within=RUN_BOUND, what="the task to start")
        gpu.kill(gpu.processes[0])
        gpu.start()
        # A new worker process starts, its transport restores the unacked
        # message (visibility 4 s, tests/support/apps/gpu.py), and the run ends.
        envelope = client.wait_for_workflow_run(run_id, timeout=START_BOUND + RUN_BOUND)
    assert envelope.status == "completed" and envelope.attempt == 1
    assert envelope.result["runs"] == 2, "delivered again after its worker died"
    assert gpu.runs(task_id) == 2


ANSWER_DIES = "tests.support.apps.answer_dies:engine"


@pytest.mark.slow
@pytest.mark.topologies("redis", "rabbitmq")
def test_an_answer_whose_worker_died_holding_it_is_given_back_within_a_lease(settings: Settings, fleet: Fleet) -> None:
    """A call's answer is no run's message in flight: a worker that died
    holding it left it unacknowledged in Redis for the engine's visibility
    timeout (6 hours), and the run waited that long. The sweep that buries
    the worker gives it back: the run ends in its first attempt, the called
    task run once. (RabbitMQ gives a dead consumer's messages back itself.)"""
    from tests.support.apps import answer_dies

    queues = [settings.coordinator_queue, settings.steps_queue]
    fleet.start(ANSWER_DIES, queues=[f"{settings.key_prefix}.calls"], name="calls")
    dying = fleet.start(ANSWER_DIES, queues=queues, env={"DIE_HOLDING_ANSWER": "1"}, name="dying")
    client = Engine([answer_dies.answered_call], settings).client()
    run_id = client.start_workflow("answered-call")
    poll(lambda: not dying.alive(), within=START_BOUND + RUN_BOUND, what="the worker to die holding the answer")
    raw = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    runs = f"{settings.key_prefix}:test:runs:{call_task_id(run_id, 'render')}"
    assert raw.get(runs) == "1"
    assert client.get_workflow_run(run_id).status == "running"

    fleet.start(ANSWER_DIES, queues=queues, name="after")
    envelope = client.wait_for_workflow_run(run_id, timeout=START_BOUND + lease_bound(settings, 2) + RUN_BOUND)
    assert (envelope.status, envelope.attempt) == ("completed", 1), envelope.error
    assert envelope.result == {"item": "a", "runs": 1}
    assert raw.get(runs) == "1", "the called task ran once"


def test_user_tasks_keep_celerys_defaults_and_their_results_on_both_apps(settings: Settings, gpu: Gpu) -> None:
    own = Engine([wf("noop", lambda ctx: 1)], settings)
    assert own.celery.conf.task_default_queue == "celery"
    assert not own.celery.conf.task_ignore_result and not own.celery.conf.task_acks_late
    own.celery.conf.result_backend = settings.redis_url

    @own.celery.task(name="user.triple", shared=False)
    def triple(x: int) -> int:
        return x * 3

    assert own.celery.amqp.router.route({}, "user.triple")["queue"].name == "celery"
    with worker_thread(own, concurrency=2, queues=["celery"]):
        assert triple.delay(4).get(timeout=TIMEOUT) == 12

    app = make_app(settings.redis_url, gpu.queue)
    Engine([wf("noop", lambda ctx: 1)], settings, celery_app=app)
    assert app.tasks["gpu.add"].delay(2, 2).get(timeout=TIMEOUT) == 4, "on the plain worker, through its backend"


def test_a_call_without_queue_goes_where_the_tasks_own_routing_says(settings: Settings) -> None:
    """SPEC §5a: ``queue=`` wins; else the task's own routing applies, its
    ``queue`` option included (not only ``task_routes``). Sent with an
    explicit ``queue=None``, Celery let that None override the task's own
    queue and routed the call to the default queue, which nobody serves here."""
    own_queue = f"{settings.key_prefix}.own"

    def run(ctx: WorkflowContext) -> Any:
        return ctx.call("t", "user.tagged", args=(4,))

    own = Engine([wf("tagged", run)], settings)

    @own.celery.task(name="user.tagged", queue=own_queue, shared=False)
    def tagged(x: int) -> int:
        return x * 3

    with worker_thread(own, concurrency=2, queues=[settings.coordinator_queue, settings.steps_queue, own_queue]):
        envelope = own.client().run_workflow("tagged", timeout=TIMEOUT)
    assert (envelope.status, envelope.result) == ("completed", 12), envelope.error


def test_a_catch_all_route_of_the_app_leaves_the_durable_messages_on_their_queues(settings: Settings) -> None:
    """SPEC §5a: mounting changes nothing for the app's tasks, and the app's
    routing nothing for the engine's. A route for every task (``"*"``) that
    names an exchange and a routing key was merged into the engine's messages,
    which named only their queue, and into a call's answer links: they left
    for the team's queue, which no durable worker serves, and the run never
    finished. Nothing here consumes the team's queue."""
    team, calls = f"{settings.key_prefix}.team", f"{settings.key_prefix}.calls"
    app = Celery("team", broker=settings.redis_url, set_as_current=False)
    app.conf.task_routes = {"*": {"queue": team, "exchange": team, "routing_key": team}}

    @app.task(name="team.double", shared=False)
    def double(x: int) -> int:
        return 2 * x

    def run(ctx: WorkflowContext) -> Any:
        one = ctx.step("one", lambda: 1)
        both = ctx.parallel([lambda: ctx.step("a", lambda: 2), lambda: ctx.step("b", lambda: 3)])
        return ctx.call("d", "team.double", args=(one + sum(both),), queue=calls)

    engine = Engine([wf("routed", run)], settings, celery_app=app)
    with worker_thread(engine, concurrency=4, queues=[settings.coordinator_queue, settings.steps_queue, calls]):
        envelope = engine.client().run_workflow("routed", timeout=RUN_BOUND)
    assert (envelope.status, envelope.result) == ("completed", 12), envelope.error


def test_durable_tasks_keep_their_guarantees_on_an_app_that_differs(settings: Settings, gpu: Gpu, caplog) -> None:
    app = make_app(settings.redis_url, gpu.queue, accept_pickle=True)  # and early acks, prefetch 4
    app.conf.worker_hijack_root_logger = False  # the test reads the worker's log through pytest
    engine = Engine([wf("plain", lambda ctx: ctx.step("s", lambda: 7))], settings, celery_app=app)
    for name in (COORDINATOR_TASK, BRANCH_TASK, AGENT_TASK):
        task = app.tasks[name]
        assert (task.acks_late, task.reject_on_worker_lost, task.ignore_result) == (True, True, True), name
    assert not app.conf.task_acks_late and "pickle" in app.conf.accept_content, "the app's own settings stand"
    caplog.set_level(logging.ERROR, logger="celery_durable")
    with worker_thread(engine, concurrency=2, queues=[settings.coordinator_queue, settings.steps_queue]):
        client = engine.client()
        run_id = client.start_workflow("plain")
        # Refused before anything loads it: Celery's own strategy decoded the
        # body in the consumer (the app accepts pickle), running what it said.
        tag = uuid.uuid4().hex
        forged = app.send_task(
            COORDINATOR_TASK, kwargs={"run_id": run_id, "epoch": 1, "workflow": "plain", "x": Unpickles(tag)},
            queue=settings.coordinator_queue, serializer="pickle",
        )
        envelope = client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
        poll(
            lambda: any(forged.id in r.getMessage() and "not JSON" in r.getMessage() for r in caplog.records),
            within=RUN_BOUND,
            what="the pickled message to be refused",
        )
    assert envelope.status == "completed" and envelope.result == 7
    assert tag not in UNPICKLED, "the worker unpickled a message of a durable task"


def test_two_engines_on_one_broker_stay_apart(redis_server: Any, tmp_path: Path) -> None:
    """Two key prefixes, each with its own queue names (README): each engine's
    worker takes its own runs' messages only, and both finish."""
    from tests.support.apps.basic import fan
    from tests.support.fleet import WorkerProcess

    def apart(prefix: str) -> Settings:
        queues = {f"{kind}_queue": f"durable.{prefix}.{kind}" for kind in ("coordinator", "steps", "agents")}
        return Settings(redis_url=redis_server.url, key_prefix=prefix, **queues)

    settings = [apart(f"two{n}x{os.getpid()}") for n in (1, 2)]
    workers = [
        WorkerProcess(s, "tests.support.apps.basic:engine", log_dir=tmp_path, name=f"engine{n}").start()
        for n, s in enumerate(settings)
    ]
    try:
        for s in settings:
            client = Engine([fan], s).client()
            envelope = client.run_workflow("fan", args={"count": 2, "seconds": 0}, timeout=TIMEOUT)
            assert (envelope.status, envelope.attempt) == ("completed", 1)
    finally:
        for worker in workers:
            worker.kill()
    logs = "".join(path.read_text() for path in tmp_path.glob("engine*.log"))
    assert "refused" not in logs


def test_the_render_example_calls_the_fleet_from_a_fan_out(settings: Settings, tmp_path: Path) -> None:
    """examples/render.py on examples/fleet_tasks.py's own worker, as the README says."""
    env = {**settings_env(settings)}
    log = open(tmp_path / "fleet.log", "ab")  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "examples.fleet_tasks", "worker", "-Q", "gpu", "-P", "threads",
         "-c", "2", "--loglevel", "WARNING"],
        env=env, cwd=ROOT, stdout=log, stderr=log, start_new_session=True,
    )
    try:
        from tests.support.fleet import WorkerProcess

        durable = WorkerProcess(settings, "examples.render:engine", log_dir=tmp_path, name="durable").start()
        try:
            urls = ["https://example.com/a.png", "https://example.com/b.png", "ftp://example.com/c.png"]
            from examples.render import render_gallery

            client = Engine([render_gallery], settings).client()
            envelope = client.run_workflow("render-gallery", args={"urls": urls}, timeout=60)
        finally:
            durable.kill()
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    assert envelope.status == "completed", envelope.error
    assert (envelope.result["images"], envelope.result["failed"]) == (3, 1)
    logs = [r.message for r in client.get_workflow_run_progress(envelope.run_id).records if r.kind == "log"]
    assert logs == ["ftp://example.com/c.png: ValueError: not an image URL: ftp://example.com/c.png"]
