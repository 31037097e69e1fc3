"""Opt-in retries with backoff for one step (SPEC §4)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry a failing step's producer in place, waiting between tries.

    ``retry_on`` names exception types by class; anything else fails the step
    at once. The waits are cut short by cancellation.
    """

    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval: float = 60.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        for name in ("initial_interval", "max_interval"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"RetryPolicy.{name} must be a finite number >= 0, got {value!r}")
        if not math.isfinite(self.backoff_coefficient) or self.backoff_coefficient < 1:
            raise ValueError(f"RetryPolicy.backoff_coefficient must be >= 1, got {self.backoff_coefficient!r}")

    def delay_after(self, attempt: int, error: BaseException) -> float | None:
        """Seconds to wait before try ``attempt + 1``, or None to give up."""
        if attempt >= self.max_attempts or not isinstance(error, self.retry_on):
            return None
        return float(min(self.max_interval, self.initial_interval * self.backoff_coefficient ** (attempt - 1)))
