"""A Redis Cluster as the journal (``redis_cluster=True``, SPEC §10).

Three private masters (``redis_cluster``, tests/support/topologies.py) hold the
journal; the broker stays the session's single Redis, as it must: kombu has no
Redis Cluster transport. The lifecycle, recovery and fencing tests, and the
journal contract tests, run on it too: they are marked
``@pytest.mark.topologies("redis", "cluster")``, and on the cluster
``settings`` and ``raw_redis`` point at it (conftest's ``topology``).

A Redis Cluster refuses a script whose keys map to more than one slot: redis-py
refuses to send one whose KEYS span slots, and the node refuses a key of
another slot that a script builds itself ("Script attempted to access a non
local key"). So every test here that passes is also a proof that the scripts
it ran each touched one slot.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from typing import Any

import pytest
from redis.cluster import RedisCluster

from celery_durable import (
    Engine,
    ScheduleNotFoundError,
    StorageUnavailableError,
    WorkflowContext,
    WorkflowResumeError,
    workflow,
)
from celery_durable.broker import schema
from celery_durable.broker.connection import now_ms, script_source
from celery_durable.broker.ops import SCRIPT_NAMES
from celery_durable.schedules import firing
from celery_durable.schedules.calendar import Calendar, from_ms, to_ms
from celery_durable.tasks.recovery import RecoverySweep
from tests.conftest import DurableFactory
from tests.support.poll import RUN_BOUND, poll
from tests.support.topologies import RedisClusterNodes, keys_per_node, node_client

pytestmark = pytest.mark.topologies("cluster")

ON_THE_CLUSTER = (
    "contract/test_calls.py",
    "contract/test_children.py",
    "contract/test_journal.py",
    "contract/test_waits.py",
    "test_agents.py",
    "test_cluster.py",
    "test_fencing.py",
    "test_lifecycle.py",
    "test_publish_failures.py",
    "test_recovery.py",
    "test_retention.py",
    "test_run_indexes.py",
    "test_unserved.py",
)
"""The modules whose tests run on the cluster too (``@pytest.mark.topologies(..., "cluster")``)."""


# -- where the keys live -------------------------------------------------------------------


@workflow(name="waits-for-go", description="Waits for a signal that never comes", phases=[])
def waits_for_go(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go").payload


@workflow(name="two-steps", description="Two quick steps", phases=[])
def two_steps(ctx: WorkflowContext) -> Any:
    return [ctx.step("one", lambda: 1), ctx.step("two", lambda: 2)]


def test_runs_spread_over_the_masters_and_every_script_touches_one_slot(
    durable: DurableFactory, redis_cluster: RedisClusterNodes
) -> None:
    """Each run's keys share the hash tag ``{run_id}``, so runs land on every
    master and one run's keys all on one. The cluster refuses any script that
    touches keys of two slots, so these runs completing, like every other test
    in this module passing, proves the scripts they ran touch one slot each."""
    d = durable([two_steps, waits_for_go])
    run_ids = [d.client.start_workflow("two-steps") for _ in range(40)]
    for run_id in run_ids:
        envelope = d.client.wait_for_workflow_run(run_id, timeout=30)
        assert (envelope.status, envelope.result) == ("completed", [1, 2]), envelope.error

    prefix = d.settings.key_prefix
    per_node = keys_per_node(redis_cluster, f"{prefix}:*:run")
    assert sum(per_node) == len(run_ids)
    assert all(count > 0 for count in per_node), f"runs per master: {per_node}"
    for run_id in run_ids[:5]:
        keys = d.engine.store.run_keys(run_id)
        owner = redis_cluster.node_of(keys.run)
        assert {redis_cluster.node_of(key).port for key in (keys.journal, keys.progress, keys.live)} == {owner.port}
    listed = {run.run_id for run in d.client.list_workflow_runs(limit=100).runs}
    assert listed == set(run_ids)  # one page read from the runs of every master
    story = d.client.get_workflow_run_history(run_ids[0]).events  # read_history.lua, in the run's slot
    assert [e.key for e in story if e.kind == "step_completed"] == ["one", "two"]
    assert [e.seq for e in story] == list(range(1, len(story) + 1))
    # The runs are archived (archive_run.lua, in the run's slot): each is its hash and its archive.
    poll(lambda: d.engine.store.archive(run_ids[0]) is not None, within=RUN_BOUND, what="the archive")
    assert story == d.client.get_workflow_run_history(run_ids[0]).events
    assert redis_cluster.node_of(keys.archive).port == owner.port
    # note.lua (start_workflow's "no live worker serves it"), once, in the run's slot;
    # a completed run takes none (it is archived: nothing may split its records).
    assert d.engine.store.note(run_ids[0], "unserved", "a note") is False
    waiting = d.client.start_workflow("waits-for-go")  # never completes here
    assert d.engine.store.note(waiting, "unserved", "a note") is True
    assert d.engine.store.note(waiting, "unserved", "a note") is False
    assert [e.data for e in d.client.get_workflow_run_history(waiting).events].count({"message": "a note"}) == 1


def test_the_sweep_reads_the_fleet_and_halts_runs_across_slots(
    durable: DurableFactory, raw_redis: RedisCluster
) -> None:
    """The sweep's keys live in slots of their own ({sweep}, {fleet}), apart
    from every run's: a worker that stopped beating is found in {fleet} and its
    queued message marked lost in the run's slot, one script per slot."""
    d = durable([two_steps], worker=False, auto_recover=False)
    store = d.engine.store
    run_id = d.client.start_workflow("two-steps")
    (message,) = raw_redis.hkeys(store.run_keys(run_id).live)  # its first coordinator message, queued
    store.report_worker("dead-worker", {message: run_id}, [], at_ms=1)  # it took the message, then went silent

    RecoverySweep(d.engine).sweep_once()

    assert raw_redis.zscore(store.keys.workers, "dead-worker") is None  # claimed by this sweep
    envelope = d.client.get_workflow_run(run_id)
    assert (envelope.status, envelope.reason, envelope.can_resume) == ("halted", "interrupted", True)


