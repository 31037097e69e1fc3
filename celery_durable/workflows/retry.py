"""Opt-in retries with backoff for one step (SPEC §4)."""

from __future__ import annotations

import math
import types
import typing
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
            if not _number(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"RetryPolicy.{name} must be a finite number >= 0, got {value!r}")
        coefficient = self.backoff_coefficient
        if not _number(coefficient) or not math.isfinite(coefficient) or coefficient < 1:
            raise ValueError(f"RetryPolicy.backoff_coefficient must be a finite number >= 1, got {coefficient!r}")
        # Checked here, not by the isinstance of a failing step, which raised a TypeError in place of its StepFailed.
        retry_on: object = self.retry_on
        if _exception_class(retry_on):
            # One class, as isinstance takes it: that always worked.
            object.__setattr__(self, "retry_on", retry_on := (retry_on,))
        elif isinstance(retry_on, types.UnionType) or typing.get_origin(retry_on) is typing.Union:
            # KeyError | OSError, as isinstance takes it too: that always worked as well.
            object.__setattr__(self, "retry_on", retry_on := typing.get_args(retry_on))
        if not isinstance(retry_on, tuple) or not all(_exception_class(kind) for kind in retry_on):
            raise ValueError(f"RetryPolicy.retry_on must be a tuple of exception classes, got {retry_on!r}")

    def delay_after(self, attempt: int, error: BaseException) -> float | None:
        """Seconds to wait before try ``attempt + 1``, or None to give up."""
        if attempt >= self.max_attempts or not isinstance(error, self.retry_on):
            return None
        return float(min(self.max_interval, self.initial_interval * self.backoff_coefficient ** (attempt - 1)))


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _exception_class(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)
