"""Helpers every case uses: alternating sides, timing plain Celery canvases."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from celery.canvas import Signature

from benchmarks.harness import Bench
from benchmarks.model import median
from benchmarks.probes import Probe, Usage
from benchmarks.profiling import recording
from celery_durable.tasks.sending import Outgoing

DURABLE = "durable"
CELERY = "celery"


class KeptSender:
    """A sender that keeps the engine's messages instead of publishing them:
    a case that builds runs through the real scripts runs their passes in
    its own process (``run_durable_task``), and nothing reaches a broker."""

    def __init__(self) -> None:
        self.sent: list[Outgoing] = []

    def send(self, messages: Sequence[Outgoing]) -> None:
        self.sent.extend(messages)

    def send_call(self, engine: Any, record: Any, request: Any) -> None:
        raise RuntimeError("a benchmark workflow built in-process calls no task")


def sides(repeat_index: int, with_baseline: bool = True) -> list[str]:
    """Which side runs first alternates per repeat, so neither always gets a warm cache."""
    if not with_baseline:
        return [DURABLE]
    return [CELERY, DURABLE] if repeat_index % 2 == 0 else [DURABLE, CELERY]


def time_canvas(canvas: Signature, timeout: float) -> float:
    """Seconds from sending a Celery canvas to having its result(s) in hand."""
    started = time.perf_counter()
    result = canvas.apply_async()
    result.get(timeout=timeout)
    return time.perf_counter() - started


def measured(bench: Bench, action: Callable[[], float], side: str = DURABLE) -> tuple[float, Usage]:
    """Run ``action`` (returns seconds) under a worker usage probe, and under py-spy
    when ``--py-spy`` asked for it and this is the durable side."""
    with contextlib.ExitStack() as stack:
        probe = stack.enter_context(Probe(bench))
        if bench.profile_dir is not None and side == DURABLE and bench.workers:
            taken = len(list(bench.profile_dir.glob(f"{bench.profile_case}-*.txt")))
            path = bench.profile_dir / f"{bench.profile_case}-{taken}.txt"
            stack.enter_context(recording(bench.workers[0].pid, path))
        seconds = action()
    return seconds, probe.usage


def usage_summary(usages: list[Usage]) -> dict[str, Any]:
    """Medians of the usage of several runs of one measurement."""
    if not usages:
        return {}
    return {
        "cpu_seconds": median([u.cpu_seconds for u in usages]),
        "gc_seconds": median([u.gc_seconds for u in usages]),
        "gc_full_collections": median([float(u.gc_full_collections) for u in usages]),
        "peak_rss_mb": median([u.peak_rss_kb / 1024 for u in usages]),
        "rss_before_mb": median([u.rss_before_kb / 1024 for u in usages]),
        "peak_reset": all(u.peak_reset for u in usages),
    }


def flush_results(bench: Bench) -> None:
    """Drop plain Celery's stored results between measurements (its backend is db 1)."""
    client = redis.Redis.from_url(bench.engine.celery.conf.result_backend)
    try:
        client.flushdb()
    finally:
        client.close()


def fmt_int(n: int) -> str:
    return f"{n:,}"


@contextlib.contextmanager
def profiled(bench: Bench, label: str) -> Iterator[None]:
    """With ``--py-spy``: record every worker process of the running fleet
    (``DIR/<case>-<label>-w<i>.txt``) for the duration of the block."""
    if bench.profile_dir is None:
        yield
        return
    with contextlib.ExitStack() as stack:
        for i, worker in enumerate(bench.workers):
            path = bench.profile_dir / f"{bench.profile_case}-{label}-w{i}.txt"
            stack.enter_context(recording(worker.pid, path))
        yield
