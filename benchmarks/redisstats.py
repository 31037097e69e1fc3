"""What Redis itself counted: commands (``INFO commandstats``), its CPU (``INFO cpu``) and memory (``INFO memory``).

Redis counts every command it executes, those a Lua script calls included
(``redis.call`` inside ``EVALSHA`` shows up under its own name), so a delta
of ``INFO commandstats`` is the whole load a piece of client code put on
the server. It is server-wide: whatever else talks to Redis in the same
window counts too, so callers either measure while nothing else runs, take
the median of short windows, or subtract a background window. ``INFO``
itself is left out of every count (the measurement is not the load).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, cast

import redis

IGNORED = frozenset({"info"})


@dataclass(frozen=True, slots=True)
class Commands:
    """Calls and server time (µs) per command name over some window."""

    calls: Counter[str] = field(default_factory=Counter)
    usec: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    @property
    def total_usec(self) -> float:
        return float(sum(self.usec.values()))

    def top(self, count: int = 12) -> dict[str, int]:
        return dict(self.calls.most_common(count))

    def __sub__(self, other: Commands) -> Commands:
        calls, usec = Counter(self.calls), Counter(self.usec)
        calls.subtract(other.calls)
        usec.subtract(other.usec)
        return Commands(+calls, +usec)


def command_stats(raw: redis.Redis) -> Commands:
    """The server's counters since it started (or since CONFIG RESETSTAT)."""
    calls: Counter[str] = Counter()
    usec: Counter[str] = Counter()
    for key, stats in cast(dict[str, Any], raw.info("commandstats")).items():
        name = str(key).removeprefix("cmdstat_").lower()
        if name in IGNORED or not isinstance(stats, dict):
            continue
        calls[name] = int(stats["calls"])
        usec[name] = int(stats["usec"])
    return Commands(calls, usec)


class CommandWindow:
    """``with CommandWindow(raw) as window:`` ... ``window.commands``: what Redis ran
    meanwhile; ``window.cpu_seconds``: the server's CPU meanwhile (its whole
    process: commands, scripts, network I/O, background work)."""

    def __init__(self, raw: redis.Redis) -> None:
        self.raw = raw
        self.commands = Commands()
        self.cpu_seconds = 0.0
        self._before = Commands()
        self._cpu_before = 0.0

    def __enter__(self) -> CommandWindow:
        self._before = command_stats(self.raw)
        self._cpu_before = server_cpu_seconds(self.raw)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cpu_seconds = server_cpu_seconds(self.raw) - self._cpu_before
        self.commands = command_stats(self.raw) - self._before


def server_cpu_seconds(raw: redis.Redis) -> float:
    """``used_cpu_user + used_cpu_sys`` of ``INFO cpu``: the server process's CPU since it started."""
    cpu = cast(dict[str, Any], raw.info("cpu"))
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def used_memory(raw: redis.Redis) -> int:
    """``used_memory`` of ``INFO memory``: bytes the server holds (data and overhead)."""
    return int(cast(dict[str, Any], raw.info("memory"))["used_memory"])
