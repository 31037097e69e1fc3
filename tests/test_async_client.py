"""SPEC §3: ``engine.async_client()`` — every ``Client`` method as a coroutine,
same arguments, results and errors, on redis.asyncio, without a thread per wait."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any

import pytest
import redis.asyncio

from celery_durable import (
    AsyncClient,
    Client,
    RunNotFoundError,
    WorkflowResumeError,
    define_workflow,
)
from celery_durable.errors import WorkflowWaitCancelled

pytestmark = pytest.mark.anyio

NOT_YET_MIRRORED: frozenset[str] = frozenset()
"""Client methods without their AsyncClient twin yet (each gets ``name = _mirror(Client.name)``)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis.asyncio runs on asyncio only


def _public_methods(cls: type) -> set[str]:
    """Public methods, inherited ones included (main's Client takes its schedule methods from a mixin)."""
    return {
        name
        for klass in cls.__mro__
        if klass is not object
        for name, member in vars(klass).items()
        if not name.startswith("_") and callable(member)
    }


def waiter_workflow() -> Any:
    def run(ctx: Any) -> Any:
        ctx.phase("Wait")
        ctx.log("waiting for go")
        got = ctx.wait_for_signal("go").payload
        return ctx.step("answer", lambda: {"got": got})

    return define_workflow(
        meta={"name": "async-waiter", "description": "Waits for a signal", "phases": [{"title": "Wait"}]},
        run=run,
    )


# -- the surface ---------------------------------------------------------------------


def test_every_public_client_method_has_an_async_twin() -> None:
    missing = _public_methods(Client) - _public_methods(AsyncClient) - NOT_YET_MIRRORED
    assert not missing, f"Client methods without an AsyncClient twin: {sorted(missing)}"
    stale = NOT_YET_MIRRORED & _public_methods(AsyncClient)
    assert not stale, f"mirrored now, take them out of NOT_YET_MIRRORED: {sorted(stale)}"


@pytest.mark.parametrize("name", sorted(_public_methods(Client) - NOT_YET_MIRRORED))
def test_each_twin_is_a_coroutine_with_the_same_parameters(name: str) -> None:
    twin = getattr(AsyncClient, name)
    assert inspect.iscoroutinefunction(twin)
    assert list(inspect.signature(twin).parameters) == list(inspect.signature(getattr(Client, name)).parameters)
    for parameter in inspect.signature(getattr(Client, name)).parameters.values():
        assert inspect.signature(twin).parameters[parameter.name].default == parameter.default


def test_async_client_is_exported_and_made_by_the_engine(durable) -> None:
    d = durable([waiter_workflow()], worker=False)
    client = d.engine.async_client()
    assert isinstance(client, AsyncClient)
    assert client.namespace == d.engine.settings.namespace
    assert d.engine.async_client("other").namespace == "other"
    with pytest.raises(ValueError, match="namespace"):
        d.engine.async_client("bad namespace!")


# -- same results, same errors ----------------------------------------------------


async def test_reads_and_writes_give_what_the_sync_client_gives(durable, raw_redis) -> None:
    d = durable([waiter_workflow()], worker=False)
    async with d.engine.async_client() as client:
        run_id = await client.start_workflow("async-waiter", args={"n": 1}, idempotency_key="k1")
        assert await client.start_workflow("async-waiter", args={"n": 2}, idempotency_key="k1") == run_id
        envelope = await client.get_workflow_run(run_id)
        assert envelope == d.client.get_workflow_run(run_id)
        assert envelope.status == "pending" and envelope.args == {"n": 1}
        page = await client.list_workflow_runs(status="pending")
        assert [run.run_id for run in page.runs] == [run_id]
        assert await client.get_workflow_run_detail(run_id) == d.client.get_workflow_run_detail(run_id)
        assert await client.get_workflow_run_progress(run_id) == d.client.get_workflow_run_progress(run_id)
        assert await client.get_workflow_run_history(run_id) == d.client.get_workflow_run_history(run_id)
        assert await client.export_history(run_id) == d.client.export_history(run_id)
        checks = await client.check_replay([run_id])
        assert [check.verdict for check in checks] == ["ok"]
        assert await client.reindex_runs() == 1

        await client.signal_workflow_run(run_id, "go", {"x": 1})
        kept = raw_redis.hgetall(d.engine.store.run_keys(run_id).signals)
        assert any('{"x":1}' in value.replace(" ", "") for value in kept.values()), kept
        cancelled = await client.cancel_workflow_run(run_id, timeout=10)
        assert cancelled.status == "cancelled"
        assert d.client.get_workflow_run(run_id) == cancelled
        with pytest.raises(ValueError, match="cancelled"):
            await client.signal_workflow_run(run_id, "go")
        # Cancelled here, it was archived by the async client's own cancel (issue 42): read as the sync client reads it.
        assert raw_redis.exists(d.engine.store.run_keys(run_id).archive)
        assert await client.get_workflow_run_detail(run_id) == d.client.get_workflow_run_detail(run_id)
        assert await client.get_workflow_run_progress(run_id) == d.client.get_workflow_run_progress(run_id)
        assert await client.get_workflow_run_history(run_id) == d.client.get_workflow_run_history(run_id)
        assert await client.export_history(run_id) == d.client.export_history(run_id)
        assert await client.check_replay([run_id]) == d.client.check_replay([run_id])


