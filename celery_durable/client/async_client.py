"""The asyncio client (SPEC §3): every ``Client`` method as a coroutine.

For asyncio applications (FastAPI, aiohttp, an agent server) that start and
watch runs: a request handler that awaits a run holds no thread, and a
thousand concurrent ``wait_for_workflow_run`` calls in one loop cost no more
threads than one.

There is one implementation of each method: ``Client``'s. An ``AsyncClient``
runs it in a greenlet (``broker/aio_bridge.py``) over a store whose Redis is
``redis.asyncio``, so every Redis command — the same Lua scripts, the look
before a waking script (``store_core.LOOK_FIRST``), the same reply parsers,
the pub/sub wake-up of a wait — is awaited by the event loop. Same
arguments, same results, same errors, by construction.

The one call that is not asyncio is publishing a message (a start, a
signal, a cancel, a pause, a resume: ``Engine.deliver``, kombu's
synchronous producer). It runs in the loop's default executor
(``asyncio.to_thread``): a thread for the moment of the publish, never for
a wait.

Adding a ``Client`` method here is one line, ``name = _mirror(Client.name)``;
``tests/test_async_client.py`` fails while a public ``Client`` method has no
twin.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Self, TypeVar, cast

from celery_durable.broker import RunStore
from celery_durable.broker.aio_bridge import BridgedRedis, await_only, greenlet_spawn
from celery_durable.broker.aio_watch import WatchHub
from celery_durable.broker.connection import connect_asyncio
from celery_durable.broker.events import RunUpdate, RunWatch
from celery_durable.client.client import Client
from celery_durable.tasks.wakes import Wake
from celery_durable.workflows.envelope import ProgressEntry

if TYPE_CHECKING:
    from celery_durable.engine import Engine

P = ParamSpec("P")
R = TypeVar("R")
W = TypeVar("W")


def _mirror_then(
    method: Callable[Concatenate[Client, P], R], wrap: Callable[[R], W]
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, W]]:
    """``Client.<method>`` as a coroutine method of ``AsyncClient`` (same signature, docstring and
    behaviour), its result passed through ``wrap``: a result that reads Redis as it is used is made awaitable."""

    async def mirrored(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> W:
        return wrap(await greenlet_spawn(method, self._client(), *args, **kwargs))

    functools.update_wrapper(mirrored, method)
    return mirrored


def _mirror(
    method: Callable[Concatenate[Client, P], R],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, R]]:
    return _mirror_then(method, lambda result: result)


class _Closing:
    """``async with`` closes it: ``aclose()`` on the way out."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _LoopEngine:
    """The engine as the client's code sees it inside the event loop: the
    same workflows and settings, a store on ``redis.asyncio``, and messages
    published from a worker thread. Everything else is the engine's own."""

    def __init__(self, engine: Engine, store: RunStore) -> None:
        self._engine = engine
        self.store = store

    def deliver(self, wakes: Sequence[Wake]) -> None:
        # kombu publishes synchronously: in a thread, so the loop is not blocked for it.
        await_only(asyncio.to_thread(self._engine.deliver, wakes))

    def client(self, namespace: str | None = None) -> Client:
        """A client on this loop's store, for what a method asks of another
        (a schedule's ``cancel_other`` cancelling the run it started)."""
        return Client(cast("Engine", self), namespace or self._engine.settings.namespace)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class _LoopClient(Client):
    """``Client`` as ``AsyncClient`` runs it: its watches share one subscription per loop."""

    def __init__(self, engine: Engine, namespace: str, hub: WatchHub) -> None:
        super().__init__(engine, namespace)
        self._hub = hub

    def _subscribe(self, run_ids: list[str] | None) -> RunWatch:
        return self._hub.watch(self.engine.store.channel(self.namespace), run_ids)


