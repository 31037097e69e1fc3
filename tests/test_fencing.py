"""SPEC §8 execution authority: the epoch fences out every older attempt.

A worker frozen mid-step wakes after another worker took the run over and
finished it; task messages arrive twice, from an older epoch, or forged; an
older attempt calls the store directly. In every case the run must not change.

Frozen workers are real ``celery-durable worker`` processes stopped with
SIGSTOP by process group; the message tests use an in-process worker so they
can observe exactly when a message has been handled (``task_postrun``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from celery.signals import task_postrun

from celery_durable import Client, Engine, Settings, StaleAttemptError, workflow
from celery_durable.broker import RunStore
from celery_durable.broker.journal import BeginCall, PendingCommit
from celery_durable.broker.schema import StepRow
from celery_durable.tasks.app import BRANCH_TASK, COORDINATOR_TASK
from celery_durable.tasks.coordinator import run_coordinator_task
from tests.support.apps.trip import SERVICES, trip
from tests.support.poll import RUN_BOUND, poll
from tests.support.trip_crash import receipts

TRIP = "tests.support.apps.trip:engine"
TIMEOUT = 30
GATE_SECONDS = 30
"""How long a gated step waits for the test before it gives up (a safety net, not a pause)."""


# -- polling and observing -------------------------------------------------------


def stays(predicate: Callable[[], bool], what: str, seconds: float = 0.5) -> None:
    """Assert ``predicate`` holds on every look for ``seconds`` (a check, not a wait for something)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), what
        time.sleep(0.05)
    assert predicate(), what


HEARTBEAT_FIELDS = frozenset({"lease_until", "lock_until"})
"""Run fields a live attempt's heartbeat refreshes while it works."""


