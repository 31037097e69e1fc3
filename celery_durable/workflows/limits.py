"""Run limits (SPEC §6): the model that checks them, and how overrides merge.

A limits mapping is checked by the ``Limits`` model and then kept as it was
given, not as the model parsed it: ``60`` stays an int and ``1e20`` a float,
so the run hash and the code hash see exactly what the user wrote.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from celery_durable.errors import WorkflowDefinitionError
from celery_durable.workflows.jsonvalue import short_repr
from celery_durable.workflows.validation import Loc, PositiveNumber, at_most, described, explain

MAX_TIMEOUT_SECONDS = 2147483.647
NANO = Decimal("1e-9")


def nano_credits(value: float | int) -> int:
    """Credits as whole nano-credits, rounded half-to-even on the exact decimal."""
    # repr gives the shortest decimal of a float (5e-10 is 0.5 nano, not a hair above it);
    # to_integral_value, unlike quantize, never overflows the context precision on large values.
    exact = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    return int((exact / NANO).to_integral_value(rounding=ROUND_HALF_EVEN))


def _whole_nano_credit(value: float) -> float:
    if nano_credits(value) < 1:
        raise ValueError(f"rounds to zero nano-credits: {short_repr(value)}")
    return value


Count = Annotated[StrictInt, Field(gt=0), described("a positive integer")]
Credits = Annotated[PositiveNumber, described("a finite number above 0"), AfterValidator(_whole_nano_credit)]
Seconds = Annotated[PositiveNumber, described("a finite number above 0"), at_most(MAX_TIMEOUT_SECONDS)]


class Limits(BaseModel):
    """The ceilings of SPEC §6. ``None`` ("unlimited") is for run/resume
    overrides only: validate with ``context={"allow_none": True}`` for those."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    max_concurrent_subagents: Count | None = None
    max_total_subagents: Count | None = None
    max_ai_credits: Credits | None = None
    timeout_seconds: Seconds | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _none_only_in_overrides(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None and not (info.context or {}).get("allow_none"):
            raise ValueError("must be a number, not None")
        return value


LIMIT_KEYS = tuple(Limits.model_fields)


def validate_limits(limits: Any, *, allow_none: bool, where: str = "limits") -> dict[str, Any]:
    """Check a limits mapping and return a copy; ``allow_none`` is for overrides, which clear with None."""
    try:
        Limits.model_validate(limits, context={"allow_none": allow_none})
    except ValidationError as exc:
        raise WorkflowDefinitionError(explain(exc, lambda loc: limits_label(where, loc))) from None
    return dict(limits)


def limits_label(where: str, loc: Loc) -> str:
    """``where`` for the mapping, ``where.key`` for one limit."""
    return ".".join([where, *map(str, loc)])


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