async def test_errors_are_the_sync_clients(durable) -> None:
    d = durable([waiter_workflow()], worker=False)
    other = durable([waiter_workflow()], worker=False, namespace="other")
    foreign = other.client.start_workflow("async-waiter")
    client = d.engine.async_client()
    for run_id in ("0" * 32, foreign, "", 42):
        with pytest.raises(RunNotFoundError):
            await client.get_workflow_run(run_id)  # type: ignore[arg-type]
    with pytest.raises(RunNotFoundError):
        await client.wait_for_workflow_run(foreign, timeout=1)
    with pytest.raises(WorkflowResumeError) as resumed:
        await client.resume_workflow("0" * 32)
    assert resumed.value.code == "not_found"
    with pytest.raises(ValueError, match="timeout"):
        await client.wait_for_workflow_run(foreign, timeout=-1)
    with pytest.raises(ValueError, match="limit"):
        await client.list_workflow_runs(limit=0)
    with pytest.raises(ValueError, match="no-such-workflow"):
        await client.start_workflow("no-such-workflow")
    with pytest.raises(TypeError):
        await client.get_workflow_run_progress(foreign, bogus=1)  # type: ignore[call-arg]
    with pytest.raises(WorkflowWaitCancelled):
        stop = threading.Event()
        stop.set()
        run_id = await client.start_workflow("async-waiter")
        await client.wait_for_workflow_run(run_id, cancel_event=stop)
    await client.aclose()


async def test_a_run_driven_by_a_worker_settles_through_the_async_client(durable) -> None:
    d = durable([waiter_workflow()])
    client = d.engine.async_client()
    run_id = await client.start_workflow("async-waiter")
    watch = await client.watch_runs([run_id])
    async with watch:
        follow = await client.follow_workflow_run_progress(run_id, timeout=30)
        first = await follow.__anext__()  # the run's first record: its attempt started
        assert first.seq == 1
        await client.signal_workflow_run(run_id, "go", {"ok": True})
        envelope = await client.wait_for_workflow_run(run_id, timeout=30)
        assert envelope.status == "completed" and envelope.result == {"got": {"ok": True}}
        rest = [entry async for entry in follow]
        assert "waiting for go" in [entry.message for entry in [first, *rest]]
        assert await watch.get(timeout=5) is not None  # the run's changes were announced
    assert watch.closed
    await client.aclose()


async def test_run_pause_and_resume_through_the_async_client(durable) -> None:
    quick = define_workflow(
        meta={"name": "async-quick", "description": "Returns its args", "phases": []},
        run=lambda ctx: ctx.step("echo", lambda: ctx.args),
    )
    d = durable([waiter_workflow(), quick])
    client = d.engine.async_client()
    envelope = await client.run_workflow("async-quick", args={"a": [1, 2]}, timeout=30)
    assert envelope.status == "completed" and envelope.result == {"a": [1, 2]}
    assert envelope == d.client.get_workflow_run(envelope.run_id)

    run_id = await client.start_workflow("async-waiter")
    await _until(lambda: _waits_for_signal(client, run_id), "the run waits for its signal")
    paused = await client.pause_workflow_run(run_id, timeout=30)
    assert paused.status == "paused"
    await client.signal_workflow_run(run_id, "go", 7)  # kept while paused
    resumed = await client.resume_workflow(run_id, timeout=30)
    assert resumed.status == "completed" and resumed.result == {"got": 7}
    assert resumed.attempt == 2
    await client.aclose()


async def _waits_for_signal(client: AsyncClient, run_id: str) -> bool:
    waiting = (await client.get_workflow_run(run_id)).snapshot.get("waiting_for")
    return waiting is not None and waiting.get("kind") == "signal"


