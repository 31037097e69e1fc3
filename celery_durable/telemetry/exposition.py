"""Where Prometheus scrapes: a worker's metrics port, and the web view's ``/metrics``.

A prefork worker counts in several processes: the pool's children run the
tasks, the parent runs the recovery sweep. prometheus_client's multiprocess
mode has each process write its counts to its own file in
``PROMETHEUS_MULTIPROC_DIR``; the parent's HTTP server adds them up at each
scrape, so a child that is replaced keeps the counts it made. The mode is
chosen when prometheus_client builds a value, so the directory is set before
celery-durable creates a metric, and the port is bound before the pool
forks: a port already in use stops the worker's start with a clear message
instead of a worker that runs unwatched.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

from celery_durable.telemetry import enable_metrics

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.registry import Collector

    from celery_durable.client.client import Client

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
SCRAPE_MAX_RUNS = 10_000
"""The newest runs of a namespace the web view's scrape counts (a page of the index at a time)."""


class MetricsPortError(RuntimeError):
    """The worker's metrics port cannot be listened on."""


def serve_worker_metrics(port: int, address: str = "127.0.0.1") -> str:
    """Count in this process and the ones it forks, served on ``address:port``;
    returns the multiprocess directory. Call before the worker's pool starts."""
    path = os.environ.get(MULTIPROC_ENV)
    if not path:
        path = tempfile.mkdtemp(prefix="celery-durable-metrics-")
        os.environ[MULTIPROC_ENV] = path
        atexit.register(_remove, path, os.getpid())
    os.makedirs(path, exist_ok=True)
    from prometheus_client import CollectorRegistry, start_http_server, values
    from prometheus_client.multiprocess import MultiProcessCollector

    # Imported before the variable was set (by the app module, say), it counts in memory: look again.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path)  # type: ignore[no-untyped-call]
    try:
        start_http_server(port, address, registry)
    except OSError as exc:
        raise MetricsPortError(
            f"--metrics-port {port}: cannot listen on {address}:{port} ({exc.strerror or exc}); "
            "another process (a second worker on this host?) has it: give each worker its own port"
        ) from None
    enable_metrics()
    return path


def _remove(path: str, owner: int) -> None:
    """The directory this process made, at its exit (not at a forked child's)."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


class RunsCollector:
    """Levels read from storage at scrape time: a namespace's runs by
    workflow and status, and the running ones waiting, by what for."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import GaugeMetricFamily

        runs = GaugeMetricFamily(
            "celery_durable_runs",
            "Runs in the namespace, by workflow and status",
            labels=["namespace", "workflow", "status"],
        )
        waiting = GaugeMetricFamily(
            "celery_durable_runs_waiting",
            "Running runs waiting for the outside world, by kind (timer, signal)",
            labels=["namespace", "kind"],
        )
        by_status: dict[tuple[str, str], int] = {}
        by_kind: dict[str, int] = {"timer": 0, "signal": 0}
        store, namespace = self.client.engine.store, self.client.namespace
        before: float | None = None
        seen = 0
        while seen < SCRAPE_MAX_RUNS:
            batch = store.list_run_ids(namespace, before, 500)
            if not batch:
                break
            before = batch[-1][1]
            seen += len(batch)
            records, _ = store.load_runs([run_id for run_id, _ in batch])
            for record in records:
                key = (record.workflow, record.status)
                by_status[key] = by_status.get(key, 0) + 1
                # A child run or a throttle's slot is fleet work, not the outside world: not counted.
                kind = str(record.waiting_for["kind"]) if record.waiting_for is not None else ""
                if record.status == "running" and kind in by_kind:
                    by_kind[kind] += 1
        for (workflow, status), count in sorted(by_status.items()):
            runs.add_metric([namespace, workflow, status], count)
        for kind, count in sorted(by_kind.items()):
            waiting.add_metric([namespace, kind], count)
        yield runs
        yield waiting
        yield from self._throttles()

    def _throttles(self) -> Iterator[object]:
        """Each throttle's slots held and waiters now (the throttle's name a label, never a key)."""
        from prometheus_client.core import GaugeMetricFamily

        labels = ["namespace", "throttle"]
        holding = GaugeMetricFamily("celery_durable_throttle_holding", "Slots of a throttle held now", labels=labels)
        waiting = GaugeMetricFamily(
            "celery_durable_throttle_waiting", "Waiters for a throttle's slots now", labels=labels
        )
        limit = GaugeMetricFamily(
            "celery_durable_throttle_concurrency", "A throttle's concurrency setting (absent: none)", labels=labels
        )
        namespace = self.client.namespace
        for info in self.client.list_throttles():
            holding.add_metric([namespace, info.name], info.holding)
            waiting.add_metric([namespace, info.name], info.waiting)
            if info.concurrency is not None:
                limit.add_metric([namespace, info.name], info.concurrency)
        yield holding
        yield waiting
        yield limit


def web_metrics(client: Client) -> bytes:
    """The web view's ``/metrics``: its process's own metrics and the namespace's levels."""
    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

    levels = CollectorRegistry()
    collector: Collector = RunsCollector(client)  # type: ignore[assignment]
    levels.register(collector)
    return generate_latest(REGISTRY) + generate_latest(levels)
