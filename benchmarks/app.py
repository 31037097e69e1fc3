"""The benchmark's engine: durable workflows and plain Celery tasks on ONE app.

Both sides of every comparison run on the same Celery app configuration (the
engine's: JSON, ``acks_late``, prefetch 1, task events on), on the same broker
and in the same worker processes, so a ratio compares the engines and not two
setups. The plain tasks are registered on ``engine.celery`` with
``shared=False`` like the engine's own tasks.

Plain Celery needs a result backend to wait for a chain or collect a group;
the durable side needs none (the journal holds every result). The backend is
configured here, for the benchmark app only, on the same Redis server (db 1
so its keys stay apart from the journal's).

Workers load this module by import path (``celery-durable worker --app
benchmarks.app:engine``), and read their settings from the
``CELERY_DURABLE_*`` environment the harness gives them.
"""

from __future__ import annotations

import functools
import gc
import os
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import redis
from celery import Task

from celery_durable import Engine, Settings, WorkflowContext, workflow

NOOP_TASK = "bench.noop"
STATS_TASK = "bench.worker_stats"
ECHO_TASK = "bench.echo"
TAIL_MARK_PREFIX = "bench:tail"
"""Key prefix where the replay case's tail step records when it started."""
HOLD_PREFIX = "bench:hold"
"""Key prefix of the lists the sweep case's held runs block on until the case releases them."""
MANY_STEPS = 5
MANY_BRANCHES = 8


