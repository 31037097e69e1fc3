"""``celery-durable demo`` as a newcomer runs it: a subprocess on a fresh
machine's terms, so on the private Redis it starts itself; real worker
processes killed with SIGKILL mid-booking, and the same run finishing by
itself with one reservation per service; then a trip whose car is sold out,
whose saga cancels its flight and hotel at their providers."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support.readme import DEMO, run_fresh

pytestmark = pytest.mark.slow  # 11 s on a quiet machine, up to 30 s on a busy one

def test_the_demo_kills_every_worker_and_the_run_still_books_each_service_once(tmp_path: Path) -> None:
    # As on a fresh machine: nothing configured, nothing on localhost:6379.
    done = run_fresh(tmp_path, *DEMO)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr

    assert "private redis-server" in out and str(tmp_path / ".celery-durable" / "redis") in out
    killed = re.findall(r"SIGKILL → process group (\d+) \((\S+)\): exited with signal SIGKILL", out)
    assert len(killed) == 2, out
    assert "book-car running" in out  # what Redis said after the kill: a run nobody works on
    assert re.search(r"Run recovered after its attempt died \(.+\) \(attempt 2\)", out), out
    assert re.search(r"■ completed\s+run \w+ · attempt 2", out), out

    found = re.findall(r"│ (flight|hotel|car)\s+│ (\d+)\s+│ (\d+)\s+│ (\d+)\s+│", out)
    rows = [(m[0], int(m[1]), int(m[2]), int(m[3])) for m in found]
    assert len(rows) == 6, out
    # The crashed trip: (service, raw calls, reservations, cancellations).
    assert rows[:3] == [("flight", 1, 1, 0), ("hotel", 1, 1, 0), ("car", 2, 1, 0)], out
    assert "the idempotency key made the provider book once" in out

    # The second trip, the car sold out: its saga cancelled what was booked.
    assert rows[3:] == [("flight", 1, 1, 1), ("hotel", 1, 1, 1), ("car", 1, 0, 0)], out
    assert "Compensating after TripNotBooked: running cancel-hotel, cancel-flight" in out
    assert re.search(r"■ completed\s+run \w+ · not_booked", out), out
    assert "the saga cancelled the flight and the hotel at their providers" in out

    # Every worker the demo started is gone, the killed ones and the new ones.
    for pid in re.findall(r"\(pid (\d+)\)", out):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