# -- schedules: a tick claimed in {sched}, its run made in its own slot -----------------------


@workflow(name="cluster-tick", description="Says which tick started it", phases=[])
def cluster_tick(ctx: WorkflowContext) -> Any:
    at = ctx.scheduled_at
    return {"schedule": ctx.schedule_id, "at": at.isoformat() if at else None}


def tick_of(run: Any) -> int:
    assert run.scheduled_at is not None, f"run {run.run_id} has no tick"
    return to_ms(run.scheduled_at)


def slot_of(cluster: RedisCluster, key: str) -> int:
    return int(cluster.keyslot(key))  # type: ignore[no-untyped-call]


def test_schedules_fire_on_the_cluster_one_run_per_tick(
    durable: DurableFactory, redis_cluster: RedisClusterNodes, raw_redis: RedisCluster
) -> None:
    """Every schedule script, on the cluster: create and update
    (``schedule_put``), pause and unpause (``schedule_pause``), trigger and
    backfill (``create_run`` in each run's slot, then ``schedule_record`` in
    ``{sched}``), the sweep's fire (``schedule_claim``, the run, the record)
    by four sweepers at once and by one after a dead sweeper's claim ran out,
    then ``schedule_delete``. The sweepers' engine has a clock a few minutes
    ahead (injected, as the unit tests' is), so its ticks are due now; the
    worker's own engine keeps the wall clock and runs what they start."""
    d = durable([cluster_tick])
    client, store = d.client, d.engine.store
    offset = [0]
    sweeper = Engine([cluster_tick], d.settings)
    sweeper.store.clock = lambda: now_ms() + offset[0]

    info = client.create_schedule("pulse", "cluster-tick", cron="* * * * *", overlap="allow_all",
                                  catchup_window=600, paused=True)
    assert info.paused and info.next_times == []
    assert client.update_schedule("pulse", note="on the cluster").note == "on the cluster"
    assert client.pause_schedule("pulse").paused
    info = client.unpause_schedule("pulse")
    first_ms = to_ms(info.next_times[0])
    calendar = Calendar("* * * * *", None, "UTC", 0)

    triggered = client.trigger_schedule("pulse")
    assert triggered is not None
    since = first_ms - 5 * 60_000
    backfilled = client.backfill_schedule("pulse", from_ms(since), from_ms(first_ms))
    assert len(backfilled) == 5
    assert client.backfill_schedule("pulse", from_ms(since), from_ms(first_ms)) == backfilled  # started once

    # Four sweepers at once, three minutes on: every due tick fired once, by one of them.
    offset[0] = first_ms + 2 * 60_000 + 1_000 - now_ms()
    gate = threading.Barrier(4)

    def sweep() -> None:
        gate.wait()
        firing.fire_due(sweeper)

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fired = calendar.between(first_ms, sweeper.store.now_ms() + 1, 100)
    assert len(fired) == 3

    # A sweeper that claimed the next tick and died: once its claim ran out, another fires the tick.
    offset[0] += 60_000
    dead = sweeper.store.claim_schedules(sweeper.store.now_ms(), 10, sweeper.store.lease_ms)
    assert [member for member, _ in dead.members] == ["default/pulse"]
    firing.fire_due(sweeper)  # held by the dead claim: nothing fired
    assert len(client.list_workflow_runs(schedule_id="pulse", limit=100).runs) == 5 + 1 + 3
    offset[0] += sweeper.store.lease_ms + 1_000
    firing.fire_due(sweeper)
    fired.append(fired[-1] + 60_000)

    runs = client.list_workflow_runs(schedule_id="pulse", limit=100).runs
    ticks = sorted(tick_of(run) for run in runs)
    assert len(ticks) == len(set(ticks)) == 5 + 1 + len(fired), "one run per tick"
    assert set(ticks) >= set(fired) | set(calendar.between(since, first_ms, 10))
    for run in runs:
        assert run.run_id == schema.schedule_run_id("default", "pulse", tick_of(run))
        envelope = client.wait_for_workflow_run(run.run_id, timeout=30)
        assert envelope.status == "completed", envelope.error
        assert envelope.result == {"schedule": "pulse", "at": from_ms(tick_of(run)).isoformat()}
    recent = client.get_schedule("pulse").recent
    assert {item["action"] for item in recent} == {"started"}  # none missed or skipped
    assert {(to_ms(item["tick"]), item["run_id"]) for item in recent} == {
        (tick_of(run), run.run_id) for run in runs
    }
    swept = [to_ms(item["tick"]) for item in recent if to_ms(item["tick"]) in fired]
    assert sorted(swept) == fired  # of four sweepers at once, one fired and recorded each tick

    # The tick's claim and record in {sched}, one slot; each run's keys in the run's own slot.
    k = store.schedule_keys("default", "pulse")
    assert len({slot_of(raw_redis, key) for key in (k.schedule, k.due, k.recent, k.runs, k.ids)}) == 1
    run_nodes = set()
    for run in runs:
        keys = store.run_keys(run.run_id)
        assert len({slot_of(raw_redis, key) for key in (keys.run, keys.journal, keys.live)}) == 1
        run_nodes.add(redis_cluster.node_of(keys.run).port)
    assert len(run_nodes) > 1, "every run on one master"

    client.delete_schedule("pulse")
    with pytest.raises(ScheduleNotFoundError):
        client.get_schedule("pulse")
    assert len(client.list_workflow_runs(schedule_id="pulse", limit=100).runs) == len(runs)  # kept


