"""The cases of the benchmark: the seven of the engine's issue, in its order, then the web view's.

Each module has ``run(bench, plan) -> CaseResult``; the results table is
built from the rows they return.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.cases import fanout, footprint, latency, pipeline, recovery, replay, sequential, web
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
}
