"""Redis durability: the journal survives redis-server dying (SPEC §8, §10).

Every test runs its own private ``redis-server`` (append-only file on,
``appendfsync always``, a data directory under ``tmp_path``, a fixed port), so
it can be killed with SIGKILL and restarted on the same port from the same
files without disturbing the session's Redis or any other test. Journal and
broker both live on it, as in the default deployment.

- A run on a real worker process survives redis-server being SIGKILLed in the
  middle of a fan-out: it completes, and no step journaled before the kill
  runs again (producers count their calls in a file, which survives too).
  The worker, which was running a task, reconnects and finishes the run.
- While Redis is down the client raises ``StorageUnavailableError``
  (``workflow_storage_unavailable``), and works again once it is back, with
  the runs as they were.
- The epoch never goes backwards: a bump lost to a restart (as it can be under
  ``appendfsync everysec``/``no``, simulated here by restoring an older copy
  of the AOF) is never handed out again, because the first bump after a
  restart (a new ``run_id``) jumps past everything issued before it -- also
  when that jump is itself lost to a second restart.

See docs/persistence.md.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_durable import (
    Client,
    Engine,
    Settings,
    StorageUnavailableError,
    WorkflowContext,
    WorkflowResumeError,
    workflow,
)
from celery_durable.broker import RunStore
from celery_durable.errors import StaleAttemptError
from celery_durable.local.redis_server import RedisServer, free_port
from celery_durable.workflows import jsonvalue
from tests.support.fleet import Fleet, WorkerProcess
from tests.support.poll import RUN_BOUND, poll

APP = "tests.test_redis_durability:engine"
TIMEOUT = 40

# -- a workflow for a worker process: its producers count calls in files -----


def _calls_log(folder: str) -> Path:
    return Path(folder) / "calls.log"


def producer(folder: str, key: str, value: Any, *, gated: bool = False) -> Callable[[], Any]:
    """A step body that appends its key to ``calls.log`` (one line per call, in
    any process) and, when ``gated``, waits until the test opens its gate."""

    def produce() -> Any:
        with _calls_log(folder).open("a", encoding="utf-8") as log:
            log.write(f"{key}\n")
        if gated:
            (Path(folder) / f"reached-{key}").touch()
            while not (Path(folder) / f"open-{key}").exists():
                time.sleep(0.02)
        return value

    return produce


@workflow(
    name="redis-durability",
    description="Sequential steps, a fan-out whose last branch waits at a gate, more steps",
    phases=[{"title": "Before"}, {"title": "Fan"}, {"title": "After"}],
)
def chain(ctx: WorkflowContext) -> Any:
    folder = ctx.args["dir"]
    ctx.phase("Before")
    before = [ctx.step(f"pre-{i}", producer(folder, f"pre-{i}", i)) for i in range(3)]
    ctx.phase("Fan")
    fan = ctx.parallel(
        [lambda j=j: ctx.step(f"fan-{j}", producer(folder, f"fan-{j}", 10 * j, gated=j == 2)) for j in range(3)]
    )
    ctx.phase("After")
    after = [ctx.step(f"post-{i}", producer(folder, f"post-{i}", 100 + i)) for i in range(2)]
    return {"before": before, "fan": fan, "after": after}


# Worker processes load this module by import path; their settings come from
# the environment (tests/support/fleet.py), pointing at the test's private Redis.
engine = Engine(workflows=[chain], settings=Settings())

JOURNALED_BEFORE_KILL = ["pre-0", "pre-1", "pre-2", "fan-0", "fan-1"]
EXPECTED = {"before": [0, 1, 2], "fan": [0, 10, 20], "after": [100, 101]}


# -- helpers ------------------------------------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone: AOF with fsync on every write, a data
    directory and a port it keeps across restarts."""
    server = RedisServer(tmp_path / "redis-data", port=free_port(), appendfsync="always")
    server.start()
    yield server
    server.stop()


def on(server: RedisServer, settings: Settings) -> Settings:
    """``settings`` (per-test prefix and queues) with journal and broker on ``server``."""
    return settings.model_copy(update={"redis_url": server.url, "broker_url": None})


