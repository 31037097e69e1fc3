"""One run shape on each deployment topology, for docs/scaling.md.

``python -m benchmarks.topologies [--runs 200] [--only redis,rabbitmq,cluster]``

Topologies: ``redis`` (one private Redis is broker and journal, as
docker-compose runs it), ``rabbitmq`` (the RabbitMQ on localhost:5672 as the
broker, a private Redis as the journal) and ``cluster`` (a private Redis as the
broker, three private Redis Cluster masters as the journal). Every Redis here
runs with its append-only file and ``appendfsync everysec``, as in RESULTS.md.

Each topology gets two worker processes, one per kind of queue, as the Scaling
page recommends: the coordinator queue on ``-P threads -c 1`` (one coordinator
slot), the steps and agents queues on ``-P threads -c 8``. Then:

- latency: one-step workflows run one after another, start to completed;
- throughput: ``--runs`` runs of ``shape`` (four steps and a ``parallel`` of
  eight steps) started together; runs/s, and start to completed per run;
- cost per run: the seconds each kind of task ran, summed from the workers'
  task events (``task-succeeded`` carries each task's runtime), divided by the
  runs. Coordinator seconds per run is what sizes the coordinator pool.

It prints a Markdown table. Numbers are from a shared 2-core machine that also
runs the client, both workers and every server: read them as ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from celery_durable import Engine, Settings, WorkflowContext, workflow
from celery_durable.local.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.topologies:engine"
LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672//"


@workflow(name="shape", description="Four steps and a parallel of eight", phases=[])
def shape(ctx: WorkflowContext) -> Any:
    first = ctx.step("s1", lambda: 1)
    second = ctx.step("s2", lambda: 2)
    fan = ctx.parallel([lambda i=i: ctx.step(f"p{i}", lambda: i) for i in range(8)])
    third = ctx.step("s3", lambda: 3)
    return ctx.step("s4", lambda: first + second + third + sum(fan))


@workflow(name="one-step", description="One step", phases=[])
def one_step(ctx: WorkflowContext) -> Any:
    return ctx.step("only", lambda: 1)


engine = Engine(workflows=[shape, one_step])
"""What the worker processes load (settings from their environment)."""


@dataclass
class Measured:
    topology: str
    latency_ms: list[float] = field(default_factory=list)
    runs: int = 0
    seconds: float = 0.0
    run_ms: list[float] = field(default_factory=list)
    task_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    task_count: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    redis_usec: list[float] = field(default_factory=list)
    """Command time each journal Redis spent during the throughput phase (with the
    broker's commands where the broker is the same Redis)."""


def environment(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_DURABLE_")}
    for name, value in settings.model_dump().items():
        if value is None or name == "workflows":
            continue
        env[f"CELERY_DURABLE_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


@contextlib.contextmanager
def workers(settings: Settings, logs: Path) -> Iterator[None]:
    """One coordinator slot, eight step and agent slots: two worker processes."""
    layouts = [
        ("coordinator", settings.coordinator_queue, 1),
        ("steps", f"{settings.steps_queue},{settings.agents_queue}", 8),
    ]
    processes = []
    for name, queues, slots in layouts:
        command = [
            sys.executable, "-m", "celery_durable", "worker", "--app", APP, "-Q", queues, "-P", "threads",
            "-c", str(slots), "--loglevel", "WARNING", "--hostname", f"{name}-{uuid.uuid4().hex[:6]}@%h",
        ]  # fmt: skip
        log = open(logs / f"{name}.log", "ab")  # noqa: SIM115
        processes.append(subprocess.Popen(command, env=environment(settings), cwd=ROOT, stdout=log, stderr=log,
                                          start_new_session=True))
    try:
        yield
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)


class TaskClock:
    """Sums each kind of task's runtime from the workers' task events."""

    def __init__(self, client_engine: Engine, measured: Measured) -> None:
        self.app = client_engine.celery
        self.measured = measured
        self.names: dict[str, str] = {}
        self.receiver: Any = None
        self.thread = threading.Thread(target=self._capture, daemon=True)
        self.ready = threading.Event()

    def _received(self, event: dict[str, Any]) -> None:
        # Events carry the displayed name: "<workflow> · coordinator", "· branch 1/0", ...
        shown = str(event.get("name", "?")).rpartition(" · ")[2]
        self.names[event["uuid"]] = "branch" if shown.startswith("branch") else shown.split()[0]

    def _succeeded(self, event: dict[str, Any]) -> None:
        kind = self.names.pop(event["uuid"], "?")
        self.measured.task_seconds[kind] += float(event.get("runtime") or 0.0)
        self.measured.task_count[kind] += 1

    def _capture(self) -> None:
        with self.app.connection_for_read() as connection:
            self.receiver = self.app.events.Receiver(
                connection, handlers={"task-received": self._received, "task-succeeded": self._succeeded}
            )
            self.ready.set()
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> TaskClock:
        self.thread.start()
        self.ready.wait(10)
        time.sleep(0.5)  # the receiver's queue is bound
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(1.0)  # the last events arrive
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.thread.join(5)


def wait_ready(client: Any) -> None:
    """Both workers answer a ping (and so consume)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        replies = client.engine.celery.control.ping(timeout=0.5)
        if len(replies) >= 2:
            return
    raise TimeoutError("the workers did not start")


def command_usec(urls: list[str]) -> list[float]:
    """Microseconds each Redis spent running commands so far (INFO commandstats)."""
    spent = []
    for url in urls:
        with redis.Redis.from_url(url) as client:
            stats = client.info("commandstats")
        spent.append(sum(float(entry["usec"]) for entry in stats.values()))
    return spent


def measure(topology: str, settings: Settings, journal: list[str], runs: int, logs: Path) -> Measured:
    measured = Measured(topology)
    client_engine = Engine([shape, one_step], settings)
    client = client_engine.client()
    with workers(settings, logs):
        wait_ready(client)
        for _ in range(5):  # warm up: scripts loaded, connections made
            client.run_workflow("one-step", timeout=60)
        for _ in range(50):
            started = time.perf_counter()
            envelope = client.run_workflow("one-step", timeout=60)
            assert envelope.status == "completed", envelope.error
            measured.latency_ms.append((time.perf_counter() - started) * 1000)
        with TaskClock(client_engine, measured):
            before = command_usec(journal)
            began = time.perf_counter()
            run_ids = [client.start_workflow("shape") for _ in range(runs)]
            envelopes = [client.wait_for_workflow_run(run_id, timeout=600) for run_id in run_ids]
            measured.seconds = time.perf_counter() - began
            measured.redis_usec = [b - a for a, b in zip(before, command_usec(journal), strict=True)]
        assert all(e.status == "completed" for e in envelopes), {e.error for e in envelopes}
        measured.runs = runs
        for e in envelopes:
            assert e.created_at is not None and e.finished_at is not None
            measured.run_ms.append((e.finished_at - e.created_at).total_seconds() * 1000)
    return measured


@contextlib.contextmanager
def topology(name: str, root: Path) -> Iterator[tuple[Settings, list[str]]]:
    """The settings of a topology, and the URLs of its journal's Redis servers."""
    tag = uuid.uuid4().hex[:8]
    base = {"key_prefix": f"topo{tag}", "lease_seconds": 30}
    if name == "redis":
        with RedisServer(root / "redis", appendfsync="everysec") as server:
            yield Settings(redis_url=server.url, **base), [server.url]
    elif name == "rabbitmq":
        with RedisServer(root / "redis", appendfsync="everysec") as server:
            settings = Settings(redis_url=server.url, broker_url=LOCAL_AMQP, **base)
            try:
                yield settings, [server.url]
            finally:
                from tests.support.topologies import delete_queues

                delete_queues(LOCAL_AMQP, [settings.coordinator_queue, settings.steps_queue, settings.agents_queue])
    elif name == "cluster":
        from tests.support.topologies import RedisClusterNodes

        with RedisServer(root / "broker", appendfsync="everysec") as broker, RedisClusterNodes(
            root / "cluster", appendfsync="everysec"
        ) as cluster:
            settings = Settings(redis_url=cluster.url, redis_cluster=True, broker_url=broker.url, **base)
            yield settings, [f"redis://127.0.0.1:{node.port}" for node in cluster.nodes]
    else:
        raise ValueError(f"unknown topology {name!r}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def report(results: list[Measured]) -> str:
    lines = [
        "| topology | one-step latency p50 / p99 | runs/s (shape, started together) | start -> completed p50 / p99 "
        "| coordinator s per run (passes) | branch s per run (tasks) | journal Redis CPU per run (per node) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in results:
        coord, branch = m.task_seconds.get("coordinator", 0.0), m.task_seconds.get("branch", 0.0)
        per_node = ", ".join(f"{usec / m.runs / 1000:.2f}" for usec in m.redis_usec)
        lines.append(
            f"| {m.topology} | {statistics.median(m.latency_ms):.1f} / {percentile(m.latency_ms, 0.99):.1f} ms "
            f"| {m.runs / m.seconds:.1f} ({m.runs} runs in {m.seconds:.1f} s) "
            f"| {statistics.median(m.run_ms) / 1000:.2f} / {percentile(m.run_ms, 0.99) / 1000:.2f} s "
            f"| {coord / m.runs * 1000:.1f} ms ({m.task_count.get('coordinator', 0) / m.runs:.1f}) "
            f"| {branch / m.runs * 1000:.1f} ms ({m.task_count.get('branch', 0) / m.runs:.1f}) "
            f"| {sum(m.redis_usec) / m.runs / 1000:.2f} ms ({per_node}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--only", default="redis,rabbitmq,cluster")
    options = parser.parse_args()
    results = []
    for name in options.only.split(","):
        root = Path(tempfile.mkdtemp(prefix=f"cd-topology-{name}-"))
        try:
            with topology(name, root) as (settings, journal):
                results.append(measure(name, settings, journal, options.runs, root))
                print(report(results[-1:]).splitlines()[-1], flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(report(results))


if __name__ == "__main__":
    main()
