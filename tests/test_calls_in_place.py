"""A call answered where its task ran (``tasks/in_place.py``).

When the worker that ran a called task consumes the coordinator queue, the
task's link is answered right there and its message never sent; what waited
for the call — the main body, or a branch when the worker consumes the steps
queue too — goes on in the same place. A worker that does not consume the
coordinator queue (a GPU pool with celery-durable installed) sends the
answer, and runs no workflow code.

The messages are counted with Celery's ``before_task_publish`` and
``task_prerun`` signals: the durable worker runs in the test process.
"""

from __future__ import annotations

import functools
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery.signals import before_task_publish, task_prerun

from celery_durable import Engine, Settings, WorkflowContext
from celery_durable.tasks.app import BRANCH_TASK, CALL_RESULT_TASK, COORDINATOR_TASK
from celery_durable.workflows.calls import call_task_id
from tests.conftest import worker_thread
from tests.support.apps.gpu import make_app
from tests.support.gpu_workers import Gpu
from tests.support.poll import RUN_BOUND, poll
from tests.support.workflows import wf

WAKE_ID = re.compile(r"^[0-9a-f]{32}-\d+$")
"""The id of a wake message (``<prefix>-<n>``, see ``wake_owners``)."""


class Messages:
    """What this process published, and which tasks its worker ran."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.ran: Counter[str] = Counter()
        self._lock = threading.Lock()

    def on_publish(self, sender: Any = None, headers: Any = None, **_: Any) -> None:
        with self._lock:
            self.sent.append((str(sender), str((headers or {}).get("id"))))

    def on_prerun(self, sender: Any = None, **_: Any) -> None:
        with self._lock:
            self.ran[sender.name] += 1

    def sent_of(self, task: str, wakes_only: bool = False) -> int:
        with self._lock:
            return sum(1 for name, task_id in self.sent if name == task and (not wakes_only or WAKE_ID.match(task_id)))


@pytest.fixture
def messages() -> Iterator[Messages]:
    seen = Messages()
    before_task_publish.connect(seen.on_publish, weak=False)
    task_prerun.connect(seen.on_prerun, weak=False)
    yield seen
    before_task_publish.disconnect(seen.on_publish)
    task_prerun.disconnect(seen.on_prerun)


def _on_gpu_app(
    settings: Settings, name: str, run: Callable[[WorkflowContext], Any], **overrides: Any
) -> tuple[Engine, list[str]]:
    """An engine mounted on the plain gpu app, with settings ``overrides``, and
    the queues of a worker that serves both (the called tasks run there too)."""
    gpu_queue = f"{settings.key_prefix}.gpu"
    app = make_app(settings.redis_url, gpu_queue)
    engine = Engine([wf(name, run)], settings.model_copy(update=overrides), celery_app=app)
    return engine, [settings.coordinator_queue, settings.steps_queue, gpu_queue]


def _sequence_and_fan_out(ctx: WorkflowContext) -> Any:
    total = 0
    for i in range(6):
        total = ctx.call(f"add-{i}", "gpu.add", args=(total, i))
    sums = ctx.parallel([lambda k=k: ctx.call(f"r{k}", "gpu.add", args=(k, 10)) for k in range(5)])
    return [total, *sums]


def test_a_worker_that_ran_the_task_answers_in_place_and_sends_no_answer(
    settings: Settings, messages: Messages
) -> None:
    engine, queues = _on_gpu_app(settings, "in-place", _sequence_and_fan_out)
    with worker_thread(engine, concurrency=4, queues=queues):
        envelope = engine.client().run_workflow("in-place", timeout=RUN_BOUND)
        resumed = engine.parked.resumed
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [15, 10, 11, 12, 13, 14]
    assert messages.ran["gpu.add"] == 11
    assert messages.sent_of(CALL_RESULT_TASK) == 0, "every answer ran where its task ran"
    assert messages.ran[CALL_RESULT_TASK] == 0
    assert messages.sent_of(BRANCH_TASK, wakes_only=True) == 0, "a branch woken by its answer went on in place"
    assert messages.sent_of(COORDINATOR_TASK, wakes_only=True) == 0, "the main body went on in place"
    assert resumed == 6, "the kept body went on at each answer of the sequence, in the same process"
    steps = engine.client().get_workflow_run_detail(envelope.run_id).steps
    assert sorted(row.status for row in steps) == ["completed"] * 11


def test_an_answer_that_comes_before_its_pass_let_go_waits_for_it_and_sends_nothing(
    settings: Settings, messages: Messages
) -> None:
    """The called task runs on another thread the moment it is sent, so its
    answer can come while the pass that sent it has not yet parked the body
    or released the lock. The answer waits for the release: before, about one
    call in twenty found the lock busy, sent its wake back a lease later and
    had the pass run once more for it."""
    calls = 100

    def run(ctx: WorkflowContext) -> Any:
        total = 0
        for i in range(calls):
            total = ctx.call(f"add-{i}", "gpu.add", args=(total, i))
        return total

    engine, queues = _on_gpu_app(settings, "tight", run)
    with worker_thread(engine, concurrency=4, queues=queues):
        envelope = engine.client().run_workflow("tight", timeout=RUN_BOUND)
        resumed = engine.parked.resumed
    assert envelope.result == sum(range(calls))
    assert messages.sent_of(COORDINATOR_TASK) == 1, "the start only: no wake found the lock busy"
    assert resumed == calls, "the kept body went on at every answer"


@pytest.mark.parametrize(
    ("task", "args", "result"),
    [
        # acks_late: its message stays unacknowledged until the answer returns
        ("gpu.render", ("i",), {"item": "i", "rendered": "i.png", "runs": 1}),
        # a time limit would count the pass against the task, and a soft one
        # would be raised inside workflow code
        ("gpu.add_limited", (1, 2), 3),
    ],
)
def test_after_a_task_whose_options_bind_the_pass_the_answer_is_journaled_in_place_and_the_pass_sent(
    settings: Settings, messages: Messages, task: str, args: tuple[Any, ...], result: Any
) -> None:
    def run(ctx: WorkflowContext) -> Any:
        return [ctx.call(f"c{k}", task, args=args) for k in range(3)]

    engine, queues = _on_gpu_app(settings, "bound", run)
    with worker_thread(engine, concurrency=4, queues=queues):
        envelope = engine.client().run_workflow("bound", timeout=RUN_BOUND)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [result] * 3
    assert messages.sent_of(CALL_RESULT_TASK) == 0, "each answer was journaled where its task ran"
    assert messages.sent_of(COORDINATOR_TASK, wakes_only=True) == 3, "and each pass it woke was sent"
    assert messages.ran[task] == 3


def test_an_answer_in_place_is_the_value_its_message_would_carry(settings: Settings, messages: Messages) -> None:
    """JSON on the wire makes a tuple a list and an int key a string; the
    answer given in place is the same value, not a failure to be JSON."""
    def run(ctx: WorkflowContext) -> Any:
        return ctx.call("pair", "gpu.pair", args=(7,))

    engine, queues = _on_gpu_app(settings, "wired", run)
    with worker_thread(engine, concurrency=4, queues=queues):
        envelope = engine.client().run_workflow("wired", timeout=RUN_BOUND)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [7, {"7": "keyed by an int"}]
    assert messages.sent_of(CALL_RESULT_TASK) == 0


def test_a_pool_without_the_coordinator_queue_sends_the_answer_and_runs_no_workflow_code(
    settings: Settings, messages: Messages, tmp_path: Any
) -> None:
    """The GPU pool has the engine mounted (``tests/support/apps/gpu_engine.py``) but
    consumes only its queue: it runs the called tasks, and every answer comes
    to the durable worker here as a message."""
    gpu = Gpu(settings, f"{settings.key_prefix}.gpu", tmp_path, app_module="tests.support.apps.gpu_engine")
    gpu.start()
    try:
        app = make_app(settings.redis_url, gpu.queue)
        engine = Engine([wf("sent", _sequence_and_fan_out)], settings, celery_app=app)
        with worker_thread(engine, concurrency=4, queues=[settings.coordinator_queue, settings.steps_queue]):
            envelope = engine.client().run_workflow("sent", timeout=RUN_BOUND)
    finally:
        for process in gpu.processes:
            gpu.kill(process)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [15, 10, 11, 12, 13, 14]
    assert messages.ran["gpu.add"] == 0, "the called tasks ran on the GPU pool"
    assert messages.ran[CALL_RESULT_TASK] >= 11, "each answer came here by message"


@pytest.mark.parametrize("kept", [64, 0])
def test_branches_woken_by_their_answers_run_from_kept_thunks_not_a_replay(
    settings: Settings, messages: Messages, kept: int
) -> None:
    """A branch woken by its call's answer runs its thunk from the thunks this
    process kept for the fan-out (``KeptFanout``), without replaying the main
    body; a nested fan-out in it runs in threads and still journals into the
    new execution. With nothing kept, each wake replays the body."""
    width = 24
    tops: list[str] = []

    def run(ctx: WorkflowContext) -> Any:
        tops.append(ctx.run_id)

        def branch(k: int) -> Any:
            doubled = ctx.call(f"a{k}", "gpu.add", args=(k, k))
            steps = ctx.parallel([lambda: ctx.step(f"s{k}-x", lambda: doubled), lambda: ctx.step(f"s{k}-y", lambda: 1)])
            return steps[0] + steps[1]

        return ctx.parallel([functools.partial(branch, k) for k in range(width)])

    engine, queues = _on_gpu_app(settings, "kept-fanout", run, parked_executions=kept)
    with worker_thread(engine, concurrency=4, queues=queues):
        envelope = engine.client().run_workflow("kept-fanout", timeout=RUN_BOUND)
        used = engine.kept_fanouts.used
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [2 * k + 1 for k in range(width)]
    steps = engine.client().get_workflow_run_detail(envelope.run_id).steps
    assert len(steps) == 3 * width and {row.status for row in steps} == {"completed"}
    if kept:
        assert used >= width, "every branch woken by its answer ran from the kept thunks"
        assert len(tops) < width, f"{len(tops)} executions of the body for {width} woken branches"
    else:
        assert used == 0
        assert len(tops) >= width + 2, "a replay per woken branch, and the coordinator's passes"


def _one_call(ctx: WorkflowContext) -> Any:
    return ctx.call("only", "gpu.add", args=(1, 2))


def test_a_kept_body_of_a_settled_run_is_let_go_and_its_wake_is_not_counted_as_refused(settings: Settings) -> None:
    """A wake that finds the body kept but the run over (activate.lua says
    'settled') unwinds the body and is left alone, as a wake that found no
    kept body would be: a settled run is not a stale attempt."""
    gpu_queue = f"{settings.key_prefix}.gpu"
    app = make_app(settings.redis_url, gpu_queue)
    engine = Engine([wf("kept-settled", _one_call)], settings, celery_app=app)
    # Nobody serves the GPU queue: the body stays parked at its call.
    with worker_thread(engine, concurrency=4, queues=[settings.coordinator_queue, settings.steps_queue]):
        client = engine.client()
        run_id = client.start_workflow("kept-settled")
        poll(lambda: len(engine.parked) == 1, within=RUN_BOUND, what="the body to park at its call")
        refused = engine.refused_messages
        # The run settles behind the worker's back (as a cancel from another
        # process would, before any wake reaches this one): the body stays kept.
        record = engine.store.load_run(run_id)
        assert record is not None
        engine.store.client.hset(engine.store.run_keys(run_id).run, "status", "cancelled")
        assert len(engine.parked) == 1
        engine.send_coordinator(run_id, record.epoch, "kept-settled")
        poll(lambda: len(engine.parked) == 0, within=RUN_BOUND, what="the wake to let the kept body go")
        assert engine.refused_messages == refused
        assert client.get_workflow_run(run_id).status == "cancelled"


def test_a_branch_of_one_call_costs_five_scripts(settings: Settings) -> None:
    """Per branch of one call: the call (``call.lua``), its answer
    (``call_done``, after the run's look: ``look.lua``, in the same round
    trip, since the answer may wake a run nothing else watches), and the
    woken branch task's start (``branch_start``: the run record, its lease,
    its outcome and its sequence in one script) and
    end (``complete_branch`` ending its message). Separately, the woken task
    cost four scripts and three plain reads (load_run,
    task_start, read_sequences, two HMGETs, complete_branch, task_end).

    The count also holds what the worker runs on its own clock meanwhile (its
    beats, its sweep: about 11 scripts a second at the tests' lease), so the
    slack grows with the run's time at the rate the idle worker showed: a
    loaded machine's slower run is not more scripts per branch."""
    width = 40

    def run(ctx: WorkflowContext) -> Any:
        return ctx.parallel([lambda k=k: ctx.call(f"r{k}", "gpu.add", args=(k, 1)) for k in range(width)])

    engine, queues = _on_gpu_app(settings, "woken-cost", run, branch_batch_ms=60_000)
    client = engine.store.client
    with worker_thread(engine, concurrency=4, queues=queues):
        engine.client().run_workflow("woken-cost", timeout=RUN_BOUND)  # scripts loaded, worker warm
        idle = _scripts_per_second(client, seconds=2.0)
        before, started = _scripts(client), time.monotonic()
        envelope = engine.client().run_workflow("woken-cost", timeout=RUN_BOUND)
        spent, took = _scripts(client) - before, time.monotonic() - started
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [k + 1 for k in range(width)]
    background = math.ceil(2 * idle * took)  # twice the idle rate: the sweep's ticks are not evenly spread
    assert 5 * width <= spent <= 5 * width + 30 + background, (spent, took, idle)


def _scripts_per_second(client: Any, *, seconds: float) -> float:
    """The scripts an idle worker runs on its own clock, a second."""
    before, started = _scripts(client), time.monotonic()
    time.sleep(seconds)  # a window to count in, not a synchronisation
    return (_scripts(client) - before) / (time.monotonic() - started)


def _scripts(client: Any) -> int:
    """Lua scripts Redis has run so far (commandstats also counts the commands
    a script runs, so only the scripts themselves say what a caller asked)."""
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))