class _GcClock:
    """Wall time spent in the cyclic garbage collector, per generation."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            generation = int(info["generation"])
            self.seconds[generation] += time.perf_counter() - self._started
            self.collections[generation] += 1


GC_CLOCK = _GcClock()
gc.callbacks.append(GC_CLOCK)

if os.environ.get("BENCH_GC_FREEZE") == "1":
    # What-if for the engine fix recommended in NOTES.md: once the worker has
    # imported and built everything, move those objects out of the collector's
    # reach, so full collections stop re-walking the whole worker heap.
    from celery.signals import worker_ready

    @worker_ready.connect(weak=False)
    def _freeze_heap(**_: Any) -> None:
        gc.collect()
        gc.freeze()

if os.environ.get("BENCH_NO_MINGLE") == "1":
    # The smoke run (``--quick``) starts a dozen fleets: each worker's Celery
    # "mingle" (a broadcast to neighbours, then a one-second wait for their
    # replies) is most of its start-up. The engine needs nothing of it.
    from celery.worker.consumer.mingle import Mingle

    Mingle.compatible_transport = lambda self, app: False  # type: ignore[method-assign]


def process_stats(types: bool = False) -> dict[str, Any]:
    """CPU seconds and GC seconds of this process so far; with ``types``, how many objects
    of each type the collector tracks (the soak compares them before and after)."""
    times = os.times()
    objects = gc.get_objects()
    stats: dict[str, Any] = {
        "pid": os.getpid(),
        "cpu_seconds": times.user + times.system,
        "gc_seconds": list(GC_CLOCK.seconds),
        "gc_collections": list(GC_CLOCK.collections),
        "gc_objects": len(objects),
    }
    if types:
        stats["gc_types"] = dict(Counter(type(o).__qualname__ for o in objects))
    return stats


def noop_value() -> None:
    """The body of every no-op step: returns nothing, journals JSON null."""
    return None


@workflow(name="bench.sequential", description="n no-op steps in a row", phases=[])
def sequential(ctx: WorkflowContext) -> int:
    n = int(ctx.args["n"])
    for i in range(n):
        ctx.step(f"s{i}", noop_value)
    return n


@workflow(name="bench.fanout", description="parallel of n no-op steps", phases=[])
def fanout(ctx: WorkflowContext) -> int:
    n = int(ctx.args["n"])
    results = ctx.parallel([functools.partial(ctx.step, f"p{i}", noop_value) for i in range(n)])
    return len(results)


def _stage(ctx: WorkflowContext, stage: int) -> Any:
    def run(previous: Any, item: Any, index: int) -> Any:
        return ctx.step(f"st{stage}-{index}", lambda: item)

    return run


@workflow(name="bench.pipeline", description="n items through 3 no-op stages", phases=[])
def pipeline(ctx: WorkflowContext) -> int:
    n = int(ctx.args["n"])
    results = ctx.pipeline(list(range(n)), _stage(ctx, 1), _stage(ctx, 2), _stage(ctx, 3))
    return len(results)


@workflow(name="bench.one-step", description="one no-op step: end-to-end latency", phases=[])
def one_step(ctx: WorkflowContext) -> Any:
    return ctx.step("only", noop_value)


@functools.cache
def _marks() -> redis.Redis:
    """The worker's own Redis client for the replay case's side channel."""
    return redis.Redis.from_url(Settings().redis_url, decode_responses=True)


@workflow(name="bench.replay", description="n journaled steps, then a tail step that fails", phases=[])
def replay(ctx: WorkflowContext) -> None:
    """Every attempt replays the n journaled steps, then re-runs the failed tail.

    The tail records when it started, under the attempt's number, and fails
    again, so the same journal can be resumed once per measurement: the time
    from ``resume_workflow`` to that mark is the cost of replaying n steps.
    """
    n = int(ctx.args["n"])
    for i in range(n):
        ctx.step(f"s{i}", noop_value)
    attempt = ctx.attempt

    def tail() -> None:
        _marks().set(f"{TAIL_MARK_PREFIX}:{ctx.run_id}:{attempt}", repr(time.time()), ex=3600)
        raise RuntimeError("the replay benchmark's tail fails on purpose")

    ctx.step("tail", tail)


@workflow(name="bench.ticker", description="slow steps forever: the recovery case kills its workers", phases=[])
def ticker(ctx: WorkflowContext) -> None:
    seconds = float(ctx.args.get("seconds", 0.02))
    for i in range(int(ctx.args.get("n", 1_000_000))):
        ctx.step(f"t{i}", functools.partial(time.sleep, seconds))


@workflow(name="bench.footprint", description="n steps with a fixed-size payload each", phases=[])
def footprint(ctx: WorkflowContext) -> None:
    n = int(ctx.args["n"])
    payload = "x" * int(ctx.args["payload"])
    for i in range(n):
        ctx.step(f"s{i}", lambda: payload)


@workflow(name="bench.timer", description="sleeps until a common instant, then one no-op step", phases=[])
def timer(ctx: WorkflowContext) -> None:
    ctx.sleep_until(datetime.fromtimestamp(int(ctx.args["at_ms"]) / 1000, UTC))
    ctx.step("after", noop_value)


@workflow(name="bench.many", description="5 no-op steps, then a parallel of 8 no-op steps", phases=[])
def many(ctx: WorkflowContext) -> int:
    for i in range(MANY_STEPS):
        ctx.step(f"s{i}", noop_value)
    results = ctx.parallel([functools.partial(ctx.step, f"p{i}", noop_value) for i in range(MANY_BRANCHES)])
    return len(results)


TYPICAL_STEPS = 10
TYPICAL_BRANCHES = 8
TYPICAL_RECORDS = 20


@workflow(name="bench.typical", description="10 steps, a parallel of 8 steps, 20 progress records", phases=[])
def typical(ctx: WorkflowContext) -> int:
    """The capacity case's run of a typical shape (issue 28): what one settled run costs Redis."""
    for i in range(TYPICAL_STEPS):
        ctx.step(f"s{i}", noop_value)
        ctx.log(f"step {i} done")
    results = ctx.parallel([functools.partial(ctx.step, f"p{i}", noop_value) for i in range(TYPICAL_BRANCHES)])
    for i in range(TYPICAL_RECORDS - TYPICAL_STEPS):
        ctx.log(f"record {i}")
    return len(results)


@workflow(name="bench.calls", description="n ctx.calls of the plain no-op task, one after another", phases=[])
def calls(ctx: WorkflowContext) -> int:
    """Each call publishes the task and suspends the run; its answer wakes the next pass."""
    n = int(ctx.args["n"])
    for i in range(n):
        ctx.call(f"c{i}", NOOP_TASK)
    return n


