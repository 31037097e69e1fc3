"""What a case reports: rows of figures, each a median of samples, with targets.

A figure is always kept with all its samples (results.json has them), and
the report shows the median: on a shared 2-core machine one run means little,
and the ratio to plain Celery measured in the same session means more than
any absolute time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples)) if samples else math.nan


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile: with few samples it is the worst one, never an interpolation."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return float(ordered[rank - 1])


@dataclass(frozen=True, slots=True)
class Target:
    """``value <op> limit``: what the issue asks of a figure."""

    text: str
    limit: float
    at_most: bool = True

    def passed(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return value <= self.limit if self.at_most else value >= self.limit


@dataclass
class Row:
    """One line of the results table.

    ``value`` is the durable figure (median of ``samples``), ``baseline`` the
    plain-Celery one measured alongside, ``ratio`` value/baseline. The target
    judges ``checked`` when given (e.g. a growth factor), else the ratio when
    ``judge_ratio``, else the value.
    """

    case: str
    figure: str
    unit: str
    samples: list[float]
    baseline_samples: list[float] | None = None
    target: Target | None = None
    checked: float | None = None
    judge_ratio: bool = False
    note: str = ""

    @property
    def value(self) -> float:
        return median(self.samples)

    @property
    def baseline(self) -> float | None:
        return median(self.baseline_samples) if self.baseline_samples else None

    @property
    def ratio(self) -> float | None:
        base = self.baseline
        if base is None or base == 0:
            return None
        return self.value / base

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        return "PASS" if self.target.passed(self.judged) else "MISS"

    @property
    def judged(self) -> float:
        if self.checked is not None:
            return self.checked
        if self.judge_ratio:
            return self.ratio if self.ratio is not None else math.nan
        return self.value

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            value=self.value, baseline=self.baseline, ratio=self.ratio, verdict=self.verdict,
            judged=self.judged if self.target is not None else None,
        )
        return data


@dataclass
class CaseResult:
    """Everything one case measured: table rows, details and free-text notes."""

    key: str
    title: str
    setup: str
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    load: list[float] = field(default_factory=list)
    """The 1-minute load average when the case began and when it ended: how busy the shared machine was."""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "setup": self.setup,
            "rows": [row.to_json() for row in self.rows],
            "details": self.details,
            "notes": self.notes,
            "error": self.error,
            "seconds": self.seconds,
            "load": self.load,
        }
