"""The shape of a pass stays narrow: ``benchmarks/pass_trace.py``'s ceilings.

Issue 36 found a two-step pass crossing 51 of the package's modules; the
one-pass redesign (one ``Port``, one ``Pass``, the ops made when first asked
for) brought the part outside ``broker/`` from 28 to 23; folding the tiny
modules into their concepts', to 20, and the ops' one base (``workflows/ops.py``)
adds one back. A change that sends a plain
step's pass through another module again fails here, and says which. The
trace runs in a process of its own: its profile function stays on the
threads it saw start.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CEILINGS = {"two-step-pass": 21, "call-answer": 29, "fanout-of-two": 25}
"""Modules outside ``broker/`` each run's tasks cross (the storage table is
``broker/``'s own redesign, measured by the same script)."""


def test_a_pass_crosses_no_more_modules_than_it_did() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.pass_trace", "-v"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found = dict(re.findall(r"^(\S+): \d+ modules \((\d+) outside broker/\)", done.stdout, re.MULTILINE))
    assert set(found) == set(CEILINGS), done.stdout
    for case, ceiling in CEILINGS.items():
        assert int(found[case]) <= ceiling, f"{case} crosses {found[case]} modules outside broker/:\n{done.stdout}"
