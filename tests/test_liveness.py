"""Leases that never misfire: a backlog is not death, a dead worker is.

A run is alive while its work is in flight: each message of its attempt is
queued or running, and running ones are renewed by their worker. These tests
load real worker processes far past what they can serve within a lease, and
check that nothing is taken over without a fault; then they kill one worker
with SIGKILL and check that exactly the runs whose work it held are taken
over, promptly, and nothing else.
"""

from __future__ import annotations

import base64
import json
import re
import time
from typing import Any

import pytest
import redis

from celery_durable import Engine, Settings, WorkflowContext, define_workflow
from celery_durable.errors import StorageUnavailableError
from tests.support.apps.load import inflight_key, load, ready_key, received_key
from tests.support.fleet import Fleet
from tests.support.poll import RUN_BOUND, START_BOUND, poll

LOAD = "tests.support.apps.load:engine"


def recovered_at(client: Any, run_id: str) -> list[float]:
    """When the sweep took the run over: its 'recovered' system records, in seconds."""
    records = client.get_workflow_run_progress(run_id, limit=500).records
    return [r.at.timestamp() for r in records if r.kind == "system" and r.message.startswith("Run recovered")]


def runs_unacknowledged(raw: redis.Redis) -> set[str]:
    """Runs of the messages in kombu's Redis ``unacked`` hash: taken from a
    queue by a worker's transport and never acknowledged."""
    runs: set[str] = set()
    for text in raw.hvals("unacked"):
        message = json.loads(text)[0]
        _, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        runs.add(str(kwargs.get("run_id")))
    return runs


def why_taken(fleet: Fleet, run_ids: set[str]) -> list[str]:
    """What the workers logged of these runs (why each attempt was judged dead)."""
    if fleet.log_dir is None:
        return sorted(run_ids)
    logs = sorted(fleet.log_dir.glob("*.log"))
    lines = [line for log in logs for line in log.read_text(errors="replace").splitlines()]
    return [line for line in lines if any(run_id in line for run_id in run_ids)] or sorted(run_ids)


def dead_tasks(fleet: Fleet, run_ids: set[str]) -> dict[str, set[str]]:
    """The task each take-over of these runs judged dead, from the workers' logs."""
    found: dict[str, set[str]] = {run_id: set() for run_id in run_ids}
    pattern = re.compile(r"run ([0-9a-f]{32}): attempt died \(.*?task ([0-9a-f]{32})")
    for line in why_taken(fleet, run_ids):
        match = pattern.search(line)
        if match and match.group(1) in found:
            found[match.group(1)].add(match.group(2))
    return found


def start_load(settings: Settings, fleet: Fleet, raw: redis.Redis, runs: int, pause: float) -> tuple[Any, list[str]]:
    workers = [fleet.start(LOAD, concurrency=8, name=f"w{i}") for i in range(2)]
    poll(lambda: raw.scard(ready_key(settings.key_prefix)) >= 2, within=START_BOUND, what="both workers ready")
    client = Engine([load], settings).client()
    run_ids = [client.start_workflow("load", args={"pause": pause}) for _ in range(runs)]
    return (client, workers), run_ids


@pytest.mark.slow
def test_a_backlog_many_leases_long_takes_nothing_over(settings: Settings, fleet: Fleet, raw_redis) -> None:
    """300 runs on two workers at a 3 s lease: the last run waits far longer
    than a lease in the queue, and no run is taken over."""
    settings = settings.model_copy(update={"lease_seconds": 3})
    fleet.settings = settings
    (client, _), run_ids = start_load(settings, fleet, raw_redis, runs=300, pause=0.005)
    envelopes = [client.wait_for_workflow_run(run_id, timeout=240) for run_id in run_ids]
    assert [e.status for e in envelopes] == ["completed"] * len(run_ids), {e.error for e in envelopes}
    assert [e.attempt for e in envelopes] == [1] * len(run_ids)
    assert not any(recovered_at(client, run_id) for run_id in run_ids)


