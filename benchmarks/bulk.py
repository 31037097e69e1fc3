"""Many runs at once: start them from a few threads, read their records cheaply.

The cases of many concurrent runs never wait on runs one by one (a
pub/sub subscription each): they read the run hashes in pipelined
``HMGET`` batches, only of the runs not yet settled, and take the times
from the records themselves (``created_at``, ``finished_at``: ms, written
by the engine's scripts), so polling slowly loses no precision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis

from celery_durable import Client, Engine

BATCH = 1_000
FIELDS = ("status", "attempt", "created_at", "finished_at")
SETTLED = frozenset({"completed", "error", "cancelled", "halted", "paused"})


@dataclass(frozen=True, slots=True)
class RunState:
    """What the run hash says about one run."""

    run_id: str
    status: str
    attempt: int
    created_ms: int
    finished_ms: int | None

    @property
    def settled(self) -> bool:
        return self.status in SETTLED


def start_runs(client: Client, name: str, args: Sequence[dict[str, Any]], threads: int = 8) -> list[tuple[str, float]]:
    """Start one run per ``args`` from ``threads`` threads: ``(run_id, time.time() it was sent)`` in order."""

    def start(one: dict[str, Any]) -> tuple[str, float]:
        sent = time.time()
        return client.start_workflow(name, args=one), sent

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(start, args))


def send_all(send: Callable[[int], Any], count: int, threads: int = 8) -> list[tuple[Any, float]]:
    """Call ``send(i)`` for i < count from ``threads`` threads: ``(its result, time.time() before it)``."""

    def one(i: int) -> tuple[Any, float]:
        sent = time.time()
        return send(i), sent

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(count)))


def read_runs(raw: redis.Redis, engine: Engine, run_ids: Sequence[str]) -> list[RunState]:
    """The records of ``run_ids``, read in pipelined batches (no transaction: a snapshot per run is enough)."""
    states: list[RunState] = []
    for start in range(0, len(run_ids), BATCH):
        chunk = run_ids[start : start + BATCH]
        pipe = raw.pipeline(transaction=False)
        for run_id in chunk:
            pipe.hmget(engine.store.run_keys(run_id).run, list(FIELDS))
        for run_id, (status, attempt, created, finished) in zip(chunk, pipe.execute(), strict=True):
            states.append(RunState(
                run_id=run_id,
                status=status or "missing",
                attempt=int(attempt or 0),
                created_ms=int(created or 0),
                finished_ms=int(finished) if finished else None,
            ))
    return states


def wait_settled(
    raw: redis.Redis, engine: Engine, run_ids: Sequence[str], timeout: float, poll: float = 0.25
) -> list[RunState]:
    """Poll until every run settled; its final records, in the order given. Raises TimeoutError."""
    final: dict[str, RunState] = {}
    pending = list(run_ids)
    deadline = time.monotonic() + timeout
    while pending:
        for state in read_runs(raw, engine, pending):
            if state.settled:
                final[state.run_id] = state
        pending = [run_id for run_id in pending if run_id not in final]
        if not pending:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} of {len(run_ids)} runs still not settled after {timeout:.0f} s")
        time.sleep(poll)
    return [final[run_id] for run_id in run_ids]


def wait_until(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.1) -> float:
    """Poll ``condition`` until true; the monotonic time it was first seen true. Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:.0f} s")
        time.sleep(poll)
    return time.monotonic()
