"""The benchmarks keep working: a tiny run of every case (numbers not judged).

Benchmarks are not unit tests; this only proves that ``python -m benchmarks``
still starts its Redis and workers, runs every case and writes both
result files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "sequential", "fanout", "pipeline", "latency", "replay", "recovery", "footprint", "web",
    "timers", "many", "soak", "sweep", "calls", "replay_check", "children", "listing",
    "history", "bursts", "capacity", "throttles", "schedules", "async_client",
}


@pytest.mark.timeout(240)
def test_quick_benchmark_runs_every_case_and_writes_both_files(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--repeat", "1", "--output", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert {case["key"] for case in data["cases"]} == CASES
    assert all(case["error"] is None and case["rows"] for case in data["cases"])
    markdown = (tmp_path / "RESULTS.md").read_text()
    for heading in ("1. Sequential", "2. Fan-out", "3. Pipeline", "4. Latency", "5. Replay", "6. Recovery",
                    "7. Footprint", "8. Web view", "9. Timers", "10. Many runs", "11. Sweep at scale", "12. Soak",
                    "13. Calls", "14. Replay check", "15. Children", "16. Listing", "21. Schedules",
                    "22. Async client"):
        assert heading in markdown
    assert data["environment"]["versions"]["redis-server"]