def test_a_kept_body_sends_its_calls_and_branches_without_building_a_result_backend(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery builds the app's result backend once per thread, for the
    ``AsyncResult`` that ``send_task`` returns; each kept main body runs on a
    thread of its own, so each run built one (a Redis client and package
    metadata read from disk). The engine's sends return only their id."""
    from celery.backends.redis import RedisBackend

    built: list[int] = []
    original = RedisBackend.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(threading.get_ident())
        original(self, *args, **kwargs)

    engine, queues = _on_gpu_app(settings, "no-backend", _sequence_and_fan_out)
    with worker_thread(engine, concurrency=4, queues=queues):
        client = engine.client()
        for _ in range(2):  # the pool's threads store results: theirs are built
            client.run_workflow("no-backend", timeout=RUN_BOUND)
        monkeypatch.setattr(RedisBackend, "__init__", counting)
        envelopes = [client.run_workflow("no-backend", timeout=RUN_BOUND) for _ in range(8)]
    assert [e.result for e in envelopes] == [[15, 10, 11, 12, 13, 14]] * 8
    # A thread new to this process builds one (a body thread started while
    # the last one was still on its way back to the idle list, a pool thread
    # that stored no result yet); a run never does.
    assert len(built) <= 3, f"{len(built)} result backends built for 8 runs"


def test_a_worker_does_not_stay_subscribed_to_the_results_of_the_calls_it_sent(settings: Settings) -> None:
    """``send_task`` subscribes to the sent task's result channel on the
    app's Redis result backend (joins do not block in a threads pool). The
    answer comes by the task's link, so the engine lets the subscription go:
    before, a worker was still subscribed to all 30 after 30 calls, with
    every result's publish queued unread on its connection. Whether the
    task stores its result stays the task's own choice."""
    calls = 30

    def run(ctx: WorkflowContext) -> Any:
        total = 0
        for i in range(calls):
            total = ctx.call(f"add-{i}", "gpu.add", args=(total, i))
        return ctx.call("quiet", "gpu.add_quietly", args=(total, 0))

    engine, queues = _on_gpu_app(settings, "unsubscribed", run)
    redis_client = engine.store.client

    def subscriptions() -> int:
        return sum(int(client.get("sub", 0)) for client in redis_client.client_list())

    with worker_thread(engine, concurrency=4, queues=queues):
        envelope = engine.client().run_workflow("unsubscribed", timeout=RUN_BOUND)
        assert envelope.result == sum(range(calls))
        poll(lambda: subscriptions() == 0, within=RUN_BOUND, what="the worker to let the calls' result channels go")
        # The called task still stores its result, as Celery's default has it.
        app = engine.celery
        last = app.AsyncResult(call_task_id(envelope.run_id, f"add-{calls - 1}"))
        assert last.get(timeout=RUN_BOUND) == sum(range(calls))
        # A task whose own option is ignore_result keeps none.
        assert app.backend.get_task_meta(call_task_id(envelope.run_id, "quiet"))["status"] == "PENDING"
