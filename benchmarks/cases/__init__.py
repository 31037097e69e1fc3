"""The cases of the benchmark: the seven of the engine's issue, in its order, the web view's, then
the cases of issues 11, 13 and 14 (timers, many runs at once, the soak, the sweep at scale), then
``ctx.call`` of a plain Celery task (SPEC §5a), the replay check before a deploy (SPEC §8a), the
later issues' cases (history, listing, bursts, capacity, throttles), schedules fired by the
workers' sweep (issue 38), and the asyncio client against the sync one from a thread pool (issue 41).

Each module has ``run(bench, plan) -> CaseResult``; the results table is
built from the rows they return.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.cases import (
    async_client,
    bursts,
    calls,
    capacity,
    children,
    fanout,
    footprint,
    history,
    latency,
    listing,
    many,
    pipeline,
    recovery,
    replay,
    replay_check,
    schedules,
    sequential,
    soak,
    sweep,
    throttles,
    timers,
    web,
)
from benchmarks.harness import Bench
from benchmarks.model import CaseResult
from benchmarks.plan import Plan

CaseRunner = Callable[[Bench, Plan], CaseResult]

CASES: dict[str, CaseRunner] = {
    "sequential": sequential.run,
    "fanout": fanout.run,
    "pipeline": pipeline.run,
    "latency": latency.run,
    "replay": replay.run,
    "recovery": recovery.run,
    "footprint": footprint.run,
    "web": web.run,
    "timers": timers.run,
    "many": many.run,
    "soak": soak.run,
    "sweep": sweep.run,
    "calls": calls.run,
    "children": children.run,
    "replay_check": replay_check.run,
    "history": history.run,
    "listing": listing.run,
    "bursts": bursts.run,
    "capacity": capacity.run,
    "throttles": throttles.run,
    "schedules": schedules.run,
    "async_client": async_client.run,
}