def calls(folder: Path) -> Counter[str]:
    log = _calls_log(str(folder))
    return Counter(log.read_text(encoding="utf-8").split()) if log.exists() else Counter()


def journaled(store: RunStore, run_id: str, key: str) -> bool:
    """Whether step ``key`` has an outcome in the run's journal."""
    return bool(store.client.hexists(store.run_keys(run_id).journal, f"v:{key}"))


def server_run_id(server: RedisServer) -> str:
    with redis.Redis.from_url(server.url, decode_responses=True) as raw:
        return str(raw.info("server")["run_id"])


def restart_from(server: RedisServer, snapshot: Path) -> None:
    """Kill the server, put an older copy of its AOF back, start it again:
    every write after the copy is lost, as unsynced writes are on a crash."""
    server.kill()
    shutil.rmtree(server.data_dir / "appendonlydir")
    shutil.copytree(snapshot, server.data_dir / "appendonlydir")
    server.start()


def snapshot_aof(server: RedisServer, where: Path) -> Path:
    """A copy of the AOF as it is now (every acknowledged write is on disk:
    appendfsync always, and nothing else writes meanwhile)."""
    shutil.copytree(server.data_dir / "appendonlydir", where)
    return where


def bump(store: RunStore, run_id: str) -> int:
    """A resume at store level: compare-and-set the epoch; the new epoch."""
    record = store.load_run(run_id)
    assert record is not None
    epoch = store.resume(
        record, limits_json=jsonvalue.dumps(record.limits), message="Run taken over", code_hash="", message_id="m"
    )
    assert epoch is not None
    return epoch


def epoch_of(store: RunStore, run_id: str) -> int:
    record = store.load_run(run_id)
    assert record is not None
    return record.epoch


# -- 1. SIGKILL redis-server mid-run: the run completes, nothing journaled re-runs


def kill_redis_mid_fanout(
    settings: Settings, fleet: Fleet, server: RedisServer, folder: Path
) -> tuple[WorkerProcess, Client, str]:
    """Start a worker process and a run; once three steps and two branches are
    journaled and the third branch is blocked at its gate, SIGKILL redis-server,
    check the outage is felt on both sides, restart it on the same port and
    data directory, and open the gate. Returns (worker, client, run_id).
    A task per branch (branch_batch_ms 0): the gate holds a branch task, not
    the coordinator's pass, which would run a fan-out this narrow itself."""
    settings = on(server, settings).model_copy(update={"branch_batch_ms": 0})
    fleet.settings = settings
    worker = fleet.start(APP, concurrency=4)
    client = Engine([chain], settings).client()
    store = client.engine.store
    run_id = client.start_workflow("redis-durability", args={"dir": str(folder)})
    poll(lambda: (
            (folder / "reached-fan-2").exists() and all(journaled(store, run_id, key) for key in JOURNALED_BEFORE_KILL)
        ), within=RUN_BOUND, what="three steps and two branches journaled, the third branch at its gate")
    assert all(calls(folder)[key] == 1 for key in JOURNALED_BEFORE_KILL), calls(folder)
    first_server = server_run_id(server)

    server.kill()
    with pytest.raises(StorageUnavailableError) as info:
        client.get_workflow_run(run_id)
    assert info.value.code == "workflow_storage_unavailable"
    # The worker feels it too: the blocked branch's heartbeat (every second)
    # fails, and its broker connection is gone.
    log = folder / "w.log"
    poll(
        lambda: log.exists() and "heartbeat of run" in log.read_text(errors="replace"),
        within=RUN_BOUND,
        what="the worker to report that Redis is unavailable",
    )

    server.start()
    assert server_run_id(server) != first_server
    (folder / "open-fan-2").touch()
    return worker, client, run_id


