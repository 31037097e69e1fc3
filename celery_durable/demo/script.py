"""``celery-durable demo``: a crash mid-booking, on real processes and a real Redis.

What happens, in order, and nothing else:

1. Worker processes start (``celery-durable worker``, each in its own
   process group), on the embedded Redis unless one is configured.
2. The car provider is told to hold its replies (see ``providers``), and a
   trip run starts: flight, hotel and car are booked in parallel.
3. When flight and hotel are journaled and the car's reservation is made but
   its reply held, every worker process group gets SIGKILL.
4. New worker processes start. The demo sends nothing to the run — no
   resume call, no message: the workers' recovery sweep sees that the dead
   attempt's lease was not renewed and takes the run over.
5. The run finishes; the provider receipts show one reservation per service.
6. The car provider sells out, and a second trip starts: flight and hotel
   are booked, the car is refused, and the trip's saga cancels the flight
   and the hotel at their providers; their receipts show the cancellations.

The demo uses its own key prefix and queue names, so it never mixes with
other runs on a shared Redis.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from rich.console import Console

from celery_durable import Engine, RunDetail, RunEnvelope, Settings
from celery_durable.client.client import Client
from celery_durable.demo import view
from celery_durable.demo.providers import Providers, Receipt
from celery_durable.demo.trip import SERVICES, trip
from celery_durable.local.embedded import exit_on_sigterm, redis_for_cli
from celery_durable.local.fleet import LocalWorker

APP = "celery_durable.demo.trip:engine"
HELD = "car"
POLL_SECONDS = 0.05
LOG_DIR = Path(".celery-durable") / "logs"


@dataclass(frozen=True)
class DemoOptions:
    destination: str = "Seattle"
    workers: int = 2
    lease_seconds: float = 3.0
    timeout: float = 60.0
    private_redis: bool = False
    key_prefix: str = "cd-demo"


@dataclass
class DemoResult:
    envelope: RunEnvelope
    detail: RunDetail
    receipts: list[Receipt]
    seconds: float
    undone: RunEnvelope | None = None
    """The second trip, the one the car provider refused."""
    undone_receipts: list[Receipt] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        crashed_fine = self.envelope.status == "completed" and all(r.reservations == 1 for r in self.receipts)
        return crashed_fine and self.undone is not None and undone_as_expected(self.undone, self.undone_receipts)


def undone_as_expected(envelope: RunEnvelope, receipts: list[Receipt]) -> bool:
    """The refused trip: not booked, flight and hotel reserved then cancelled once, no car."""
    by_service = {receipt.service: receipt for receipt in receipts}
    return (
        envelope.status == "completed"
        and isinstance(envelope.result, dict)
        and envelope.result.get("status") == "not_booked"
        and all((by_service[s].reservations, by_service[s].cancellations) == (1, 1) for s in ("flight", "hotel"))
        and (by_service[HELD].reservations, by_service[HELD].cancellations) == (0, 0)
    )


def demo_settings(redis_url: str, options: DemoOptions) -> Settings:
    """The demo's own key prefix, queues and short lease, on the chosen Redis."""
    prefix = options.key_prefix
    return Settings(
        redis_url=redis_url,
        key_prefix=prefix,
        coordinator_queue=f"{prefix}.coordinator",
        steps_queue=f"{prefix}.steps",
        agents_queue=f"{prefix}.agents",
        lease_seconds=options.lease_seconds,
        auto_recover=True,
    )


def worker_env(settings: Settings) -> dict[str, str]:
    """This process's environment, with the demo's settings for its worker processes."""
    return {
        **os.environ,
        "CELERY_DURABLE_REDIS_URL": settings.redis_url,
        "CELERY_DURABLE_KEY_PREFIX": settings.key_prefix,
        "CELERY_DURABLE_COORDINATOR_QUEUE": settings.coordinator_queue,
        "CELERY_DURABLE_STEPS_QUEUE": settings.steps_queue,
        "CELERY_DURABLE_AGENTS_QUEUE": settings.agents_queue,
        "CELERY_DURABLE_LEASE_SECONDS": str(settings.lease_seconds),
        "CELERY_DURABLE_AUTO_RECOVER": "true",
    }


