"""What the workers spent during one measurement: CPU, garbage collection, peak RSS.

These are the first profiler evidence for a miss: a case that is slow while
the worker's CPU is idle waits on something; one whose worker spends its CPU
in the garbage collector allocates too much. CPU and GC come from the worker
itself (a plain ``bench.worker_stats`` task; with the threads pool that is the
process every task ran in), peak RSS from ``/proc/<pid>/status`` ``VmHWM`` of
every process of the worker's process group, reset before the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from benchmarks.harness import proc_status_kb, reset_peak_rss

if TYPE_CHECKING:
    from benchmarks.harness import Bench

STATS_TIMEOUT = 60


@dataclass
class Usage:
    """One measurement's worker usage (sums over worker processes)."""

    cpu_seconds: float = 0.0
    gc_seconds: float = 0.0
    gc_full_collections: int = 0
    rss_before_kb: int = 0
    peak_rss_kb: int = 0
    peak_reset: bool = False
    processes: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Probe:
    """``with Probe(bench) as probe:`` around a measurement; then read ``probe.usage``."""

    bench: Bench
    usage: Usage = field(default_factory=Usage)
    _before: list[dict[str, Any]] = field(default_factory=list)

    def _stats(self) -> list[dict[str, Any]]:
        task = self.bench.engine.celery.tasks["bench.worker_stats"]
        return [task.apply_async().get(timeout=STATS_TIMEOUT) for _ in self.bench.workers]

    def __enter__(self) -> Probe:
        # Keyed by pid: with several workers, two calls may reach the same one.
        self._before = list({stats["pid"]: stats for stats in self._stats()}.values())
        pids = self.bench.worker_pids()
        self.usage.processes = len(pids)
        self.usage.rss_before_kb = sum(proc_status_kb(pid, "VmRSS") for pid in pids)
        self.usage.peak_reset = all([reset_peak_rss(pid) for pid in pids])
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            return
        self.usage.peak_rss_kb = sum(proc_status_kb(pid, "VmHWM") for pid in self.bench.worker_pids())
        after = {stats["pid"]: stats for stats in self._stats()}
        for before in self._before:
            now = after.get(before["pid"])
            if now is None:
                continue
            self.usage.cpu_seconds += now["cpu_seconds"] - before["cpu_seconds"]
            self.usage.gc_seconds += sum(now["gc_seconds"]) - sum(before["gc_seconds"])
            self.usage.gc_full_collections += now["gc_collections"][2] - before["gc_collections"][2]