def test_a_worker_tells_the_fleet_which_runs_messages_it_holds(settings: Settings, fleet: Fleet, raw_redis) -> None:
    """Held messages are known by their task's registered name, whatever name
    (Flower's shadow, which says the workflow) the message is shown under."""
    fleet.settings = settings
    worker = fleet.start(LOAD, concurrency=2, name="w0")
    poll(lambda: raw_redis.scard(ready_key(settings.key_prefix)) >= 1, within=START_BOUND, what="the worker ready")
    client = Engine([load], settings).client()
    run_id = client.start_workflow("load", args={"pause": 0.3})

    def reported() -> set[str]:
        keys = raw_redis.keys(f"{settings.key_prefix}:{{fleet}}:held:*/{worker.pid}")
        return {run for key in keys for run in raw_redis.hvals(key)}

    poll(lambda: run_id in reported(), within=RUN_BOUND, what="the worker to report the run's message as held")
    assert client.wait_for_workflow_run(run_id, timeout=60).status == "completed"
    poll(
        lambda: run_id not in reported(),
        within=RUN_BOUND,
        what="the worker to report the message gone once it ended",
    )


def test_a_received_message_is_judged_by_its_workers_beats_not_by_its_queue(durable) -> None:
    """A worker may hold a message it cannot start yet (a countdown, no free
    slot): once it said it received it, an empty queue says nothing of it."""
    d = durable([load], worker=False)
    run_id = d.client.start_workflow("load")
    store = d.engine.store
    [message] = store.client.hkeys(store.run_keys(run_id).live)
    store.hold_messages("worker-a", [(message, run_id)], int(time.time() * 1000))
    assert "|held " in store.client.hget(store.run_keys(run_id).live, message)
    far = int(time.time() * 1000) + 60_000
    empty = f"c={far},s={far},a={far}"
    assert [store.examine(run_id, empty).verdict for _ in range(2)] == ["alive", "alive"]
    assert store.mark_lost(run_id, [message]) == 1  # the worker stopped beating
    assert store.examine(run_id, empty).detail == f"the worker holding task {message} died"


def test_a_held_answer_is_its_runs_for_every_reader_and_given_back_not_marked_lost(durable) -> None:
    """A call's answer is held as ``<run id>@<delivery tag>``: the fleet view
    counts it as its run's, the claim hands its tag back (to be restored in
    the broker) and marks nothing lost, and a held task id the claim could not
    read back is never written (``HELD_TOKEN``)."""
    from types import SimpleNamespace

    from celery_durable.broker.schema.live import HeldMessage
    from celery_durable.tasks.app import CALL_RESULT_TASK, COORDINATOR_TASK
    from celery_durable.tasks.worker_beat import _held

    d = durable([load], worker=False)
    run_id = d.client.start_workflow("load")
    store = d.engine.store
    [message] = store.client.hkeys(store.run_keys(run_id).live)
    answer = HeldMessage(run_id, "tag-1").value()
    store.hold_messages("worker-a", [(message, run_id), ("answer-1", answer)], int(time.time() * 1000))
    assert store.held_messages(["worker-a"]) == {"worker-a": {message: run_id, "answer-1": run_id}}
    [(worker, held)] = store.claim_dead_workers(int(time.time() * 1000) + 1).items()
    assert (worker, held.runs, held.answers) == ("worker-a", {run_id: [message]}, ["tag-1"])

    def request(task: str, task_id: str, tag: str = "tag-1") -> Any:
        kwargs = {"run_id": run_id}
        return SimpleNamespace(type=task, id=task_id, kwargs=kwargs, message=SimpleNamespace(delivery_tag=tag))

    assert _held(request(CALL_RESULT_TASK, "answer-1")) == answer
    assert _held(request(COORDINATOR_TASK, "c-1")) == run_id
    assert _held(request(CALL_RESULT_TASK, "answer-1", tag="x y")) is None
    assert _held(request(COORDINATOR_TASK, "forged|id")) is None