async def test_the_sync_store_is_never_used(durable) -> None:
    """Every Redis command of an async call goes through redis.asyncio: the
    engine's synchronous store (made on first use) is never made."""
    d = durable([waiter_workflow()], worker=False)
    engine = d.engine
    engine._store = None  # the fixture's client made it; forget it to see whether anything makes it again
    client = engine.async_client()
    run_id = await client.start_workflow("async-waiter")
    await client.get_workflow_run_detail(run_id)
    await client.list_workflow_runs(workflow="async-waiter")
    await client.signal_workflow_run(run_id, "go")
    await client.cancel_workflow_run(run_id, timeout=10)
    # A schedule's cancel_other cancels the run it started on the loop's store too.
    await client.create_schedule("async-sched", "async-waiter", every=3600, overlap="cancel_other")
    first = await client.trigger_schedule("async-sched")
    second = await client.trigger_schedule("async-sched")
    assert first is not None and second not in (None, first)
    assert (await client.get_workflow_run(first)).status == "cancelled"
    # A cancelled throttle waiter leaves the queue at once, as through the sync client (SPEC §5e).
    await client.set_throttle("async-one", concurrency=1)
    holder = await client.start_workflow("async-waiter", throttle="async-one")
    waiter = await client.start_workflow("async-waiter", throttle="async-one")
    queued = await client.get_throttle("async-one")
    assert (queued.holding, queued.waiting) == (1, 1)
    await client.cancel_workflow_run(waiter, timeout=10)
    assert (await client.get_throttle("async-one")).waiting == 0
    await client.cancel_workflow_run(holder, timeout=10)
    assert (await client.get_throttle("async-one")).holding == 0
    assert engine._store is None
    await client.aclose()


# -- waiting holds no thread -------------------------------------------------------------


async def _numsub(url: str, channel: str) -> int:
    async with redis.asyncio.Redis.from_url(url) as raw:
        return int(dict(await raw.pubsub_numsub(channel))[channel.encode()])


