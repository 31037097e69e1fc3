"""Step producers that count their runs: what a test of re-running asks
(sagas, resume) is how often each ran. One counter for the modules that use
them; each test clears it first."""

from __future__ import annotations

from collections import Counter

calls: Counter[str] = Counter()
BROKEN: set[str] = set()
"""Keys whose producer fails however often it runs (the user has not fixed it yet)."""


def did(key: str) -> str:
    calls[key] += 1
    return key


def fails_first(key: str) -> str:
    """Fails its first run, and every run while ``key`` is in ``BROKEN``."""
    did(key)
    if calls[key] == 1 or key in BROKEN:
        raise RuntimeError(f"{key} failed on run {calls[key]}")
    return key


def fails(key: str) -> str:
    did(key)
    raise RuntimeError(key)