class AsyncClient(_Closing):
    """One namespace's view of the runs, for asyncio code: ``Client``'s methods, awaited.

    Made by ``engine.async_client(namespace)``. Its Redis connections belong
    to the event loop that first uses it (redis.asyncio's rule); used from
    another loop, it connects again. ``await client.aclose()`` (or ``async
    with``) closes them. Not for a Redis Cluster yet: the store's Cluster
    paths speak to redis-py's synchronous cluster client.
    """

    def __init__(self, engine: Engine, namespace: str) -> None:
        if engine.settings.redis_cluster:
            raise NotImplementedError(
                "AsyncClient does not run on a Redis Cluster yet (redis_cluster=True); "
                "use Client from a thread pool there"
            )
        Client(engine, namespace)  # the same check of the namespace, the same error
        self.engine = engine
        self.namespace = namespace
        self._bound: tuple[asyncio.AbstractEventLoop, _LoopClient, BridgedRedis] | None = None

    def _client(self) -> _LoopClient:
        """The synchronous client whose code a call runs, on this loop's connections."""
        loop = asyncio.get_running_loop()
        if self._bound is None or self._bound[0] is not loop:
            asyncio_client = connect_asyncio(self.engine.settings)
            redis_client = BridgedRedis(asyncio_client)
            store = RunStore(self.engine.settings, cast(Any, redis_client))
            engine = cast("Engine", _LoopEngine(self.engine, store))
            # A settle gives the run's throttle slots back at once, on this loop's store, as
            # the engine's own store does (Engine.gives_back): a cancelled waiter leaves its queue.
            self.engine.gives_back(store, through=engine)
            self._bound = (loop, _LoopClient(engine, self.namespace, WatchHub(asyncio_client)), redis_client)
        return self._bound[1]

    async def aclose(self) -> None:
        """Close this client's Redis connections (it connects again if used after)."""
        if self._bound is not None:
            _, _, redis_client = self._bound
            self._bound = None
            await redis_client.asyncio_client.aclose()

    # -- starting ------------------------------------------------------------
    start_workflow = _mirror(Client.start_workflow)
    run_workflow = _mirror(Client.run_workflow)
    resume_workflow = _mirror(Client.resume_workflow)

    # -- reading -------------------------------------------------------------
    get_workflow_run = _mirror(Client.get_workflow_run)
    wait_for_workflow_run = _mirror(Client.wait_for_workflow_run)
    list_workflow_runs = _mirror(Client.list_workflow_runs)
    reindex_runs = _mirror(Client.reindex_runs)
    get_workflow_run_detail = _mirror(Client.get_workflow_run_detail)
    get_workflow_run_history = _mirror(Client.get_workflow_run_history)
    get_workflow_run_progress = _mirror(Client.get_workflow_run_progress)

    # -- deploying new code ------------------------------------------------------
    check_replay = _mirror(Client.check_replay)
    export_history = _mirror(Client.export_history)

    # -- changing ----------------------------------------------------------------
    cancel_workflow_run = _mirror(Client.cancel_workflow_run)
    pause_workflow_run = _mirror(Client.pause_workflow_run)
    signal_workflow_run = _mirror(Client.signal_workflow_run)

    # -- schedules (SPEC §5d) ------------------------------------------------------
    create_schedule = _mirror(Client.create_schedule)
    get_schedule = _mirror(Client.get_schedule)
    list_schedules = _mirror(Client.list_schedules)
    update_schedule = _mirror(Client.update_schedule)
    pause_schedule = _mirror(Client.pause_schedule)
    unpause_schedule = _mirror(Client.unpause_schedule)
    trigger_schedule = _mirror(Client.trigger_schedule)
    backfill_schedule = _mirror(Client.backfill_schedule)
    delete_schedule = _mirror(Client.delete_schedule)

    # -- throttles (SPEC §5e) ------------------------------------------------------
    set_throttle = _mirror(Client.set_throttle)
    get_throttle = _mirror(Client.get_throttle)
    list_throttles = _mirror(Client.list_throttles)
    delete_throttle = _mirror(Client.delete_throttle)

    # -- the fleet ---------------------------------------------------------------
    list_workers = _mirror(Client.list_workers)
    workflow_meta = _mirror(Client.workflow_meta)

    # -- following: the sync client hands back objects that read Redis as they
    # are used (options checked, the run looked up, when awaited); these wrap
    # them so each read is awaited: ``async with``/``async for`` ----------------

    watch_runs = _mirror_then(Client.watch_runs, lambda watch: AsyncRunWatch(watch))
    follow_workflow_run_progress = _mirror_then(
        Client.follow_workflow_run_progress, lambda records: _AsyncIterator(records)
    )


class AsyncRunWatch(_Closing):
    """``RunWatch`` for asyncio: ``await watch.get(timeout)``, ``async for``, ``async with``."""

    def __init__(self, watch: RunWatch) -> None:
        self._watch = watch

    @property
    def closed(self) -> bool:
        return self._watch.closed

    async def get(self, timeout: float | None = None) -> RunUpdate | None:
        """The next update of a watched run, or None once ``timeout`` seconds passed."""
        return await greenlet_spawn(self._watch.get, timeout)

    def __aiter__(self) -> AsyncIterator[RunUpdate]:
        return self._updates()

    async def _updates(self) -> AsyncIterator[RunUpdate]:
        while not self._watch.closed:
            update = await self.get(None)
            if update is not None:
                yield update

    async def aclose(self) -> None:
        await greenlet_spawn(self._watch.close)


_DONE = object()


class _AsyncIterator(AsyncIterator[ProgressEntry]):
    """A synchronous iterator that reads Redis (``follow``), each step run in a greenlet."""

    def __init__(self, sync: Iterator[ProgressEntry]) -> None:
        self._sync = sync

    async def __anext__(self) -> ProgressEntry:
        item = await greenlet_spawn(next, self._sync, _DONE)
        if item is _DONE:
            raise StopAsyncIteration
        return cast(ProgressEntry, item)

    async def aclose(self) -> None:
        """Stop following: the subscription the iterator holds is closed."""
        close = getattr(self._sync, "close", None)
        if close is not None:
            await greenlet_spawn(close)
