"""Case 19 (issue 28): a day's capacity of one Redis and of a 3-master cluster, measured.

A run of a typical shape (``bench.typical``: 10 steps, a parallel of 8
steps, 20 progress records) costs Redis memory while it is retained, and
commands (Redis CPU) while it runs. Both are measured here; ``docs/scaling.md``
turns them into runs per day.

Commands per run: ``runs`` real runs on the session's fleet (real workers,
the broker on the same Redis), ``INFO commandstats`` and ``INFO cpu`` around
them, divided by the runs: everything one Redis does for a run, the broker's
messages included, and Lua's own commands counted under their names.

Memory per settled run, at scale: a store of ``stored`` settled runs, built
through the real scripts quickly. One run is run for real in this process
(an engine of its own key prefix, whose messages are kept and run here by the
worker's task body), and every command the engine sent Redis for it (the
scripts with their keys and arguments, and the plain commands beside them) is
recorded; each stored run is that sequence sent again with the run id
replaced, pipelined, so the real scripts build each run as they built the
first. ``INFO memory`` ``used_memory`` before and after, over the runs, is the
memory per run; ``MEMORY USAGE`` of one run's keys says where it goes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.cluster

from benchmarks.bulk import start_runs, wait_settled
from benchmarks.cases import capacity_cluster
from benchmarks.cases.common import KeptSender, fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row
from benchmarks.plan import Plan
from benchmarks.redisstats import CommandWindow, used_memory
from celery_durable import Engine, Settings
from celery_durable.broker.connection import script_source
from celery_durable.broker.ops import SCRIPT_NAMES
from celery_durable.tasks.entry import run_durable_task

CASE = "19. Capacity"
PREFIX = "benchcap"
WORKFLOW = "bench.typical"
PIPELINE_RUNS = 50
"""Stored runs sent in one pipeline."""
SHARED_TAGS = ("{sweep}", "{fleet}", "{ns:")
"""Hash tags every run shares: on a Cluster, one node serves these commands for all runs."""


def record_run(settings: Settings, servers: Sequence[redis.Redis]) -> tuple[str, list[tuple[Any, ...]]]:
    """One typical run, run in this process by an engine of ``settings``
    (its journal one Redis or a cluster, whose servers are ``servers``):
    every command the engine sent Redis for it."""
    from benchmarks.app import WORKFLOWS

    engine = Engine(WORKFLOWS, settings)
    kept = KeptSender()
    engine.sender = kept
    client = engine.client()
    sent: list[tuple[Any, ...]] = []
    # Where the engine's commands leave redis-py: a client's and a pipeline's,
    # of one Redis and of a cluster (whose pipeline has its own entry).
    targets = (
        (redis.Redis, "execute_command", False),
        (redis.client.Pipeline, "pipeline_execute_command", True),
        (redis.cluster.RedisCluster, "execute_command", False),
        (redis.cluster.ClusterPipeline, "execute_command", True),
    )
    originals = [getattr(cls, name) for cls, name, _ in targets]

    def recording(original: Any, staged: bool) -> Any:
        def call(self: Any, *args: Any, **options: Any) -> Any:
            if staged:
                sent.append(args)
                return original(self, *args, **options)
            reply = original(self, *args, **options)
            sent.append(args)
            return reply

        return call

    for name in SCRIPT_NAMES:  # loaded before: no NOSCRIPT error and its second try among the commands
        for server in servers:
            server.script_load(script_source(name))
    for (cls, name, staged), original in zip(targets, originals, strict=True):
        setattr(cls, name, recording(original, staged))
    try:
        run_id = client.start_workflow(WORKFLOW)
        while kept.sent:
            message = kept.sent.pop(0)
            run_durable_task(engine, message.task, message.task_id, message.kwargs)
    finally:
        for (cls, name, _), original in zip(targets, originals, strict=True):
            setattr(cls, name, original)
    status = client.get_workflow_run(run_id).status
    if status != "completed":
        raise RuntimeError(f"the recorded run ended {status}")
    return run_id, sent


def _recorded_run(bench: Bench) -> tuple[str, list[tuple[Any, ...]]]:
    settings = bench.settings.model_copy(update={"key_prefix": PREFIX, "coordinator_queue": f"{PREFIX}.unserved"})
    return record_run(settings, [bench.raw])


def again(commands: Sequence[tuple[Any, ...]], old: str, new: str) -> list[tuple[Any, ...]]:
    return [tuple(a.replace(old, new) if isinstance(a, str) else a for a in args) for args in commands]


def _store(raw: redis.Redis, commands: Sequence[tuple[Any, ...]], old: str, count: int) -> list[str]:
    """``count`` more runs, each ``commands`` with its own run id."""
    ids: list[str] = []
    for start in range(0, count, PIPELINE_RUNS):
        pipe = raw.pipeline(transaction=False)
        for _ in range(min(PIPELINE_RUNS, count - start)):
            new = f"{time.time_ns():016x}{len(ids):016x}"[-32:]
            ids.append(new)
            for args in again(commands, old, new):
                pipe.execute_command(*args)
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, redis.ResponseError):
                raise RuntimeError(f"a stored run's command failed: {reply}")
    return ids


def _key_sizes(raw: redis.Redis, run_id: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for key in raw.scan_iter(match=f"{PREFIX}:{{{run_id}}}:*", count=1000):
        name = key.decode() if isinstance(key, bytes) else str(key)
        sizes[name.rsplit("}:", 1)[1]] = int(raw.memory_usage(key, samples=0) or 0)
    return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))


def _forget(raw: redis.Redis) -> None:
    batch: list[Any] = []
    for key in raw.scan_iter(match=f"{PREFIX}*", count=10_000):
        batch.append(key)
        if len(batch) >= 10_000:
            raw.unlink(*batch)
            batch.clear()
    if batch:
        raw.unlink(*batch)


def _fleet_runs(bench: Bench, runs: int, timeout: float) -> dict[str, float]:
    """``runs`` typical runs on the fleet: what Redis did for each (broker included)."""
    bench.use_fleet()
    before_memory = used_memory(bench.raw)
    started = time.perf_counter()
    with CommandWindow(bench.raw) as window:
        ids = [run_id for run_id, _ in start_runs(bench.client, WORKFLOW, [{}] * runs)]
        states = wait_settled(bench.raw, bench.engine, ids, timeout)
    seconds = time.perf_counter() - started
    if any(s.status != "completed" for s in states):
        raise RuntimeError("a typical run did not complete")
    cpu = window.cpu_seconds
    commands = window.commands
    scripts = commands.calls["evalsha"] + commands.calls["eval"]
    return {
        "runs": float(runs),
        "seconds": seconds,
        "runs_per_s": runs / seconds,
        "commands_per_run": commands.total / runs,
        "scripts_per_run": scripts / runs,
        "redis_command_usec_per_run": commands.total_usec / runs,
        "redis_cpu_usec_per_run": 1e6 * cpu / runs,
        "memory_bytes_per_run": (used_memory(bench.raw) - before_memory) / runs,
        "top_commands_per_run": {k: v / runs for k, v in commands.top(15).items()},  # type: ignore[dict-item]
    }


def run(bench: Bench, plan: Plan) -> CaseResult:
    stored = plan.capacity_stored
    result = CaseResult(
        key="capacity",
        title="Capacity: what one settled run of a typical shape costs one Redis and a 3-master cluster",
        setup=f"bench.typical: 10 steps, a parallel of 8 steps, 20 progress records. Commands: {plan.capacity_runs} "
        "runs on the fleet (-P threads -c 4, broker on the same Redis), INFO commandstats and INFO cpu around them. "
        f"Memory: {fmt_int(stored)} settled runs stored through the real scripts (one run recorded in-process, "
        "its commands sent again per run with the run id replaced), INFO used_memory before and after.",
    )
    fleet = _fleet_runs(bench, plan.capacity_runs, plan.timeout)
    try:
        original, commands = _recorded_run(bench)
        shared = sum(1 for args in commands if any(tag in " ".join(map(str, args[:4])) for tag in SHARED_TAGS))
        before = used_memory(bench.raw)
        built = time.perf_counter()
        with CommandWindow(bench.raw) as window:
            ids = _store(bench.raw, commands, original, stored)
        build_s = time.perf_counter() - built
        stored_usec = window.commands.total_usec / stored
        per_run = (used_memory(bench.raw) - before) / stored
        sizes = _key_sizes(bench.raw, ids[-1])
        engine = Engine([], bench.settings.model_copy(update={"key_prefix": PREFIX}))
        check = engine.store.load_run(ids[-1])
        if check is None or check.status != "completed":
            raise RuntimeError("a stored run is not a completed run")
    finally:
        _forget(bench.raw)
    on_cluster = capacity_cluster.measure(bench.settings, PREFIX, stored)
    busiest = max(on_cluster.command_usec_per_run)
    result.rows = [
        Row(CASE, f"Redis memory per settled run, {fmt_int(stored)} stored", "bytes", [per_run],
            note=f"built in {build_s:.0f} s; keys of one run by MEMORY USAGE: "
            + ", ".join(f"{k} {v:,}" for k, v in sizes.items())),
        Row(CASE, "Redis memory per settled run, runs on the fleet", "bytes", [fleet["memory_bytes_per_run"]],
            note=f"{plan.capacity_runs} runs; what their broker messages left included"),
        Row(CASE, "Redis commands per run (Lua's included, broker's included)", "commands",
            [fleet["commands_per_run"]], note=f"{fleet['scripts_per_run']:.1f} scripts; top: "
            + ", ".join(f"{k} {v:.1f}" for k, v in list(fleet["top_commands_per_run"].items())[:8])),  # type: ignore[union-attr]
        Row(CASE, "Redis CPU per run (INFO cpu, user + sys)", "us", [fleet["redis_cpu_usec_per_run"]],
            note=f"of which in commands (commandstats): {fleet['redis_command_usec_per_run']:.0f} us; "
            f"fleet rate {fleet['runs_per_s']:.0f} runs/s"),
        Row(CASE, "engine's commands per run on the slots every run shares ({sweep}, {fleet}, {ns:N})", "commands",
            [float(shared)], note=f"of {len(commands)} top-level commands the engine sent for one run"),
        Row(CASE, f"Redis command time per stored run, one Redis ({fmt_int(stored)} stored)", "us", [stored_usec],
            note="commandstats over the store's build: the engine's scripts and commands, round trips pipelined"),
        Row(CASE, f"Redis memory per settled run, {fmt_int(stored)} stored, {on_cluster.masters}-master cluster",
            "bytes", [sum(on_cluster.memory_per_run)],
            note="per master " + ", ".join(f"{m:,.0f}" for m in on_cluster.memory_per_run)
            + f"; the run recorded on the cluster ({on_cluster.engine_commands_per_run} commands), stored in "
            f"{on_cluster.build_seconds:.0f} s, each command on its slot's master"),
        Row(CASE, f"Redis command time per stored run, busiest of {on_cluster.masters} masters", "us", [busiest],
            note="per master " + ", ".join(f"{u:.0f} us ({c:.0f} commands)" for u, c in
                                           zip(on_cluster.command_usec_per_run, on_cluster.commands_per_run,
                                               strict=True))
            + f"; one Redis / busiest master: {stored_usec / busiest:.2f}x"),
    ]
    result.details = {"fleet": fleet, "stored": stored, "memory_bytes_per_run": per_run, "build_seconds": build_s,
                      "key_sizes": sizes, "engine_commands_per_run": len(commands), "shared_slot_commands": shared,
                      "stored_command_usec_per_run": stored_usec, "cluster": dataclasses.asdict(on_cluster)}
    return result