def test_an_answer_waiting_for_its_retry_is_held_after_its_first_delivery_ended(durable, monkeypatch) -> None:
    """An answer that could not be journaled retries under its own task id
    with a countdown: Celery's ``requests`` loses that id when the first
    delivery ends, while the retry waits among the scheduled requests. The
    beat still says it is held, with the retry's delivery tag, also while
    both deliveries are there; and a beat that could not read Celery's sets
    whole says nothing gone."""
    import threading

    from celery.worker import state as worker_state

    from celery_durable.broker.schema.live import HeldMessage
    from celery_durable.tasks.app import CALL_RESULT_TASK
    from celery_durable.tasks.worker_beat import WorkerBeat

    class Request:  # weakly referable, as Celery's are
        def __init__(self, tag: str) -> None:
            self.type, self.id, self.kwargs = CALL_RESULT_TASK, "answer-1", {"run_id": "a" * 32}
            self.message = type("Message", (), {"delivery_tag": tag})()

    class Changing:
        def __iter__(self) -> Any:
            raise RuntimeError("Set changed size during iteration")

    d = durable([load], worker=False)
    store = d.engine.store
    held_key = store.keys.held_prefix + "worker-b"
    beat = WorkerBeat(d.engine, "worker-b", list, 1.0, threading.Event(), lambda act, _: bool(act()))
    olders, retry = [Request(f"tag-old-{i}") for i in range(20)], Request("tag-2")
    retried = {"answer-1": HeldMessage("a" * 32, "tag-2").value()}
    worker_state.scheduled_requests.add(retry)
    try:
        assert worker_state.requests.get("answer-1") is None  # the first delivery ended and took the id along
        beat.beat()
        assert store.client.hgetall(held_key) == retried
        monkeypatch.setattr(worker_state, "scheduled_requests", Changing())
        beat.beat()
        assert store.client.hgetall(held_key) == retried, "a set it could not read is no message gone"
        monkeypatch.undo()
        # Older deliveries reserved with the retry (its countdown was 0), in
        # the set's own order: the newest, by id, wins whatever that order.
        worker_state.scheduled_requests.discard(retry)
        for older in olders:
            worker_state.reserved_requests.add(older)
        worker_state.reserved_requests.add(retry)
        monkeypatch.setitem(worker_state.requests, "answer-1", retry)
        for _ in range(5):
            beat.beat()
            assert store.client.hgetall(held_key) == retried
    finally:
        worker_state.scheduled_requests.discard(retry)
        for older in olders:
            worker_state.reserved_requests.discard(older)
        worker_state.reserved_requests.discard(retry)


def test_a_received_message_that_never_starts_is_dead_a_lease_after(durable) -> None:
    """Celery's prefork pool has been seen to lose a job it handed to a child:
    a live worker's held message that does not start within a lease is dead."""
    d = durable([load], worker=False)
    run_id = d.client.start_workflow("load")
    store = d.engine.store
    [message] = store.client.hkeys(store.run_keys(run_id).live)
    long_ago = int(time.time() * 1000) - store.lease_ms - 1
    store.client.hset(store.run_keys(run_id).live, message, f"q|c|{long_ago}")  # queued and received a lease ago
    store.hold_messages("worker-a", [(message, run_id)], long_ago)
    assert store.examine(run_id, "").detail == f"task {message} was received and never started"


