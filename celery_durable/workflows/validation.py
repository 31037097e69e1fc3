"""Pydantic at the edge: meta, limits and options are models; their errors become ours.

Pydantic checks the shape (which keys, which types, which bounds); the rules
pydantic has no words for are small validators. Callers never see a
``ValidationError``: :func:`explain` turns its first error into the one
sentence SPEC asks for, naming the field ("Unknown key in limits: retries",
"limit must be an integer from 1 to 500, got 0"), and the caller raises that
as its own exception type (``WorkflowDefinitionError``, ``ValueError``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from celery_durable.workflows.jsonvalue import short_repr

Loc = tuple[int | str, ...]
"""Where an error is: field names and list indexes, outermost first."""

PositiveNumber = Annotated[StrictInt, Field(gt=0)] | Annotated[StrictFloat, Field(gt=0, allow_inf_nan=False)]
"""A finite number above 0. Ints stay ints, even past the float range (a
credit ceiling of 10**400 is valid), and ``True`` is not a number."""

_UNKNOWN_KEY = ("extra_forbidden", "invalid_key")
_EXPECTED = {"string_type": "a string", "list_type": "a list", "dict_type": "a dict", "model_type": "a dict"}


def described(rule: str) -> WrapValidator:
    """Any failure of the annotated type reads "<field> must be <rule>, got <value>".

    One phrase per field, instead of pydantic's one per constraint: "must be
    an integer from 1 to 500" says at once what a type error, a too-small and
    a too-large value each got wrong.
    """

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(
                "rule", "must be {rule}, got {value}", {"rule": rule, "value": short_repr(value)}
            ) from None

    return WrapValidator(validate)


def at_most(limit: float) -> AfterValidator:
    """An upper bound with its own message, checked after ``described`` rules."""

    def check(value: float) -> float:
        if value > limit:
            raise ValueError(f"must be at most {limit}, got {short_repr(value)}")
        return value

    return AfterValidator(check)


def explain(error: ValidationError, label: Callable[[Loc], str]) -> str:
    """The first error as one sentence; ``label`` names the field at a location.

    An unknown key is reported before anything else, as SPEC asks that it
    be named (a misspelt key makes every other message beside the point).
    """
    errors = error.errors(include_url=False)
    first = next((item for item in errors if item["type"] in _UNKNOWN_KEY), errors[0])
    loc: Loc = tuple(first["loc"])
    kind = first["type"]
    if kind in _UNKNOWN_KEY:
        key = loc[-1]
        named = key[:80] if isinstance(key, str) else short_repr(key)
        container = label(loc[:-1])
        return f"Unknown key in {container[:1].lower()}{container[1:]}: {named}"
    if kind == "missing":
        return f"{label(loc[:-1])} is missing required key: {loc[-1]}"
    if kind in _EXPECTED:
        return f"{label(loc)} must be {_EXPECTED[kind]}, got {type(first['input']).__name__}"
    cause = first.get("ctx", {}).get("error")
    # Our own validators' words, else pydantic's (its "Input should be ...").
    text = str(cause) if isinstance(cause, Exception) else first["msg"].replace("Input should be", "must be")
    return f"{label(loc)} {text}"
