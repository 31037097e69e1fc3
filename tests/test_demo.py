"""``celery-durable demo`` as a newcomer runs it: a subprocess on a fresh
machine's terms, so on the private Redis it starts itself; real worker
processes killed with SIGKILL mid-booking, and the same run finishing by
itself with one reservation per service."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.test_examples import run_fresh

pytestmark = pytest.mark.slow  # 11 s on a quiet machine, up to 30 s on a busy one

DEMO = ["demo"]
"""The README's first command, after the install."""


def test_the_demo_kills_every_worker_and_the_run_still_books_each_service_once(tmp_path: Path) -> None:
    # As on a fresh machine: nothing configured, nothing on localhost:6379.
    done = run_fresh(tmp_path, *DEMO)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr

    assert "private redis-server" in out and str(tmp_path / ".celery-durable" / "redis") in out
    killed = re.findall(r"SIGKILL → process group (\d+) \((\S+)\): exited with signal SIGKILL", out)
    assert len(killed) == 2, out
    assert "book-car running" in out  # what Redis said after the kill: a run nobody works on
    assert "Run recovered after its attempt died (attempt 2)" in out
    assert re.search(r"■ completed\s+run \w+ · attempt 2", out), out

    rows = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"│ (flight|hotel|car)\s+│ (\d+)\s+│ (\d+)\s+│", out)}
    assert rows == {"flight": (1, 1), "hotel": (1, 1), "car": (2, 1)}, out
    assert "the idempotency key made the provider book once" in out

    # Every worker the demo started is gone, the killed ones and the new ones.
    for pid in re.findall(r"\(pid (\d+)\)", out):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