def assert_completed_without_rerunning_journaled_steps(client: Client, run_id: str, folder: Path) -> None:
    envelope = client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.status == "completed", (envelope.status, envelope.error)
    assert envelope.result == EXPECTED
    after = calls(folder)
    # Nothing journaled before the kill ran again; what was in flight may have
    # (at least once); what came after ran.
    assert {key: after[key] for key in JOURNALED_BEFORE_KILL} == dict.fromkeys(JOURNALED_BEFORE_KILL, 1), after
    assert after["fan-2"] >= 1 and after["post-0"] >= 1 and after["post-1"] >= 1, after
    # No phantom running rows, and every row reads back.
    assert envelope.snapshot["steps_running"] == 0
    rows = {row.key: row.status for row in client.get_workflow_run_detail(run_id).steps}
    assert rows == dict.fromkeys(
        [*(f"pre-{i}" for i in range(3)), *(f"fan-{j}" for j in range(3)), "post-0", "post-1"], "completed"
    )
    print(f"attempt {envelope.attempt}, epoch {epoch_of(client.engine.store, run_id)}, calls {dict(after)}")


def test_sigkill_of_redis_mid_run_loses_no_journaled_step_and_the_worker_reconnects(
    settings, fleet, private_redis, tmp_path
) -> None:
    """The worker was running a task when its broker died: it reconnects
    (celery_durable.tasks.transport keeps Celery 5.7 from stopping it) and
    the run completes from its journal on it, no journaled step run again."""
    started = time.monotonic()
    worker, client, run_id = kill_redis_mid_fanout(settings, fleet, private_redis, tmp_path)
    assert_completed_without_rerunning_journaled_steps(client, run_id, tmp_path)
    log = (tmp_path / "w.log").read_text(errors="replace")
    assert worker.alive(), "the worker exited: " + next(
        (line for line in log.splitlines() if "Unrecoverable error" in line), log[-500:]
    )
    assert "Unrecoverable error" not in log
    print(f"completed {time.monotonic() - started:.2f}s after start")


# -- 2. While Redis is down: clear errors; once it is back: the same calls work


def test_client_calls_fail_clearly_while_redis_is_down_and_work_after(durable, private_redis) -> None:
    app = durable([chain], worker=False, redis_url=private_redis.url)
    client, store = app.client, app.engine.store
    first = client.start_workflow("redis-durability", args={"dir": "/nonexistent"})
    second = client.start_workflow("redis-durability", args={"dir": "/elsewhere"}, idempotency_key="k-1")
    raw_before = {run_id: store.client.hgetall(store.run_keys(run_id).run) for run_id in (first, second)}
    listed_before = [run.run_id for run in client.list_workflow_runs().runs]
    assert listed_before == [second, first]

    private_redis.kill()
    unavailable: list[tuple[str, Callable[[], Any]]] = [
        ("get_workflow_run", lambda: client.get_workflow_run(first)),
        ("get_workflow_run_detail", lambda: client.get_workflow_run_detail(first)),
        ("get_workflow_run_progress", lambda: client.get_workflow_run_progress(first)),
        ("list_workflow_runs", lambda: client.list_workflow_runs()),
        ("start_workflow", lambda: client.start_workflow("redis-durability", args={"dir": "/x"})),
        ("wait_for_workflow_run", lambda: client.wait_for_workflow_run(first, timeout=1)),
        ("cancel_workflow_run", lambda: client.cancel_workflow_run(first, timeout=1)),
    ]
    for name, call in unavailable:
        started = time.monotonic()
        with pytest.raises(StorageUnavailableError) as info:
            call()
        assert info.value.code == "workflow_storage_unavailable", name
        assert time.monotonic() - started < 10, f"{name} took long to fail"
    with pytest.raises(WorkflowResumeError) as resume_info:
        client.resume_workflow(first, force=True, timeout=1)
    assert resume_info.value.code == "workflow_storage_unavailable"

    private_redis.start()
    # The same calls work again, on the same client, and the runs are intact.
    for run_id in (first, second):
        assert store.client.hgetall(store.run_keys(run_id).run) == raw_before[run_id]
    envelope = client.get_workflow_run(first)
    assert (envelope.status, envelope.args, envelope.attempt) == ("pending", {"dir": "/nonexistent"}, 1)
    client.get_workflow_run_detail(first)
    client.get_workflow_run_progress(first)
    third = client.start_workflow("redis-durability", args={"dir": "/y"})
    assert client.start_workflow("redis-durability", args={"dir": "/z"}, idempotency_key="k-1") == second
    assert [run.run_id for run in client.list_workflow_runs().runs] == [third, *listed_before]
    # resume gives its ordinary verdict again: the pending run's lease is alive.
    with pytest.raises(WorkflowResumeError) as verdict:
        client.resume_workflow(first)
    assert verdict.value.code == "already_active"