@dataclass
class Demo:
    """One demo: its settings, client, providers and worker processes."""

    console: Console
    options: DemoOptions
    env: dict[str, str]
    engine: Engine
    providers: Providers
    workers: list[LocalWorker] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    after_seq: int = 0
    generation: int = 0

    @property
    def client(self) -> Client:
        return self.engine.client()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, message: str) -> None:
        self.console.print(view.event(self.elapsed(), message))

    def start_workers(self) -> list[LocalWorker]:
        self.generation += 1
        fresh = [
            LocalWorker(
                APP, name=f"w{self.generation}.{n}", env=self.env, concurrency=4,
                log_path=LOG_DIR / f"demo-w{self.generation}.{n}.log",
            ).start()
            for n in range(1, self.options.workers + 1)
        ]
        self.workers += fresh
        return fresh

    def wait_ready(self, workers: list[LocalWorker]) -> None:
        """Until every worker answers a Celery ping: a run started earlier would
        wait in the queue, and with the demo's short lease the sweep would take
        over a run that has not started yet."""
        names = {worker.hostname_prefix for worker in workers}
        deadline = time.monotonic() + self.options.timeout
        while names:
            for reply in self.engine.celery.control.ping(timeout=0.5):
                names -= {name for name in names if any(host.startswith(name) for host in reply)}
            for worker in workers:
                if not worker.alive():
                    raise RuntimeError(f"worker {worker.name} exited at start; see {worker.log_path}")
            if names and time.monotonic() > deadline:
                raise TimeoutError(f"workers {sorted(names)} did not answer a ping within {self.options.timeout:.0f}s")

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.signal_group(signal.SIGTERM)
        for worker in self.workers:
            worker.stop()

    def print_progress(self, run_id: str) -> None:
        """Print the run's progress records written since the last call."""
        while True:
            page = self.client.get_workflow_run_progress(run_id, after_seq=self.after_seq, limit=500)
            for record in page.records:
                self.console.print(view.progress(self.elapsed(), record))
                self.after_seq = record.seq
            if not page.has_more_newer:
                return

    def wait(self, run_id: str, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.options.timeout
        while not done():
            self.print_progress(run_id)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the demo waited {self.options.timeout:.0f}s for {what}")
            time.sleep(POLL_SECONDS)
        self.print_progress(run_id)

    def steps(self, run_id: str) -> dict[str, str]:
        return {row.key: row.status for row in self.client.get_workflow_run_detail(run_id).steps}


def run_demo(console: Console, options: DemoOptions) -> DemoResult:
    """Run the whole demo and return what it proved; raises on a timeout."""
    with redis_for_cli(force_embedded=options.private_redis) as choice:
        settings = demo_settings(choice.url, options)
        engine = Engine([trip], settings)
        raw = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        demo = Demo(
            console=console,
            options=options,
            env=worker_env(settings),
            engine=engine,
            providers=Providers(raw, settings.key_prefix),
        )
        console.print(view.intro(choice.describe(), settings, options.workers))
        try:
            with exit_on_sigterm():  # a killed demo stops its workers too
                return _play(demo, options)
        finally:
            demo.providers.release(HELD)
            demo.providers.restock(HELD)  # the next demo on this Redis starts with cars again
            demo.stop_workers()
            raw.close()


def _play(demo: Demo, options: DemoOptions) -> DemoResult:
    client, providers = demo.client, demo.providers
    providers.restock(HELD)
    providers.hold(HELD)
    first = demo.start_workers()
    demo.say(f"started {len(first)} worker processes: " + ", ".join(view.worker_label(w) for w in first))
    demo.wait_ready(first)
    demo.say("every worker answers a ping")
    demo.say(f"the {HELD} provider will make its reservation but hold its reply (a slow provider)")

    run_id = client.start_workflow("trip", args={"destination": options.destination})
    demo.say(f"started run {run_id} (workflow trip, attempt 1)")
    held_key = f"{run_id}:book-{HELD}"
    demo.wait(
        run_id,
        lambda: providers.is_holding(HELD, held_key)
        and {"book-flight", "book-hotel"} <= {k for k, s in demo.steps(run_id).items() if s == "completed"},
        "flight and hotel to be journaled and the car to be in flight",
    )
    demo.console.print(view.crash_point(demo.elapsed(), client.get_workflow_run_detail(run_id)))

    for worker in first:  # all at once: no worker outlives another
        worker.signal_group(signal.SIGKILL)
    for worker in first:
        code = worker.wait(timeout=10)
        demo.say(f"SIGKILL → process group {worker.pid} ({worker.name}): exited with {view.exit_text(code)}")
    envelope = client.get_workflow_run(run_id)
    demo.say(
        f"Redis still says: {envelope.status}, attempt {envelope.attempt}, book-car "
        f"{demo.steps(run_id).get('book-car', '?')} — but no process is left working on it"
    )
    providers.release(HELD)

    second = demo.start_workers()
    demo.say(f"started {len(second)} new worker processes: " + ", ".join(view.worker_label(w) for w in second))
    demo.say(
        f"the demo sends the run nothing now: the dead attempt's lease ({options.lease_seconds:g} s) is no longer "
        "renewed, and a worker's recovery sweep takes the run over"
    )
    demo.wait(run_id, lambda: client.get_workflow_run(run_id).is_terminal, "the run to finish")
    detail = client.get_workflow_run_detail(run_id)
    receipts = [providers.receipt(service, run_id) for service in SERVICES]
    result = DemoResult(detail.run, detail, receipts, demo.elapsed())
    demo.console.print(view.outcome(result.detail, receipts, result.seconds))
    result.undone, result.undone_receipts = _refused_car(demo, options)
    return result


def _refused_car(demo: Demo, options: DemoOptions) -> tuple[RunEnvelope, list[Receipt]]:
    """The second act: no car left, and the saga undoes the rest of the trip."""
    client, providers = demo.client, demo.providers
    providers.sell_out(HELD)
    demo.say(f"the {HELD} provider is sold out now; a second trip starts")
    run_id = client.start_workflow("trip", args={"destination": options.destination})
    demo.say(f"started run {run_id} (workflow trip)")
    demo.after_seq = 0
    demo.wait(run_id, lambda: client.get_workflow_run(run_id).is_terminal, "the second trip to finish")
    detail = client.get_workflow_run_detail(run_id)
    receipts = [providers.receipt(service, run_id) for service in SERVICES]
    demo.console.print(view.undone(detail, receipts, demo.elapsed()))
    return detail.run, receipts