# -- a master killed mid-run ------------------------------------------------------------------

HELD = threading.Event()
RELEASE = threading.Event()


@workflow(name="held-step", description="A step that waits until the test lets it finish", phases=[])
def held_step(ctx: WorkflowContext) -> Any:
    def held() -> str:
        HELD.set()
        assert RELEASE.wait(60)
        return "held"

    return [ctx.step("before", lambda: "before"), ctx.step("held", held), ctx.step("after", lambda: "after")]


@pytest.mark.slow
def test_a_killed_master_fails_callers_promptly_and_its_runs_go_on_once_it_is_back(
    durable: DurableFactory, redis_cluster: RedisClusterNodes
) -> None:
    """No replica takes over here: the slot comes back when its master does,
    restarted on its append-only file. Meanwhile every caller gets
    ``StorageUnavailableError`` (``workflow_storage_unavailable``) within the
    time a single Redis takes to fail a call (redis-py's three tries), and the
    worker holds its step until the journal answers again."""
    HELD.clear()
    RELEASE.clear()
    d = durable([held_step])
    run_id = d.client.start_workflow("held-step")
    assert HELD.wait(30)
    node = redis_cluster.node_of(d.engine.store.run_keys(run_id).run)
    try:
        node.kill()
        started = time.monotonic()
        with pytest.raises(StorageUnavailableError) as read:
            d.client.get_workflow_run(run_id)
        failed_in = time.monotonic() - started
        assert read.value.code == "workflow_storage_unavailable"
        with pytest.raises(WorkflowResumeError) as resume:
            d.client.resume_workflow(run_id, force=True, timeout=1)
        assert resume.value.code == "workflow_storage_unavailable"
        assert failed_in < 15, f"a read took {failed_in:.1f}s to fail"
        RELEASE.set()  # the step ends while its slot is down: its journal write waits
        time.sleep(1)
    finally:
        RELEASE.set()
        redis_cluster.restart(node)
    back = time.monotonic()
    envelope = d.client.wait_for_workflow_run(run_id, timeout=60)
    assert (envelope.status, envelope.result) == ("completed", ["before", "held", "after"]), envelope.error
    print(f"\nkilled master: a read failed in {failed_in:.1f}s; the run completed {time.monotonic() - back:.1f}s "
          f"after the slot was served again (attempt {envelope.attempt})")


