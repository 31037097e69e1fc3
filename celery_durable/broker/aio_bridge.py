"""The store's one implementation, driven from an asyncio event loop.

``AsyncClient`` must do exactly what ``Client`` does — the same checks, the
same scripts, the same wake-path rule (``store_core.LOOK_FIRST``), the same
reply parsers and errors — without blocking the loop and without a thread per
call. Two copies of that logic, one with ``await`` in it, would drift. So the
async client runs the *same* code, in a greenlet, over a Redis client whose
every command is awaited on ``redis.asyncio`` by the event loop: when the
store's code calls ``client.hgetall(...)``, :func:`await_only` hands the
coroutine to the loop and the greenlet sleeps until its reply is in. The
loop stays free, and a thousand waiting callers are a thousand greenlets (a
few KB each), not a thousand threads. This is SQLAlchemy's asyncio design
(``sqlalchemy.util._concurrency_py3k``: ``greenlet_spawn``/``await_only``),
which runs its one ORM under both APIs.

What this module offers the store is the subset of redis-py's synchronous
surface the store uses (commands, ``pipeline``, ``register_script``,
``pubsub``), each a thin forward to ``redis.asyncio``. A command is a
method of redis-py's own, looked up by name, so nothing here lists them.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

import greenlet
import redis.asyncio
from redis.commands.core import Script

P = ParamSpec("P")
R = TypeVar("R")


class _LoopGreenlet(greenlet.greenlet):  # type: ignore[misc]
    """A greenlet running store code for the event loop's task in ``driver``."""

    def __init__(self, fn: Callable[..., Any], driver: greenlet.greenlet) -> None:
        super().__init__(fn, driver)
        self.driver = driver
        # Share the task's contextvars (a caller's tracing span, say) with the code it runs.
        self.gr_context = driver.gr_context


def in_loop_greenlet() -> bool:
    """Whether the caller runs under :func:`greenlet_spawn` (so may :func:`await_only`)."""
    return isinstance(greenlet.getcurrent(), _LoopGreenlet)


def await_only(awaitable: Awaitable[R]) -> R:
    """The result of ``awaitable``, awaited by the event loop, from synchronous
    code that :func:`greenlet_spawn` runs; the loop serves others meanwhile."""
    current = greenlet.getcurrent()
    if not isinstance(current, _LoopGreenlet):
        if asyncio.iscoroutine(awaitable):
            awaitable.close()  # never awaited: say why, not "coroutine was never awaited"
        raise RuntimeError("asyncio-backed storage used outside AsyncClient (no greenlet_spawn around the call)")
    return cast(R, current.driver.switch(awaitable))


async def greenlet_spawn(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run synchronous ``fn`` in a greenlet, awaiting for it whatever it hands
    to :func:`await_only`; its result, or its exception. A cancellation of the
    awaiting task is raised inside ``fn`` where it waits, so its ``finally``
    and ``with`` blocks run (a subscription is closed) before it propagates."""
    task = asyncio.current_task()
    cancels = task.cancelling() if task is not None else 0
    told = False
    child = _LoopGreenlet(fn, greenlet.getcurrent())
    result: Any = child.switch(*args, **kwargs)
    while not child.dead:
        try:
            value = await result
        except BaseException as exc:
            told = told or isinstance(exc, asyncio.CancelledError)
            result = child.throw(*sys.exc_info())
        else:
            if not told and task is not None and task.cancelling() > cancels:
                # The task was cancelled, but what it awaited finished anyway
                # and swallowed the CancelledError (redis.asyncio may, around a
                # command whose reply was in): tell the code now, or a wait
                # would go on for ever in a task asked to stop.
                told = True
                result = child.throw(asyncio.CancelledError())
            else:
                result = child.switch(value)
    return cast(R, result)


class _Forward:
    """Forwards redis-py calls by name to an asyncio object, awaiting what they return."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._target, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if result is self._target:  # a pipeline's queued command returns the pipeline
                return self
            return await_only(result) if asyncio.iscoroutine(result) or isinstance(result, Awaitable) else result

        return call


class BridgedPipeline(_Forward):
    """``redis.asyncio``'s pipeline with a synchronous face: commands queue, ``execute`` awaits."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        return cast(list[Any], await_only(self._target.execute(raise_on_error=raise_on_error)))


class BridgedRedis(_Forward):
    """A synchronous ``redis.Redis`` look-alike over ``redis.asyncio.Redis``, for the store's code in a greenlet."""

    def __init__(self, target: redis.asyncio.Redis) -> None:
        super().__init__(target)
        self.asyncio_client = target

    def get_encoder(self) -> Any:
        return self._target.get_encoder()

    def register_script(self, script: str) -> Script:
        # redis-py's own Script: its sha is computed here, and calling it runs
        # evalsha (loading the script on NoScriptError) through this client.
        return Script(cast(Any, self), script)

    def pipeline(self, transaction: bool = True) -> BridgedPipeline:
        return BridgedPipeline(self._target.pipeline(transaction=transaction))

