"""``--py-spy DIR``: sample the worker with py-spy while each case runs.

py-spy attaches to the running worker process by pid (no restart, no code
change) and samples only the thread holding the GIL (``--gil``), so the
stacks say where the worker's Python time goes. Each case gets a raw
collapsed-stack file; the case's notes get the engine frames that were on
the stack most often (inclusive), which is the evidence NOTES.md cites.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

RATE_HZ = 200
ATTACH_SECONDS = 0.5
"""py-spy needs a moment to attach; the measurement starts after it."""


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def recording(pid: int, path: Path) -> Iterator[bool]:
    """Record ``pid`` into ``path`` (collapsed stacks) for the duration of the block."""
    binary = py_spy()
    if binary is None:
        yield False
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [binary, "record", "--pid", str(pid), "--output", str(path), "--format", "raw",
         "--rate", str(RATE_HZ), "--gil", "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(ATTACH_SECONDS)
    try:
        yield True
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


SKIP = (
    "celery_durable/cli", "celery_durable/__main__", "celery_durable/tasks/transport",
    "RunStore._run ", "_GuardedStore.",
)
"""Frames with no information: every worker stack has the CLI entry and the
consumer loop, and every journal call passes through ``RunStore._run`` (the
store method above it says which script it was)."""


def summarize(paths: list[Path], top: int = 8, needle: str = "celery_durable/") -> list[tuple[float, str]]:
    """Where the samples were, by the deepest engine frame on each stack.

    Inclusive shares would put the task entry points on top of every list;
    the deepest engine frame names the engine call that was being made (a
    journal write, a replay, a dispatch), with redis-py and Celery time below
    it counted to it. Samples with no engine frame count as "outside the engine".
    """
    deepest: Counter[str] = Counter()
    total = 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            total += int(count)
            frames = [f for f in stack.split(";") if needle in f and not any(skip in f for skip in SKIP)]
            deepest[frames[-1] if frames else "outside the engine (Celery, kombu, idle loop)"] += int(count)
    if not total:
        return []
    return [(100 * n / total, frame) for frame, n in deepest.most_common(top)]
