"""The Prometheus metrics a dashboard of runs needs, as ``prometheus_client`` objects.

Counters and histograms only: each process counts what it did, and a scrape
adds the processes up (``exposition.py``: prometheus_client's multiprocess
mode under a prefork worker). A level such as "runs waiting now" is not
something one process knows — the process that began a wait is rarely the
one that ends it — so the web view computes those from storage at scrape
time (``exposition.RunsCollector``) instead of keeping gauges that drift.

Labels are bounded: ``workflow`` takes the registered workflows' names,
every other label a fixed set of words (``docs/telemetry.md``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)
"""Seconds, from a millisecond step to an hour-long call or agent turn."""
SWEEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """Every metric celery-durable exports, registered once on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=registry, buckets=buckets)

        wf = ("workflow",)
        self.runs_created = counter(
            "celery_durable_runs_created_total", "Runs this process started (start_workflow)", wf
        )
        self.runs_started = counter(
            "celery_durable_runs_started_total", "Runs whose first coordinator pass ran here", wf
        )
        self.runs_settled = counter(
            "celery_durable_runs_settled_total",
            "Runs settled here, by final status (completed, error, cancelled, halted, paused)",
            ("workflow", "status"),
        )
        self.tasks = counter(
            "celery_durable_tasks_total",
            "Durable tasks run: coordinator passes, branch tasks, agent turns",
            ("workflow", "task"),
        )
        self.task_seconds = histogram(
            "celery_durable_task_duration_seconds", "How long a durable task ran", ("task",), LATENCY_BUCKETS
        )
        self.queue_wait = histogram(
            "celery_durable_queue_wait_seconds",
            "How long a durable task's message waited in its queue past its due time",
            ("task",),
            LATENCY_BUCKETS,
        )
        self.takeovers = counter(
            "celery_durable_takeovers_total",
            "Attempts found dead and acted on: recovered (a new attempt), halted, recovery_limit",
            ("workflow", "trigger", "outcome"),
        )
        self.ops = counter(
            "celery_durable_ops_journaled_total",
            "Steps, calls and agent turns whose outcome was journaled here, by outcome (ok, failed)",
            ("workflow", "op", "outcome"),
        )
        self.op_seconds = histogram(
            "celery_durable_op_duration_seconds",
            "How long a step ran, a call took from publish to answer, an agent turn ran",
            ("workflow", "op"),
            LATENCY_BUCKETS,
        )
        self.waits = counter(
            "celery_durable_waits_begun_total",
            "Durable waits a sequence began, by kind (timer, signal, call, agent, branches)",
            ("workflow", "kind"),
        )
        self.sweeps = counter("celery_durable_sweep_passes_total", "Recovery sweep passes that found runs due")
        self.sweep_seconds = histogram(
            "celery_durable_sweep_duration_seconds", "How long a sweep pass took", (), SWEEP_BUCKETS
        )
        self.sweep_found = counter(
            "celery_durable_sweep_runs_total",
            "Runs the sweep looked at, by what it found (alive, waiting, dead, settled, gone)",
            ("verdict",),
        )
        self.throttle_waits = counter(
            "celery_durable_throttle_waits_total",
            "Slots asked of a throttle, by outcome: immediate (taken at once), waited (queued), granted (a "
            "waiter given a freed slot), given_back (a slot or place of a dead attempt the sweep gave back)",
            ("throttle", "outcome"),
        )
        self.timers_fired = counter("celery_durable_sweep_timers_fired_total", "Due timers the sweep fired")