@pytest.mark.slow
def test_a_killed_worker_loses_exactly_its_runs_and_they_are_taken_over_promptly(
    settings: Settings, fleet: Fleet, raw_redis
) -> None:
    settings = settings.model_copy(update={"lease_seconds": 5})
    fleet.settings = settings
    (client, workers), run_ids = start_load(settings, fleet, raw_redis, runs=150, pause=0.01)
    victim = workers[0]
    held_key = inflight_key(settings.key_prefix, victim.pid)
    poll(
        lambda: sum(int(v) > 0 for v in raw_redis.hvals(held_key)) >= 4,
        within=START_BOUND,
        what="the victim to hold work",
    )
    victim.kill()
    killed_at = time.time()
    held = {run_id for run_id, count in raw_redis.hgetall(held_key).items() if int(count) > 0}
    # What the victim had told the fleet it held: each message as it was
    # received, and every running one. A message received in the instant
    # before the kill, after this test's own counter (the same signal calls
    # it first) and before the worker's report, is known to nobody: the
    # empty-queue rule recovers it, with no bound while the queue is busy.
    [reported_key] = raw_redis.keys(f"{settings.key_prefix}:{{fleet}}:held:*/{victim.pid}")
    reported_messages = raw_redis.hgetall(reported_key)  # task id -> run id
    reported = set(reported_messages.values())

    envelopes = {run_id: client.wait_for_workflow_run(run_id, timeout=240) for run_id in run_ids}
    assert [e.status for e in envelopes.values()] == ["completed"] * len(run_ids)
    taken = {run_id for run_id, e in envelopes.items() if e.attempt > 1}
    # A message the victim's transport had taken from the queue and not yet
    # handed to the worker is in no report either; it stays unacknowledged
    # in the broker once every run has finished.
    held |= reported | runs_unacknowledged(raw_redis)
    # Kombu's Redis transport pops a message before it records it as
    # unacknowledged: one the victim popped in the instant of the kill is in
    # none of the above, and gone. Such a take-over is right if no surviving
    # worker ever received the task judged dead; one it received was alive.
    survivors = [w for w in workers if w is not victim]
    seen_alive = {t for w in survivors for t in raw_redis.smembers(received_key(settings.key_prefix, w.pid))}
    unseen = dead_tasks(fleet, taken - held)
    misfired = {run_id for run_id, tasks in unseen.items() if not tasks or tasks & seen_alive}
    assert not misfired, f"runs taken over that the dead worker did not hold: {why_taken(fleet, misfired)}"
    # The bound holds for a message the victim said it held. A run it said
    # it held a message of may have lost another one instead: the report
    # keeps a finished message until the next beat, and a message received
    # in the instant of the kill is in no report yet (the empty-queue rule).
    judged = dead_tasks(fleet, taken & reported)
    prompt = {run_id for run_id, tasks in judged.items() if tasks & reported_messages.keys()}
    assert prompt, "the dead worker held work of these runs, and it died with it"
    for run_id in prompt:
        first = min(recovered_at(client, run_id))
        assert first - killed_at <= settings.lease_seconds + 2, (first - killed_at, why_taken(fleet, {run_id}))


SPIN = {"stop": False, "spinning": False}


def spin(ctx: WorkflowContext) -> Any:
    ctx.step("before", lambda: 1)
    while not SPIN["stop"]:  # never calls the context: no step, no cancelled()
        SPIN["spinning"] = True
        time.sleep(0.01)
    return ctx.step("after", lambda: 2)


spinner = define_workflow({"name": "spinner", "description": "Loops without calling ctx", "phases": []}, spin)


def test_a_spinning_body_is_stopped_by_its_active_time_ceiling(durable) -> None:
    SPIN.update(stop=False, spinning=False)
    d = durable([spinner], lease_seconds=2)
    try:
        started = time.monotonic()
        envelope = d.client.run_workflow("spinner", limits={"timeout_seconds": 2}, timeout=30)
        took = time.monotonic() - started
    finally:
        SPIN["stop"] = True
    assert (envelope.status, envelope.reason) == ("error", "workflow_limit_reached"), envelope.error
    assert envelope.can_resume
    assert took <= 2 + d.settings.lease_seconds + 2, took


def test_cancel_settles_a_spinning_body(durable) -> None:
    SPIN.update(stop=False, spinning=False)
    d = durable([spinner], lease_seconds=2)
    try:
        run_id = d.client.start_workflow("spinner")
        poll(lambda: SPIN["spinning"], within=RUN_BOUND, what="the loop to start")
        envelope = d.client.cancel_workflow_run(run_id, timeout=10)
    finally:
        SPIN["stop"] = True
    assert envelope.status == "cancelled"


