"""Validation and merging of run limits (SPEC §6)."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from celery_durable.errors import WorkflowDefinitionError
from celery_durable.workflows.jsonvalue import short_repr

LIMIT_KEYS = ("max_concurrent_subagents", "max_total_subagents", "max_ai_credits", "timeout_seconds")
MAX_TIMEOUT_SECONDS = 2147483.647
NANO = Decimal("1e-9")


def nano_credits(value: float | int) -> int:
    """Credits as whole nano-credits, rounded half-to-even on the exact decimal."""
    # repr gives the shortest decimal of a float (5e-10 is 0.5 nano, not a hair above it);
    # to_integral_value, unlike quantize, never overflows the context precision on large values.
    exact = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    return int((exact / NANO).to_integral_value(rounding=ROUND_HALF_EVEN))


def validate_limits(limits: Any, *, allow_none: bool, where: str = "limits") -> dict[str, Any]:
    """Check a limits mapping; ``allow_none`` is for run/resume overrides, which clear with None."""
    if not isinstance(limits, dict):
        raise WorkflowDefinitionError(f"{where} must be a dict, got {type(limits).__name__}")
    for key in limits:
        if key not in LIMIT_KEYS:
            named = key[:80] if isinstance(key, str) else short_repr(key)
            raise WorkflowDefinitionError(f"Unknown key in {where}: {named}")
    for key, value in limits.items():
        if value is None:
            if not allow_none:
                raise WorkflowDefinitionError(f"{where}.{key} must be a number, not None")
            continue
        _check_limit(key, value, where)
    return dict(limits)


def _check_limit(key: str, value: Any, where: str) -> None:
    name = f"{where}.{key}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WorkflowDefinitionError(f"{name} must be a number, got {type(value).__name__}")
    if key in ("max_concurrent_subagents", "max_total_subagents"):
        if not isinstance(value, int) or value <= 0:
            raise WorkflowDefinitionError(f"{name} must be a positive integer, got {short_repr(value)}")
        return
    if (isinstance(value, float) and not math.isfinite(value)) or value <= 0:
        raise WorkflowDefinitionError(f"{name} must be a finite number above 0, got {short_repr(value)}")
    if key == "max_ai_credits" and nano_credits(value) < 1:
        raise WorkflowDefinitionError(f"{name} rounds to zero nano-credits: {short_repr(value)}")
    if key == "timeout_seconds" and value > MAX_TIMEOUT_SECONDS:
        raise WorkflowDefinitionError(f"{name} must be at most {MAX_TIMEOUT_SECONDS}, got {short_repr(value)}")


def merge_limits(base: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    """Apply an override: an omitted key keeps, a number replaces, None clears."""
    merged = dict(base)
    for key, value in (override or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def effective_limits(limits: dict[str, Any]) -> dict[str, Any]:
    """The ceilings in force: an omitted concurrency ceiling falls back to the total one."""
    result = dict(limits)
    if "max_concurrent_subagents" not in result and "max_total_subagents" in result:
        result["max_concurrent_subagents"] = result["max_total_subagents"]
    return result


def ceiling_fields(limits: dict[str, Any]) -> dict[str, str]:
    """The ceilings as the run hash keeps them for the Lua checks ('' = none)."""
    ceilings = effective_limits(limits)
    credits = ceilings.get("max_ai_credits")
    timeout = ceilings.get("timeout_seconds")
    return {
        "lim_total": str(ceilings.get("max_total_subagents", "")),
        "lim_concurrent": str(ceilings.get("max_concurrent_subagents", "")),
        "lim_credits_nano": str(nano_credits(credits)) if credits is not None else "",
        "lim_timeout_ms": str(int(timeout * 1000)) if timeout is not None else "",
    }


def ceilings_argument(limits: dict[str, Any]) -> str:
    """``ceiling_fields`` as the "field=value,..." argument of resume.lua."""
    return ",".join(f"{name}={value}" for name, value in ceiling_fields(limits).items())