# -- last: every script ran ------------------------------------------------------------------


# -- throttles: a throttle's state in its slot, each run's in its own -----------------------


@workflow(name="c-throttled", description="A throttled run with a throttled step", phases=[])
def c_throttled(ctx: WorkflowContext) -> Any:
    return ctx.step("work", lambda: ctx.args["n"], throttle="c-api")


@workflow(name="c-holder", description="Holds its run's slot until told to go", phases=[])
def c_holder(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go").payload


def test_throttles_on_the_cluster(durable: DurableFactory) -> None:
    """Every throttle script on the cluster: a slot taken, a waiter queued
    and cancelled, another granted the slot its holder gave back, a
    throttled step, the throttles deleted. Each script touches one slot
    (the throttle's, or the run's): the cluster would refuse it otherwise."""
    d = durable([c_throttled, c_holder])
    client = d.client
    client.set_throttle("c-one", concurrency=1)
    client.set_throttle("c-api", concurrency=1)
    holder = client.start_workflow("c-holder", throttle="c-one")
    poll(lambda: client.get_throttle("c-one").holding == 1, within=RUN_BOUND, what="the holder's slot")
    cancelled = client.start_workflow("c-throttled", args={"n": 1}, throttle="c-one")
    poll(lambda: client.get_throttle("c-one").waiting == 1, within=RUN_BOUND, what="a waiter queued")
    assert client.cancel_workflow_run(cancelled, timeout=30).status == "cancelled"
    poll(
        lambda: client.get_throttle("c-one").waiting == 0,
        within=RUN_BOUND,
        what="the cancelled waiter gone from the queue",
    )
    second = client.start_workflow("c-throttled", args={"n": 2}, throttle="c-one")
    poll(lambda: client.get_throttle("c-one").waiting == 1, within=RUN_BOUND, what="the second waiter queued")
    client.signal_workflow_run(holder, "go", "done")
    assert client.wait_for_workflow_run(holder, timeout=30).result == "done"
    assert client.wait_for_workflow_run(second, timeout=30).result == 2
    poll(lambda: client.get_throttle("c-one").holding == 0, within=RUN_BOUND, what="every slot back")
    client.delete_throttle("c-one")
    client.delete_throttle("c-api")
    assert client.list_throttles() == []


# -- last: every script the tests above ran ---------------------------------------------------


@pytest.mark.after_all
def test_every_script_ran_on_the_cluster(
    request: pytest.FixtureRequest, topology: str, redis_cluster: RedisClusterNodes
) -> None:
    """The proof above holds for the scripts the tests ran; here, that is all
    of them. redis-py loads a script on every master the first time one of
    them lacks it, so a script the cluster ever ran is known to its masters.
    The cluster's tests all run on one process (tests/support/topologies.py),
    this one last (``after_all``)."""
    assert topology == "cluster"
    tests = request.path.parent
    on_cluster = [item for item in request.session.items if "[cluster]" in item.nodeid]
    selected = {item.originalname for item in on_cluster if item.path == request.path}
    here = {name for name, value in globals().items() if name.startswith("test_") and callable(value)}
    modules = {item.path.relative_to(tests).as_posix() for item in on_cluster}
    if here - selected or set(ON_THE_CLUSTER) - modules:
        pytest.skip("meaningful only after every test on the cluster ran")
    shas = {name: hashlib.sha1(script_source(name).encode("utf-8")).hexdigest() for name in SCRIPT_NAMES}
    ran: set[str] = set()
    for node in redis_cluster.nodes:
        with contextlib.closing(node_client(node)) as client:
            exists = client.script_exists(*shas.values())
        ran |= {name for name, found in zip(shas, exists, strict=True) if found}
    assert set(SCRIPT_NAMES) - ran == set(), "scripts no test ran on the cluster"