async def _until(predicate: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"not reached within {timeout}s: {what}"
        await asyncio.sleep(0.02)  # a condition polled, not a sleep that stands in for one


def _watching(client: AsyncClient) -> int:
    """How many watches the client's shared subscription serves (internal, for this test)."""
    return 0 if client._bound is None else client._bound[1]._hub.watching


async def test_a_thousand_concurrent_waits_hold_no_more_threads_than_none(durable) -> None:
    d = durable([waiter_workflow()], worker=False)
    run_ids = [d.client.start_workflow("async-waiter") for _ in range(1000)]
    client = d.engine.async_client()
    await client.get_workflow_run(run_ids[0])  # connect first: the loop's own machinery
    channel = d.engine.store.channel(client.namespace)
    before = threading.active_count()
    peak = before
    waits = [asyncio.create_task(client.wait_for_workflow_run(run_id, timeout=120)) for run_id in run_ids]

    async def all_watching() -> bool:
        nonlocal peak
        peak = max(peak, threading.active_count())
        return _watching(client) == 1000

    await _until(all_watching, "1000 waits subscribed")
    assert not any(wait.done() for wait in waits)
    subscriptions = await _numsub(d.settings.redis_url, channel)
    # Settle every run from outside (a pending run is cancelled by the cancel itself).
    for run_id in run_ids:
        d.client._ask_cancel(run_id)
    envelopes = await asyncio.gather(*waits)
    peak = max(peak, threading.active_count())
    assert {envelope.status for envelope in envelopes} == {"cancelled"}
    assert [envelope.run_id for envelope in envelopes] == run_ids
    print(f"threads before: {before}, at the peak of 1000 waits: {peak}; subscriptions: {subscriptions}")
    assert peak == before
    assert subscriptions == 1  # one shared subscription, not a connection per wait
    await _until(lambda: _zero(d.settings.redis_url, channel), "the subscription closed with the last wait")
    await client.aclose()


async def _zero(url: str, channel: str) -> bool:
    return await _numsub(url, channel) == 0


async def test_a_cancelled_wait_closes_its_subscription(durable) -> None:
    d = durable([waiter_workflow()], worker=False)
    client = d.engine.async_client()
    run_id = await client.start_workflow("async-waiter")
    channel = d.engine.store.channel(client.namespace)
    wait = asyncio.create_task(client.wait_for_workflow_run(run_id))
    await _until(lambda: _numsub_is(d.settings.redis_url, channel, 1), "the wait subscribed")
    wait.cancel()
    with pytest.raises(asyncio.CancelledError):
        await wait
    assert await _numsub(d.settings.redis_url, channel) == 0
    assert (await client.get_workflow_run(run_id)).status == "pending"  # the run goes on
    await client.aclose()


async def test_a_wait_cancelled_at_any_point_ends(durable) -> None:
    """Cancelled wherever it is (subscribing, reading the run, waiting for an
    update), the wait ends: a cancellation that redis.asyncio swallows around
    a command whose reply was in is told to the code at its next await."""
    d = durable([waiter_workflow()], worker=False)
    client = d.engine.async_client()
    run_id = await client.start_workflow("async-waiter")
    for steps in range(30):
        wait = asyncio.create_task(client.wait_for_workflow_run(run_id))
        for _ in range(steps):
            await asyncio.sleep(0)  # let the wait run this many loop steps, then cancel it there
        wait.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(wait, timeout=10)
    assert _watching(client) == 0
    assert await _numsub(d.settings.redis_url, d.engine.store.channel(client.namespace)) == 0
    await client.aclose()


async def _numsub_is(url: str, channel: str, count: int) -> bool:
    return await _numsub(url, channel) == count


async def test_a_wait_wakes_on_the_change_not_on_the_poll(durable) -> None:
    d = durable([waiter_workflow()], worker=False)
    client = d.engine.async_client()
    run_id = await client.start_workflow("async-waiter")
    channel = d.engine.store.channel(client.namespace)
    wait = asyncio.create_task(client.wait_for_workflow_run(run_id, poll_interval_ms=3_600_000))
    await _until(lambda: _numsub_is(d.settings.redis_url, channel, 1), "the wait subscribed")
    started = time.monotonic()
    await asyncio.to_thread(d.client._ask_cancel, run_id)
    envelope = await asyncio.wait_for(wait, timeout=10)
    latency = time.monotonic() - started
    assert envelope.status == "cancelled"
    assert latency < 5  # woken by pub/sub: the poll would take an hour
    await client.aclose()


async def test_a_quiet_subscription_outlives_the_socket_timeout(durable) -> None:
    """The shared subscription reads with a timeout of its own: silence longer
    than redis_timeout_seconds is no error, and the wake still comes."""
    d = durable([waiter_workflow()], worker=False, redis_timeout_seconds=0.2)
    client = d.engine.async_client()
    run_id = await client.start_workflow("async-waiter")
    wait = asyncio.create_task(client.wait_for_workflow_run(run_id, poll_interval_ms=3_600_000))
    await _until(lambda: _numsub_is(d.settings.redis_url, d.engine.store.channel(client.namespace), 1), "subscribed")
    quiet = asyncio.Event()
    asyncio.get_running_loop().call_later(1.0, quiet.set)  # five socket timeouts of silence
    await quiet.wait()
    assert not wait.done()
    d.client._ask_cancel(run_id)
    assert (await asyncio.wait_for(wait, timeout=10)).status == "cancelled"
    await client.aclose()


async def test_a_call_queued_behind_every_connection_waits_past_the_socket_timeout(durable) -> None:
    """Every pooled connection busy for longer than redis_timeout_seconds:
    the next call queues until one is free, then answers (1,000 runs started
    at once on a loaded machine failed with "No connection available" when
    the queue had the socket timeout as its bound)."""
    from celery_durable.broker.connection import ASYNC_CONNECTIONS

    d = durable([waiter_workflow()], worker=False, redis_timeout_seconds=0.2)
    run_id = d.client.start_workflow("async-waiter")
    client = d.engine.async_client()
    await client.get_workflow_run(run_id)  # connected
    assert client._bound is not None
    pool = client._bound[2].asyncio_client.connection_pool
    held = [await pool.get_connection() for _ in range(ASYNC_CONNECTIONS)]
    queued = asyncio.create_task(client.get_workflow_run(run_id))
    done, _ = await asyncio.wait({queued}, timeout=1.0)  # five socket timeouts in the queue
    assert not done
    for connection in held:
        await pool.release(connection)
    assert (await asyncio.wait_for(queued, timeout=10)).run_id == run_id
    await client.aclose()


async def test_an_unreachable_redis_is_the_same_storage_error(settings) -> None:
    from celery_durable import Engine, StorageUnavailableError
    from celery_durable.local.redis_server import free_port

    gone = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0", "redis_timeout_seconds": 1})
    engine = Engine([waiter_workflow()], gone)
    client = engine.async_client()
    with pytest.raises(StorageUnavailableError) as async_error:
        await client.get_workflow_run("0" * 32)
    with pytest.raises(StorageUnavailableError) as sync_error:
        engine.client().get_workflow_run("0" * 32)
    assert type(async_error.value) is type(sync_error.value)
    await client.aclose()


def test_the_bridge_refuses_to_run_outside_the_async_client() -> None:
    from celery_durable.broker.aio_bridge import await_only

    async def never() -> None:
        raise AssertionError("not awaited")

    with pytest.raises(RuntimeError, match="outside AsyncClient"):
        await_only(never())
