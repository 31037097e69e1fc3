"""The engine's recovery sweep, run and measured from the benchmark process.

``RecoverySweep`` (``celery_durable.tasks.recovery``) is the class every
worker runs in a thread. The sweep cases make instances of it here, against
the same Redis and settings as the fleet, and either call ``sweep_once()``
(one pass, measured with ``INFO commandstats`` around it) or ``start()`` them
(their own loop, as in a worker: passes, the worker beat and the broker queue
watch), several at once, to see what a fleet of sweepers costs Redis.

``CountingSweep`` only counts the runs a sweeper looked at (``_look``):
the part of a pass that is proportional to the runs due.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from benchmarks.model import median
from benchmarks.redisstats import CommandWindow
from celery_durable import Engine
from celery_durable.tasks.recovery import RecoverySweep

SCRIPT_COMMANDS = ("evalsha", "eval")


class CountingSweep(RecoverySweep):
    """A recovery sweep that counts the runs it looks at."""

    def __init__(self, engine: Engine, worker_id: str = "") -> None:
        super().__init__(engine, worker_id=worker_id)
        self.looked = 0
        self._count_lock = threading.Lock()

    def _look(self, run_ids: Sequence[str], claim: str, room: str, now: int) -> None:
        with self._count_lock:
            self.looked += len(run_ids)
        super()._look(run_ids, claim, room, now)

    def start_passes(self) -> None:
        """What-if: only the sweep's passes, in a thread of their own, without the worker beat and the
        broker queue watch that ``start()`` adds; ``stop()`` ends it as it ends ``start()``."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="bench-sweep-passes", daemon=True)
        self._thread.start()


@dataclass(frozen=True, slots=True)
class PassCost:
    """One ``sweep_once()``: what Redis ran meanwhile, how long the caller waited, runs looked at."""

    commands: int
    scripts: int
    redis_usec: float
    wall_ms: float
    looked: int
    top: dict[str, int]


def measure_pass(raw: redis.Redis, sweep: CountingSweep) -> PassCost:
    looked = sweep.looked
    with CommandWindow(raw) as window:
        started = time.perf_counter()
        sweep.sweep_once()
        wall = time.perf_counter() - started
    commands = window.commands
    return PassCost(
        commands=commands.total,
        scripts=sum(commands.calls[name] for name in SCRIPT_COMMANDS),
        redis_usec=commands.total_usec,
        wall_ms=1000 * wall,
        looked=sweep.looked - looked,
        top=commands.top(),
    )


def summary(costs: list[PassCost]) -> dict[str, Any]:
    """Medians of several passes (one stray command of another client in a window does not move them)."""
    return {
        "passes": len(costs),
        "commands": median([float(c.commands) for c in costs]),
        "scripts": median([float(c.scripts) for c in costs]),
        "redis_usec": median([c.redis_usec for c in costs]),
        "wall_ms": median([c.wall_ms for c in costs]),
        "looked": median([float(c.looked) for c in costs]),
        "commands_each": [c.commands for c in costs],
        "wall_ms_each": [round(c.wall_ms, 3) for c in costs],
        "top_commands_of_median_pass": sorted(costs, key=lambda c: c.commands)[len(costs) // 2].top,
    }