@workflow(name="bench.call-fanout", description="parallel of n ctx.calls of the plain no-op task", phases=[])
def call_fanout(ctx: WorkflowContext) -> int:
    """Every branch is one call: the fan-out's branches suspend and the called tasks run on the fleet."""
    n = int(ctx.args["n"])
    results = ctx.parallel([functools.partial(ctx.call, f"p{i}", NOOP_TASK) for i in range(n)])
    return len(results)


@workflow(name="bench.leaf", description="one no-op step: a child run's work", phases=[])
def leaf(ctx: WorkflowContext) -> Any:
    return ctx.step("leaf", noop_value)


@workflow(name="bench.children", description="parallel of n child runs of one no-op step each", phases=[])
def children(ctx: WorkflowContext) -> int:
    n = int(ctx.args["n"])
    results = ctx.parallel([functools.partial(ctx.child, f"c{i}", "bench.leaf") for i in range(n)])
    return len(results)


def _hold(key: str, seconds: float) -> None:
    """Block (BLPOP: no Redis traffic while it waits) until released, or ``seconds``."""
    _marks().blpop([key], timeout=seconds)


@workflow(name="bench.hold", description="one step that runs until the benchmark releases it", phases=[])
def hold(ctx: WorkflowContext) -> None:
    """A live run that costs Redis only its heartbeat: its one step waits on a list."""
    key = f"{HOLD_PREFIX}:{ctx.args['group']}"
    ctx.step("hold", functools.partial(_hold, key, float(ctx.args.get("seconds", 900))))


WORKFLOWS = [
    sequential, fanout, pipeline, one_step, replay, ticker, footprint, timer, many, hold, calls, call_fanout,
    leaf, children, typical,
]


def build_engine(settings: Settings | None = None) -> Engine:
    """The engine with the benchmark workflows, a result backend and the plain tasks."""
    settings = settings or Settings()
    built = Engine(WORKFLOWS, settings)
    built.celery.conf.update(
        result_backend=os.environ.get("BENCH_RESULT_BACKEND") or _db1(settings.redis_url),
        result_expires=3600,
    )

    @built.celery.task(name=NOOP_TASK, shared=False, ignore_result=False)
    def noop() -> None:
        """A plain Celery task that does nothing: the baseline's unit of work."""
        return None

    @built.celery.task(name=ECHO_TASK, shared=False, ignore_result=False)
    def echo(value: Any) -> Any:
        """Returns its argument: the footprint baseline stores a result of a known size."""
        return value

    @built.celery.task(name=STATS_TASK, shared=False, ignore_result=False)
    def worker_stats(types: bool = False) -> dict[str, Any]:
        """This worker process's CPU and garbage-collector time: profiling evidence."""
        return process_stats(types)

    if os.environ.get("BENCH_NO_SWEEP") == "1":
        _without_sweep(built)
    return built


def _without_sweep(built: Engine) -> None:
    """Workers of this engine run no recovery sweep (nor its worker beat and queue watch).

    The sweep case hosts its live runs on such a fleet, so that all the
    sweeping Redis sees comes from the ``RecoverySweep`` instances the case
    runs itself. Nothing here changes the engine: the worker bootstep that
    ``celery_durable.tasks.recovery.install`` added is taken off this app.
    """
    steps = built.celery.steps["worker"]
    for step in [step for step in steps if step.__name__ == "RecoveryStep"]:
        steps.discard(step)


def _db1(url: str) -> str:
    base, _, _db = url.rpartition("/")
    return f"{base}/1" if base.startswith("redis://") else url


def noop_task(built: Engine) -> Task:
    return built.celery.tasks[NOOP_TASK]


engine = build_engine()
celery_app = engine.celery


def _trace_if_asked() -> None:
    """``BENCH_TRACING=1``: the workers trace every run (an OpenTelemetry SDK
    provider whose exporter drops what it is handed), to measure what spans
    cost against the same cases without (docs/telemetry.md)."""
    if os.environ.get("BENCH_TRACING") != "1":
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


_trace_if_asked()