def durable_state(store: RunStore, run_id: str, *, ignore: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Everything Redis holds for one run, whatever the key: its record (less
    the fields in ``ignore``, and with them the expiries of running messages),
    journal, step rows, progress and indexes."""
    client = store.client
    run_key = store.run_keys(run_id).run
    base = run_key.removesuffix(":run")
    state: dict[str, Any] = {}
    for key in sorted(client.scan_iter(match=f"{base}:*", count=1000)):
        kind = client.type(key)
        if kind == "hash":
            value: Any = client.hgetall(key)
            if key == run_key:
                value = {name: field for name, field in value.items() if name not in ignore}
            elif key == f"{base}:live" and ignore:
                # A running message's entry is 'x|<expiry>': heartbeats move the expiry.
                value = {name: "x|" if entry.startswith("x|") else entry for name, entry in value.items()}
        elif kind == "stream":
            value = client.xrange(key)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif key == f"{base}:archive":
            value = store.archive(run_id)  # zlib: what it holds, not its bytes
        else:
            value = client.get(key)
        state[key.removeprefix(base)] = value
    assert ":run" in state and (":journal" in state or ":archive" in state), sorted(state)
    return state


def fanout_call(store: RunStore, run_id: str) -> str:
    """The call id of the run's one fan-out, as its journal names it."""
    calls = [field[2:] for field in store.hashes(run_id).journal if field.startswith("d:")]  # archived or not
    assert len(calls) == 1, calls
    return calls[0]


def queues_empty(raw: redis.Redis, settings: Settings, *, steps: bool = True) -> bool:
    """No message of this test waiting in its queues nor delivered and unacknowledged
    (acks are late: a task is acknowledged when it returns). ``raw`` is the
    journal's Redis; the broker is read where ``broker_url`` says, when that is
    another Redis (as beside a Redis Cluster journal)."""
    ours = {settings.coordinator_queue, settings.steps_queue} if steps else {settings.coordinator_queue}
    with contextlib.ExitStack() as stack:
        broker = raw
        if settings.broker_url and settings.broker_url != settings.redis_url:
            broker = stack.enter_context(redis.Redis.from_url(settings.broker_url, decode_responses=True))
        if any(broker.llen(queue) for queue in ours):
            return False
        # Kombu's Redis transport keeps delivered, unacknowledged messages in one
        # hash: [payload, exchange, routing key], the routing key being the queue.
        return not any(json.loads(entry)[2] in ours for entry in broker.hvals("unacked"))


@contextlib.contextmanager
def finished_tasks() -> Iterator[list[str]]:
    """Ids of every task that returned in this process (in-process workers), in order."""
    done: list[str] = []

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        if task_id:
            done.append(task_id)

    task_postrun.connect(on_postrun, weak=False)
    try:
        yield done
    finally:
        task_postrun.disconnect(on_postrun)


def handled(done: list[str], task_ids: list[str]) -> Callable[[], bool]:
    return lambda: set(task_ids) <= set(done)


# -- workflows for in-process workers -----------------------------------------------

_LOCK = threading.Lock()
CALLS: Counter[str] = Counter()
GATES: dict[str, tuple[threading.Event, threading.Event]] = {}


@pytest.fixture(autouse=True)
def _reset_shared_state(durable: Any) -> Iterator[None]:
    # Depends on ``durable`` so that it is torn down first: gates open before
    # the in-process workers are stopped, never leaving one blocked at a gate.
    with _LOCK:
        CALLS.clear()
        GATES.clear()
    yield
    with _LOCK:
        for _entered, release in GATES.values():
            release.set()


def gate(name: str) -> tuple[threading.Event, threading.Event]:
    """(entered, release) of the gate a step named ``name`` holds at."""
    with _LOCK:
        return GATES.setdefault(name, (threading.Event(), threading.Event()))


def calls() -> dict[str, int]:
    with _LOCK:
        return dict(CALLS)


def produce(name: str, value: Any, *, hold: bool = False, fail_first: bool = False) -> Any:
    """A producer: counts its calls, may fail on its first call, may hold at its gate."""
    with _LOCK:
        CALLS[name] += 1
        first = CALLS[name] == 1
    if fail_first and first:
        raise RuntimeError(f"{name}: transient outage")
    if hold:
        entered, release = gate(name)
        entered.set()
        if not release.wait(GATE_SECONDS):
            raise RuntimeError(f"the test never opened the gate of {name}")
    return value


@workflow(name="fence-fan", description="a step, a fan-out of three steps, a step", phases=[])
def fence_fan(ctx: Any) -> Any:
    hold = set(ctx.args.get("hold", []))
    fail = set(ctx.args.get("fail_first", []))

    def step(name: str, value: Any) -> Any:
        return ctx.step(name, lambda: produce(name, value, hold=name in hold, fail_first=name in fail))

    head = step("head", 1)
    legs = ctx.parallel([lambda i=i: step(f"leg-{i}", 10 * (i + 1)) for i in range(3)])
    tail = step("tail", head + sum(legs))
    return {"head": head, "legs": legs, "tail": tail, "attempt": ctx.attempt}


FAN_RESULT = {"head": 1, "legs": [10, 20, 30], "tail": 61}
ONCE_EACH = {"head": 1, "leg-0": 1, "leg-1": 1, "leg-2": 1, "tail": 1}


def resume_in_background(client: Client, run_id: str, **options: Any) -> Any:
    """Resume ``run_id`` in a thread (resume blocks until the run settles); returns the future."""
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(client.resume_workflow, run_id, timeout=TIMEOUT, **options)
    pool.shutdown(wait=False)
    return future


def errored_then_resumed_and_held(d: Any) -> tuple[str, Any, str, threading.Event]:
    """A run whose tail failed in attempt 1, resumed (epoch 2) and held at the
    tail's gate: its id, the resume's future, its fan-out's call and the event
    that releases the tail."""
    failed = d.client.run_workflow("fence-fan", args={"fail_first": ["tail"], "hold": ["tail"]}, timeout=TIMEOUT)
    assert (failed.status, failed.attempt, failed.can_resume) == ("error", 1, True), failed.error
    run_id = failed.run_id
    future = resume_in_background(d.client, run_id)
    entered, release = gate("tail")
    assert entered.wait(TIMEOUT), "attempt 2 never reached the tail"
    record = d.engine.store.load_run(run_id)
    assert record is not None
    assert (record.status, record.epoch, record.attempt) == ("running", 2, 2)
    return run_id, future, fanout_call(d.engine.store, run_id), release


# -- 1. a frozen worker wakes after another worker took over --------------------------


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def wait_until_ready(client: Client, worker: Any) -> None:
    """Poll until ``worker`` answers a ping: its consumer is up and consuming."""
    prefix = f"{worker.name}-{os.getpid()}-{id(worker)}@"

    def answers() -> bool:
        replies = client.engine.celery.control.ping(timeout=0.5)
        return any(name.startswith(prefix) for reply in replies for name in reply)

    poll(answers, within=RUN_BOUND, what=f"worker {worker.name} to answer a ping")


def freeze_worker_with_the_car_in_flight(settings: Settings, fleet: Any, raw: redis.Redis) -> tuple[Client, str, Any]:
    """Worker A books flight and hotel, holds the car at its gate, and is frozen there."""
    client = Engine([trip], settings).client()
    # One slot, so that A, busy with the car, has no BRPOP outstanding when it
    # is frozen: Redis would hand a stopped worker's pending BRPOP the next
    # message of its queues (B's coordinator message), and that message would
    # sit in A's socket until the sweep recovered the run again (attempt 3).
    worker_a = fleet.start(TRIP, concurrency=1, name="A")
    # A pending run is given one lease to be picked up: a worker slower than
    # that to start would see its sweep recover the run before attempt 1 ran.
    wait_until_ready(client, worker_a)
    run_id = client.start_workflow("trip", args={"hold": ["car"]})
    prefix = settings.key_prefix
    run_key = client.engine.store.run_keys(run_id).run

    def car_at_gate_rest_journaled() -> bool:
        # The three bookings are a narrow fan-out: A's coordinator pass runs
        # them itself (InlineBranches), so A is frozen inside that pass, its
        # lock held, the car's step running.
        done = {row.key for row in client.get_workflow_run_detail(run_id).steps if row.status == "completed"}
        return (
            bool(raw.sismember(f"{prefix}:gate:{run_id}:reached", "car"))
            and {"book-flight", "book-hotel"} <= done
            and raw.hget(run_key, "lock") not in (None, "")
        )

    poll(
        car_at_gate_rest_journaled,
        within=RUN_BOUND,
        what="flight and hotel journaled, the car at its gate in worker A",
    )
    # B is up (and idle) before A freezes: the take-over must not wait for a
    # worker to start, or A's lease could run out before a forced resume.
    wait_until_ready(client, fleet.start(TRIP, concurrency=4, name="B"))
    worker_a.freeze()
    poll(lambda: stopped(worker_a.pid), within=RUN_BOUND, what="worker A to stop")
    assert receipts(raw, prefix, "car") == (1, 1)
    return client, run_id, worker_a


def thaw_and_check_fenced_out(
    settings: Settings, raw: redis.Redis, client: Client, run_id: str, worker_a: Any, completed: Any
) -> int:
    """Thaw worker A; its car step finishes and is refused. Returns the refusals observed."""
    store = client.engine.store
    # Completed, it is archived once its settle is through (issue 42): compared after that.
    poll(lambda: raw.exists(store.run_keys(run_id).archive), within=RUN_BOUND, what="the archive")
    before = durable_state(store, run_id, ignore=frozenset({"refused"}))
    refused_before = store.refused_writes(run_id)
    progress_before = client.get_workflow_run_progress(run_id)

    worker_a.thaw()
    poll(
        lambda: store.refused_writes(run_id) > refused_before,
        within=RUN_BOUND,
        what="the fence to refuse worker A's writes",
    )
    # A's car task has returned (acknowledged) once nothing of ours is unacked.
    poll(lambda: queues_empty(raw, settings), within=RUN_BOUND, what="worker A's car task to end")
    refused = store.refused_writes(run_id) - refused_before

    assert worker_a.alive(), "worker A died instead of dropping its stale attempt"
    after = client.get_workflow_run(run_id)
    assert after == completed
    assert (after.status, after.attempt) == ("completed", 2)
    assert after.result == completed.result
    assert after.snapshot["steps_done"] == completed.snapshot["steps_done"] == 5
    assert client.get_workflow_run_progress(run_id).revision == progress_before.revision
    assert durable_state(store, run_id, ignore=frozenset({"refused"})) == before
    # At least once, one reservation: B called the car provider again under
    # the same idempotency key; A's late result was never journaled.
    assert receipts(raw, settings.key_prefix, "car") == (2, 1)
    assert receipts(raw, settings.key_prefix, "flight") == (1, 1)
    assert receipts(raw, settings.key_prefix, "hotel") == (1, 1)
    assert {b["service"] for b in after.result["bookings"]} == set(SERVICES)
    return refused


@pytest.mark.topologies("redis", "cluster")
def test_a_frozen_worker_taken_over_by_force_is_fenced_out_when_it_wakes(settings, fleet, raw_redis) -> None:
    client, run_id, worker_a = freeze_worker_with_the_car_in_flight(settings, fleet, raw_redis)
    prefix = settings.key_prefix

    # A's lease is still fresh: only force takes the run over.
    future = resume_in_background(client, run_id, force=True)
    poll(
        lambda: receipts(raw_redis, prefix, "car")[0] == 2,
        within=RUN_BOUND,
        what="worker B to book the car again",
    )
    running = client.get_workflow_run(run_id)
    assert (running.status, running.attempt) == ("running", 2)
    assert stopped(worker_a.pid)
    raw_redis.sadd(f"{prefix}:gate:{run_id}:open", "car")
    completed = future.result(timeout=TIMEOUT)
    assert (completed.status, completed.attempt) == ("completed", 2), completed.error
    assert completed.result["confirmed"] is True
    messages = [r.message for r in client.get_workflow_run_progress(run_id).records if r.kind == "system"]
    assert any("by force" in m for m in messages), messages

    refused = thaw_and_check_fenced_out(settings, raw_redis, client, run_id, worker_a, completed)
    print(f"force take-over: worker A's refused writes after thawing: {refused}")


def test_a_frozen_worker_recovered_by_the_sweep_is_fenced_out_when_it_wakes(settings, fleet, raw_redis) -> None:
    client, run_id, worker_a = freeze_worker_with_the_car_in_flight(settings, fleet, raw_redis)
    frozen = time.monotonic()
    prefix = settings.key_prefix

    # Nobody resumes: A's lease runs out and B's recovery sweep takes over.
    poll(
        lambda: receipts(raw_redis, prefix, "car")[0] == 2,
        within=RUN_BOUND,
        what="worker B to recover the run and book the car again",
    )
    recovered_in = time.monotonic() - frozen
    running = client.get_workflow_run(run_id)
    assert (running.status, running.attempt) == ("running", 2)
    assert recovered_in > settings.lease_seconds - 1.5, "taken over before A's lease ran out"
    assert stopped(worker_a.pid)
    raw_redis.sadd(f"{prefix}:gate:{run_id}:open", "car")
    completed = client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert (completed.status, completed.attempt) == ("completed", 2), completed.error
    messages = [r.message for r in client.get_workflow_run_progress(run_id).records if r.kind == "system"]
    assert any("recovered" in m for m in messages), messages

    refused = thaw_and_check_fenced_out(settings, raw_redis, client, run_id, worker_a, completed)
    print(f"sweep take-over after {recovered_in:.1f}s: worker A's refused writes after thawing: {refused}")


# -- 2. a message delivered twice changes nothing ------------------------------------------


def test_redelivered_branch_and_coordinator_messages_of_a_completed_run_change_nothing(durable, raw_redis) -> None:
    d = durable([fence_fan])
    store = d.engine.store
    envelope = d.client.run_workflow("fence-fan", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == {**FAN_RESULT, "attempt": 1}
    run_id = envelope.run_id
    call = fanout_call(store, run_id)
    poll(
        lambda: queues_empty(raw_redis, d.settings),
        within=RUN_BOUND,
        what="the run's last messages to be handled",
    )
    poll(lambda: raw_redis.exists(store.run_keys(run_id).archive), within=RUN_BOUND, what="the archive")
    before = durable_state(store, run_id)
    revision = d.client.get_workflow_run_progress(run_id).revision
    assert calls() == ONCE_EACH

    with finished_tasks() as done:
        d.engine.send_branches(run_id, 1, "fence-fan", call, [0, 1, 2])
        for index in range(3):
            d.engine.send_branches(run_id, 1, "fence-fan", call, [index])
        d.engine.send_coordinator(run_id, 1, "fence-fan")
        d.engine.send_coordinator(run_id, 1, "fence-fan")
        poll(lambda: len(done) >= 6, within=RUN_BOUND, what="the six redelivered messages to be handled")
        poll(lambda: queues_empty(raw_redis, d.settings), within=RUN_BOUND, what="the queues to drain")

    stays(lambda: durable_state(store, run_id) == before, "the run changed after redelivered messages")
    assert d.client.get_workflow_run(run_id) == envelope
    assert d.client.get_workflow_run_progress(run_id).revision == revision
    assert d.client.get_workflow_run(run_id).snapshot["steps_done"] == 5
    assert calls() == ONCE_EACH
    assert d.engine.refused_messages == 0  # a duplicate is not a stale message
    assert store.refused_writes(run_id) == 0


def fan_with_leg_2_held(d: Any, raw_redis: redis.Redis) -> tuple[str, str, threading.Event]:
    """A fence-fan run whose legs 0 and 1 are journaled while leg 2 is held at
    its gate: its run id, its journal's key, and the event that releases leg 2."""
    run_id = d.client.start_workflow("fence-fan", args={"hold": ["leg-2"]})
    entered, release = gate("leg-2")
    assert entered.wait(TIMEOUT)
    journal_key = d.engine.store.run_keys(run_id).journal
    poll(
        lambda: raw_redis.hexists(journal_key, "v:leg-1") and raw_redis.hexists(journal_key, "v:leg-0"),
        within=RUN_BOUND,
        what="legs 0 and 1 to be journaled",
    )
    return run_id, journal_key, release


@pytest.mark.topologies("redis", "cluster")
def test_a_redelivered_branch_while_the_fan_out_waits_changes_nothing(durable, raw_redis) -> None:
    d = durable([fence_fan])
    store = d.engine.store
    run_id, journal_key, release = fan_with_leg_2_held(d, raw_redis)
    call = fanout_call(store, run_id)
    poll(lambda: raw_redis.hget(journal_key, f"c:{call}") == "1", within=RUN_BOUND, what="one branch outstanding")
    before = durable_state(store, run_id, ignore=HEARTBEAT_FIELDS)

    with finished_tasks() as done:
        d.engine.send_branches(run_id, 1, "fence-fan", call, [0])
        d.engine.send_branches(run_id, 1, "fence-fan", call, [1])
        poll(lambda: len(done) >= 2, within=RUN_BOUND, what="the redelivered branches to be handled")

    # Legs 0 and 1 are journal hits: not produced again, not counted twice.
    assert durable_state(store, run_id, ignore=HEARTBEAT_FIELDS) == before
    assert calls() == {"head": 1, "leg-0": 1, "leg-1": 1, "leg-2": 1}
    assert raw_redis.hget(journal_key, f"c:{call}") == "1"

    release.set()
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == {**FAN_RESULT, "attempt": 1}
    assert envelope.snapshot["steps_done"] == 5
    assert calls() == ONCE_EACH


def test_a_duplicate_coordinator_message_while_a_branch_runs_does_not_run_it_again(durable, raw_redis) -> None:
    d = durable([fence_fan])
    run_id, _, release = fan_with_leg_2_held(d, raw_redis)
    with finished_tasks() as done:
        duplicate = d.engine.celery.send_task(
            COORDINATOR_TASK, kwargs={"run_id": run_id, "epoch": 1, "workflow": "fence-fan"}
        ).id
        poll(handled(done, [duplicate]), within=RUN_BOUND, what="the duplicate coordinator message to be handled")
        try:
            stays(lambda: calls().get("leg-2") == 1, "leg-2 was produced again while its first run was in flight", 1.0)
        finally:
            release.set()
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == {**FAN_RESULT, "attempt": 1}
    assert calls() == ONCE_EACH


# -- 3. a message of an older epoch is refused -------------------------------------------------


@pytest.mark.topologies("redis", "cluster")
def test_messages_of_an_older_epoch_are_refused_and_counted(durable, raw_redis) -> None:
    d = durable([fence_fan])
    store = d.engine.store
    run_id, future, call, release = errored_then_resumed_and_held(d)
    # A coordinator message that names its namespace is refused by the fence of
    # the script that would take the lock (Pass._activate_unread), which counts it.
    ignored = HEARTBEAT_FIELDS | {"refused"}
    before = durable_state(store, run_id, ignore=ignored)
    counted, refused = d.engine.refused_messages, store.refused_writes(run_id)
    assert calls() == {"head": 1, "leg-0": 1, "leg-1": 1, "leg-2": 1, "tail": 2}

    stale_pass = {"run_id": run_id, "epoch": 1, "workflow": "fence-fan"}
    with finished_tasks() as done:
        stale = [
            d.engine.celery.send_task(
                BRANCH_TASK,
                kwargs={"run_id": run_id, "epoch": 1, "workflow": "fence-fan", "call": call, "branches": [0, 1, 2]},
            ).id,
            d.engine.celery.send_task(COORDINATOR_TASK, kwargs=stale_pass).id,
            d.engine.celery.send_task(
                COORDINATOR_TASK, kwargs={**stale_pass, "namespace": d.settings.namespace}
            ).id,
        ]
        poll(handled(done, stale), within=RUN_BOUND, what="the stale messages to be handled")

    # Nothing ran and nothing was written while attempt 2 is at work.
    assert durable_state(store, run_id, ignore=ignored) == before
    assert store.refused_writes(run_id) == refused + 1
    assert calls() == {"head": 1, "leg-0": 1, "leg-1": 1, "leg-2": 1, "tail": 2}
    assert d.engine.refused_messages == counted + 3

    release.set()
    envelope = future.result(timeout=TIMEOUT)
    assert (envelope.status, envelope.attempt) == ("completed", 2), envelope.error
    assert envelope.result == {**FAN_RESULT, "attempt": 2}
    poll(lambda: queues_empty(raw_redis, d.settings), within=RUN_BOUND, what="attempt 2's tasks to end")
    after = durable_state(store, run_id)

    # Once more after completion: still refused, still counted, still nothing.
    with finished_tasks() as done:
        d.engine.send_branches(run_id, 1, "fence-fan", call, [2])
        d.engine.send_coordinator(run_id, 1, "fence-fan")
        poll(lambda: len(done) >= 2, within=RUN_BOUND, what="the stale messages to be handled")
        poll(lambda: queues_empty(raw_redis, d.settings), within=RUN_BOUND, what="the queues to drain")
    assert durable_state(store, run_id) == after
    assert d.engine.refused_messages == counted + 5
    assert calls() == {"head": 1, "leg-0": 1, "leg-1": 1, "leg-2": 1, "tail": 2}
    assert d.client.get_workflow_run(run_id) == envelope


# -- 4. an older attempt cannot cancel or finish the new one -------------------------------------


@pytest.mark.topologies("redis", "cluster")
def test_an_older_attempt_cannot_cancel_finish_or_journal_over_the_new_one(durable, raw_redis) -> None:
    d = durable([fence_fan])
    store = d.engine.store
    run_id, future, call, release = errored_then_resumed_and_held(d)
    before = durable_state(store, run_id, ignore=HEARTBEAT_FIELDS | {"refused"})
    refused = store.refused_writes(run_id)

    old = store.journal(run_id, 1, "default")
    row = StepRow("completed", 1, 0, 0, None).encode()
    old_attempt: list[Callable[[], Any]] = [
        lambda: store.finish(run_id, 1, "default", "cancelled", reason="cancelled", message="Run cancelled"),
        lambda: store.finish(run_id, 1, "default", "completed", result_json='"forged"', message="Run completed"),
        lambda: store.finish(run_id, 1, "default", "error", reason="exception", error="x", can_resume=True),
        lambda: old.complete_branch(call, 0, 'o"forged"', "wake"),
        lambda: old.record("m", PendingCommit(2, "s|tail", "v:tail", 'o"forged"', "tail", row)),
        lambda: old.dispatch("m", 1, "p|3", 3, "forged-token", 0),
        lambda: old.begin("m", BeginCall(None, "tail", row, [(99, "log", "", "forged")])),
        lambda: store.heartbeat(run_id, 1, "forged-task"),
        lambda: store.activate(run_id, 1, "forged-lock", "default", "forged-resend"),
    ]
    for write in old_attempt:
        with pytest.raises(StaleAttemptError):
            write()
        assert store.refused_writes(run_id) == refused + 1, "each stale write is counted once by the fence"
        refused += 1
    assert durable_state(store, run_id, ignore=HEARTBEAT_FIELDS | {"refused"}) == before
    assert d.client.get_workflow_run(run_id).status == "running"

    release.set()
    envelope = future.result(timeout=TIMEOUT)
    assert (envelope.status, envelope.attempt) == ("completed", 2), envelope.error
    assert envelope.result == {**FAN_RESULT, "attempt": 2}
    # Completed, it is archived (issue 42) once its settle is through: its journal read either way.
    poll(lambda: raw_redis.exists(store.run_keys(run_id).archive), within=RUN_BOUND, what="the archive")
    journal = store.hashes(run_id).journal
    assert journal.get("v:tail") == "o61"
    assert journal.get(f"r:{call}:0") != 'o"forged"'

    # Settled: the old attempt still cannot touch it, nor can the winner finish it twice.
    after = durable_state(store, run_id, ignore=frozenset({"refused"}))
    with pytest.raises(StaleAttemptError):
        store.finish(run_id, 1, "default", "cancelled", reason="cancelled")
    assert store.refused_writes(run_id) == refused + 1
    with pytest.raises(StaleAttemptError):
        store.finish(run_id, 2, "default", "error", reason="exception", error="late")
    with pytest.raises(StaleAttemptError):
        store.journal(run_id, 2, "default").record("m", PendingCommit(3, "s|extra", "v:extra", "o1"))
    assert durable_state(store, run_id, ignore=frozenset({"refused"})) == after
    assert d.client.get_workflow_run(run_id) == envelope


# -- 5. malformed messages are rejected, never executed ---------------------------------------------


def test_a_coordinator_message_that_names_another_namespace_is_served_as_one_that_names_none(
    durable, raw_redis, monkeypatch
) -> None:
    """The namespace a coordinator message names is a claim its pass checks
    (``activate.lua``): a wrong one costs the pass a read of the run, never
    the run, and leaves the indexes of neither namespace wrong."""
    import celery_durable.engine

    named = celery_durable.engine.coordinator_message

    def elsewhere(*args: Any, **kwargs: Any) -> Any:
        return named(*args, **{**kwargs, "namespace": "elsewhere"})

    monkeypatch.setattr(celery_durable.engine, "coordinator_message", elsewhere)
    d = durable([fence_fan])
    store = d.engine.store
    envelope = d.client.run_workflow("fence-fan", timeout=TIMEOUT)
    assert (envelope.status, envelope.result) == ("completed", {**FAN_RESULT, "attempt": 1}), envelope.error
    assert d.engine.refused_messages == 0 and store.refused_writes(envelope.run_id) == 0
    assert store.indexes.known(envelope.run_id) == "default"
    listed = d.client.list_workflow_runs(status="completed").runs
    assert envelope.run_id in [run.run_id for run in listed]
    assert d.engine.client("elsewhere").list_workflow_runs().runs == []


def test_a_namespace_claim_is_taken_by_the_claiming_threads_calls_alone(durable, settings) -> None:
    """A claim not yet checked must not send another writer's index sync of
    the run astray: a cancel made by another thread of the same process while
    a pass's claim is open is listed in the run's own namespace."""
    d = durable([fence_fan], worker=False)
    run_id = d.client.start_workflow("fence-fan")
    store = Engine([fence_fan], settings).store  # a process that has not met the run
    with store.indexes.claimed(run_id, "elsewhere"), ThreadPoolExecutor(1) as other:
        other.submit(store.cancel, run_id, "default", "m-1").result()
    assert d.client.get_workflow_run(run_id).status == "cancelled"
    assert run_id in [run.run_id for run in d.client.list_workflow_runs(status="cancelled").runs]
    assert store.indexes.known(run_id) == "default"


def test_a_pass_whose_message_names_its_namespace_lets_go_of_a_run_it_cannot_read(durable, raw_redis) -> None:
    """The record comes back from the script that took the lock: one that
    cannot be parsed is refused as a pass that read it first refuses it,
    and the lock and the message are let go, not held for a lease."""
    d = durable([fence_fan], worker=False)
    run_id = d.client.start_workflow("fence-fan")
    keys = d.engine.store.run_keys(run_id)
    raw_redis.hset(keys.run, "args", "{not json")
    run_coordinator_task(
        d.engine, task_id="pass-1", run_id=run_id, epoch=1, workflow="fence-fan", extra={"namespace": "default"}
    )
    assert raw_redis.hget(keys.run, "lock") == "" and "pass-1" not in raw_redis.hgetall(keys.live)
    assert calls() == {}


def test_malformed_messages_are_rejected_and_logged_never_executed(durable, raw_redis, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="celery_durable")
    d = durable([fence_fan], branch_batch_ms=0)  # the held leg in a branch task of its own
    store = d.engine.store
    run_id = d.client.start_workflow("fence-fan", args={"hold": ["leg-1"]})
    entered, release = gate("leg-1")
    assert entered.wait(TIMEOUT)
    journal_key = store.run_keys(run_id).journal
    poll(
        lambda: raw_redis.hexists(journal_key, "v:leg-0") and raw_redis.hexists(journal_key, "v:leg-2"),
        within=RUN_BOUND,
        what="legs 0 and 2 to be journaled",
    )
    call = fanout_call(store, run_id)
    before = durable_state(store, run_id, ignore=HEARTBEAT_FIELDS)
    counted = d.engine.refused_messages
    good = {"run_id": run_id, "epoch": 1, "workflow": "fence-fan"}

    bad_runs: list[dict[str, Any]] = [
        {**good, "run_id": "../../etc/passwd"},
        {**good, "run_id": run_id.upper()},
        {**good, "run_id": 12345},
        {**good, "run_id": None},
        {**good, "epoch": -1},
        {**good, "epoch": 0},
        {**good, "epoch": "1"},
        {**good, "epoch": True},
        {**good, "epoch": 1.0},
        {**good, "workflow": ""},
        {**good, "workflow": ["fence-fan"]},
        # (A field the task does not know is ignored, not refused: a later
        # version's, during a rolling upgrade. tests/test_message_formats.py)
        {},
    ]
    named = {**good, "namespace": d.settings.namespace}  # checked by the script that would take the lock
    forged = [{**good, "workflow": "trip"}, {**good, "run_id": "0" * 32}]
    forged_named = [{**named, "workflow": "trip"}, {**named, "run_id": "0" * 32}]
    bad_namespaces: list[dict[str, Any]] = [{**good, "namespace": "../other"}, {**good, "namespace": 7}]
    bad_branches: list[dict[str, Any]] = [
        {"call": "m:1; FLUSHALL", "branches": [1]},
        {"call": call, "branches": [-1]},
        {"call": call, "branches": [1, 1]},
        {"call": call, "branches": []},
        {"call": call, "branches": "1"},
        {"call": call, "branches": [True]},
        {"call": None, "branches": [1]},
    ]
    with finished_tasks() as done:
        sent = [
            d.engine.celery.send_task(COORDINATOR_TASK, kwargs=kwargs).id
            for kwargs in bad_runs + bad_namespaces + forged + forged_named
        ]
        sent += [
            d.engine.celery.send_task(BRANCH_TASK, kwargs={**kwargs, "call": call, "branches": [1]}).id
            for kwargs in bad_runs + forged
        ]
        sent += [d.engine.celery.send_task(BRANCH_TASK, kwargs={**good, **kwargs}).id for kwargs in bad_branches]
        # Not JSON: the worker accepts JSON only and must not unpickle it.
        d.engine.celery.send_task(COORDINATOR_TASK, kwargs=good, serializer="pickle")
        poll(handled(done, sent), within=RUN_BOUND, what="every malformed message to be handled")
        poll(
            # Refused by the durable tasks' strategy before anything decodes the body (tasks/mount.py).
            lambda: any(
                "content type 'application/x-python-serialize', not JSON" in r.getMessage() for r in caplog.records
            ),
            within=RUN_BOUND,
            what="the pickled message to be refused",
        )
        # The held branch's own task is still unacknowledged in the steps queue.
        poll(
            lambda: queues_empty(raw_redis, d.settings, steps=False),
            within=RUN_BOUND,
            what="the pickled message to be dropped",
        )

    # Nothing was executed: the held branch was not dispatched again, no write happened.
    assert durable_state(store, run_id, ignore=HEARTBEAT_FIELDS) == before
    assert calls() == {"head": 1, "leg-0": 1, "leg-1": 1, "leg-2": 1}
    assert store.refused_writes(run_id) == 0
    rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len([m for m in rejected if m.startswith("rejected coordinator message")]) == len(bad_runs + bad_namespaces)
    assert len([m for m in rejected if m.startswith("rejected branch message")]) == len(bad_runs) + len(bad_branches)
    refusals = [r.getMessage() for r in caplog.records if "stale or forged" in r.getMessage()]
    assert len(refusals) == 2 * len(forged) + len(forged_named), refusals
    assert d.engine.refused_messages == counted + 2 * len(forged) + len(forged_named)

    # The worker is healthy: the held run and a new one complete.
    release.set()
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == {**FAN_RESULT, "attempt": 1}
    later = d.client.run_workflow("fence-fan", timeout=TIMEOUT)
    assert later.status == "completed", later.error
    assert later.result == {**FAN_RESULT, "attempt": 1}