def test_a_non_utf8_journal_entry_stops_the_run_as_corrupt_on_the_first_try(durable, raw_redis) -> None:
    gate = {"open": False}

    def run(ctx: WorkflowContext) -> Any:
        ctx.step("a", lambda: 1)
        # The branch holds the run until the journal is damaged; then the
        # coordinator's next pass replays step a from it.
        ctx.parallel([lambda: ctx.step("wait", lambda: poll(
            lambda: gate["open"],
            within=RUN_BOUND,
            what="the damage",
        ))])
        return ctx.step("b", lambda: 2)

    wf = define_workflow({"name": "bytes", "description": "d", "phases": []}, run)
    d = durable([wf], lease_seconds=2, branch_batch_ms=0)  # the branch a task, so the next pass replays
    run_id = d.client.start_workflow("bytes")
    poll(
        lambda: d.client.get_workflow_run(run_id).snapshot["steps_done"] == 1,
        within=RUN_BOUND,
        what="step a journaled",
    )
    journal = d.engine.store.run_keys(run_id).journal
    raw = redis.Redis.from_url(d.settings.redis_url)  # bytes in, bytes out
    raw.hset(journal, "v:a", b"o\xff\xfe not utf-8")
    gate["open"] = True
    envelope = d.client.wait_for_workflow_run(run_id, timeout=20)
    assert (envelope.status, envelope.reason) == ("error", "workflow_storage_corrupt")
    assert envelope.attempt == 1
    resumed = d.client.resume_workflow(run_id, timeout=20)
    assert resumed.reason == "workflow_storage_corrupt" and resumed.attempt == 2


def test_a_stalled_redis_fails_callers_promptly(durable, raw_redis) -> None:
    d = durable([load], worker=False, redis_timeout_seconds=1)
    run_id = d.client.start_workflow("load")
    pauser = redis.Redis.from_url(d.settings.redis_url)
    pauser.execute_command("CLIENT", "PAUSE", 3000, "ALL")
    started = time.monotonic()
    with pytest.raises(StorageUnavailableError):
        d.client.get_workflow_run(run_id)
    assert time.monotonic() - started < 2.5

    def answers() -> bool:
        try:
            return d.client.get_workflow_run(run_id).status == "pending"
        except StorageUnavailableError:
            return False

    poll(answers, within=RUN_BOUND, what="Redis to answer again")


@pytest.mark.slow
def test_a_redis_stall_longer_than_the_lease_takes_nothing_over(settings: Settings, fleet: Fleet, raw_redis) -> None:
    """CLIENT PAUSE for 10 s with 60 runs in flight at a 3 s lease: no heartbeat
    can land, and that is not the workers' silence."""
    settings = settings.model_copy(update={"lease_seconds": 3, "redis_timeout_seconds": 1})
    fleet.settings = settings
    (client, _), run_ids = start_load(settings, fleet, raw_redis, runs=60, pause=0.05)
    poll(
        lambda: sum(client.get_workflow_run(r).status == "running" for r in run_ids) >= 4,
        within=RUN_BOUND,
        what="runs in flight",
    )
    redis.Redis.from_url(settings.redis_url).execute_command("CLIENT", "PAUSE", 10_000, "ALL")
    paused_at = time.monotonic()
    with pytest.raises(StorageUnavailableError):
        client.get_workflow_run(run_ids[0])
    assert time.monotonic() - paused_at < 2.5
    envelopes = []
    for run_id in run_ids:
        while True:
            try:
                envelopes.append(client.wait_for_workflow_run(run_id, timeout=120))
                break
            except StorageUnavailableError:
                continue
    assert [e.status for e in envelopes] == ["completed"] * len(run_ids)
    assert [e.attempt for e in envelopes] == [1] * len(run_ids)


def test_queue_counts_on_redis_keep_their_channel_through_missing_queues(durable) -> None:
    """On Redis a queue nobody sent to does not exist (an empty list), and the
    passive declare's 404 leaves the channel usable: the sweep asks twice a
    second, and a new channel each time cost a ping and a pool."""
    from celery_durable.tasks.queue_depths import BrokerQueues
    from tests.conftest import put_in_steps_queue

    d = durable([], worker=False)
    settings = d.settings
    queues = BrokerQueues(d.engine)
    try:
        assert queues() == [settings.coordinator_queue, settings.steps_queue, settings.agents_queue]
        channel = queues._channel
        assert channel is not None
        put_in_steps_queue(settings)
        assert queues() == [settings.coordinator_queue, settings.agents_queue]
        assert queues._channel is channel
    finally:
        queues.close()