# -- 3. The epoch never goes backwards -----------------------------------------


def test_without_a_restart_an_epoch_bump_is_plus_one(durable, private_redis) -> None:
    app = durable([chain], worker=False, redis_url=private_redis.url)
    store = app.engine.store
    run_id = app.client.start_workflow("redis-durability", args={"dir": "/nonexistent"})
    assert epoch_of(store, run_id) == 1
    assert [bump(store, run_id) for _ in range(3)] == [2, 3, 4]


def test_a_bump_lost_to_a_restart_is_never_handed_out_again(durable, private_redis, tmp_path) -> None:
    app = durable([chain], worker=False, redis_url=private_redis.url)
    store = app.engine.store
    run_id = app.client.start_workflow("redis-durability", args={"dir": "/nonexistent"})
    e = bump(store, run_id)
    assert e == 2
    snapshot = snapshot_aof(private_redis, tmp_path / "aof-at-epoch-e")

    # An attempt takes over and holds E+1; its writes pass the fence.
    held = bump(store, run_id)
    assert held == e + 1
    store.heartbeat(run_id, held, "t")

    # Redis restarts and the bump is lost (it was never fsynced).
    first_server = server_run_id(private_redis)
    restart_from(private_redis, snapshot)
    assert server_run_id(private_redis) != first_server
    assert epoch_of(store, run_id) == e, "the restored AOF should predate the bump"

    with pytest.raises(StaleAttemptError):
        store.heartbeat(run_id, held, "t")
    # The next attempt's epoch jumps past everything issued before the restart.
    fresh = bump(store, run_id)
    assert fresh >= e + 1000, fresh
    store.heartbeat(run_id, fresh, "t")
    with pytest.raises(StaleAttemptError):
        store.heartbeat(run_id, held, "t")
    # ... and later bumps on the same server are +1 again, never back to E+1.
    later = [bump(store, run_id) for _ in range(3)]
    assert later == [fresh + 1, fresh + 2, fresh + 3]
    for epoch in (held, fresh):
        with pytest.raises(StaleAttemptError):
            store.heartbeat(run_id, epoch, "t")
        with pytest.raises(StaleAttemptError):
            store.finish(run_id, epoch, "default", "completed", message="stale attempt finishing")
    store.heartbeat(run_id, later[-1], "t")
    record = store.load_run(run_id)
    assert record is not None and record.status == "running"
    assert store.refused_writes(run_id) >= 6


def test_a_jump_lost_to_a_second_restart_is_never_handed_out_again(durable, private_redis, tmp_path) -> None:
    """Redis restarts (new run_id), the first bump after it jumps, and that bump
    is lost to a second crash. The jump after the second restart must not land
    on the same number: two attempts would hold it and both pass the fence."""
    app = durable([chain], worker=False, redis_url=private_redis.url)
    store = app.engine.store
    run_id = app.client.start_workflow("redis-durability", args={"dir": "/nonexistent"})
    e = bump(store, run_id)
    private_redis.stop()  # a clean restart: nothing lost, but a new run_id
    private_redis.start()
    snapshot = snapshot_aof(private_redis, tmp_path / "aof-after-first-restart")

    held = bump(store, run_id)
    assert held >= e + 1000
    restart_from(private_redis, snapshot)  # the jump is lost
    assert epoch_of(store, run_id) == e

    fresh = bump(store, run_id)
    assert fresh > held, (e, held, fresh)
    with pytest.raises(StaleAttemptError):
        store.heartbeat(run_id, held, "t")
    store.heartbeat(run_id, fresh, "t")
