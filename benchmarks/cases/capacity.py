"""Case 17 (issue 28): a day's capacity of one Redis, measured.

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

import time
from collections.abc import Sequence
from typing import Any

import redis

from benchmarks.bulk import start_runs, wait_settled
from benchmarks.cases.bursts import _Kept
from benchmarks.cases.common import fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row
from benchmarks.plan import Plan
from benchmarks.redisstats import CommandWindow, used_memory
from celery_durable import Engine
from celery_durable.broker.scripts import SCRIPT_NAMES, script_source
from celery_durable.tasks.entry import run_durable_task

CASE = "19. Capacity"
PREFIX = "benchcap"
WORKFLOW = "bench.typical"
PIPELINE_RUNS = 50
"""Stored runs sent in one pipeline."""
SHARED_TAGS = ("{sweep}", "{fleet}", "{ns:")
"""Hash tags every run shares: on a Cluster, one node serves these commands for all runs."""


def _recorded_run(bench: Bench) -> tuple[str, list[tuple[Any, ...]]]:
    """One typical run, run in this process; every command the engine sent Redis for it."""
    from benchmarks.app import WORKFLOWS

    settings = bench.settings.model_copy(update={"key_prefix": PREFIX, "coordinator_queue": f"{PREFIX}.unserved"})
    engine = Engine(WORKFLOWS, settings)
    kept = _Kept()
    engine.sender = kept
    client = engine.client()
    sent: list[tuple[Any, ...]] = []
    original = (redis.Redis.execute_command, redis.client.Pipeline.pipeline_execute_command)

    def single(self: Any, *args: Any, **options: Any) -> Any:
        reply = original[0](self, *args, **options)
        sent.append(args)
        return reply

    def piped(self: Any, *args: Any, **options: Any) -> Any:
        sent.append(args)
        return original[1](self, *args, **options)

    for name in SCRIPT_NAMES:  # loaded before: no NOSCRIPT error and its second try among the commands
        bench.raw.script_load(script_source(name))
    redis.Redis.execute_command = single  # type: ignore[method-assign]
    redis.client.Pipeline.pipeline_execute_command = piped  # type: ignore[method-assign]
    try:
        run_id = client.start_workflow(WORKFLOW)
        while kept.sent:
            message = kept.sent.pop(0)
            run_durable_task(engine, message.task, message.task_id, message.kwargs)
    finally:
        redis.Redis.execute_command, redis.client.Pipeline.pipeline_execute_command = original  # type: ignore[method-assign]
    status = client.get_workflow_run(run_id).status
    if status != "completed":
        raise RuntimeError(f"the recorded run ended {status}")
    return run_id, sent


def _again(commands: Sequence[tuple[Any, ...]], old: str, new: str) -> list[tuple[Any, ...]]:
    return [tuple(a.replace(old, new) if isinstance(a, str) else a for a in args) for args in commands]


def _store(raw: redis.Redis, commands: Sequence[tuple[Any, ...]], old: str, count: int) -> list[str]:
    """``count`` more runs, each ``commands`` with its own run id."""
    ids: list[str] = []
    for start in range(0, count, PIPELINE_RUNS):
        pipe = raw.pipeline(transaction=False)
        for _ in range(min(PIPELINE_RUNS, count - start)):
            new = f"{time.time_ns():016x}{len(ids):016x}"[-32:]
            ids.append(new)
            for args in _again(commands, old, new):
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
    before_cpu = bench.raw.info("cpu")
    before_memory = used_memory(bench.raw)
    started = time.perf_counter()
    with CommandWindow(bench.raw) as window:
        ids = [run_id for run_id, _ in start_runs(bench.client, WORKFLOW, [{}] * runs)]
        states = wait_settled(bench.raw, bench.engine, ids, timeout)
    seconds = time.perf_counter() - started
    after_cpu = bench.raw.info("cpu")
    if any(s.status != "completed" for s in states):
        raise RuntimeError("a typical run did not complete")
    cpu = sum(float(after_cpu[k]) - float(before_cpu[k]) for k in ("used_cpu_user", "used_cpu_sys"))
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
        title="Capacity: what one settled run of a typical shape costs one Redis",
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
        ids = _store(bench.raw, commands, original, stored)
        build_s = time.perf_counter() - built
        per_run = (used_memory(bench.raw) - before) / stored
        sizes = _key_sizes(bench.raw, ids[-1])
        engine = Engine([], bench.settings.model_copy(update={"key_prefix": PREFIX}))
        check = engine.store.load_run(ids[-1])
        if check is None or check.status != "completed":
            raise RuntimeError("a stored run is not a completed run")
    finally:
        _forget(bench.raw)
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
    ]
    result.details = {"fleet": fleet, "stored": stored, "memory_bytes_per_run": per_run, "build_seconds": build_s,
                      "key_sizes": sizes, "engine_commands_per_run": len(commands), "shared_slot_commands": shared}
    return result
