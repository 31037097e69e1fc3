"""What counts as a JSON value, and how payloads are encoded for Redis.

The check is strict on purpose: a tuple would come back from the journal as a
list and a replay would see a different value than the first run did, so only
the types that survive a round trip unchanged are accepted.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Final, Literal


class _JsonNull:
    """The explicit JSON ``null`` result, as opposed to "no result"."""

    _instance: _JsonNull | None = None

    def __new__(cls) -> _JsonNull:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "JSON_NULL"

    def __reduce__(self) -> str:
        return "JSON_NULL"


JSON_NULL: Final = _JsonNull()

MAX_DEPTH: Final = 256
"""Deeper values are refused: they would blow the stack of every JSON parser."""


def json_problem(value: Any) -> str | None:
    """Return why ``value`` is not a JSON value, or None when it is one."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if item is None or item is JSON_NULL or isinstance(item, bool):
            continue
        if isinstance(item, int | float | str):
            problem = _scalar_problem(item)
            if problem is not None:
                return problem
            continue
        if isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"dict key {short_repr(key)} is not a string"
                if not is_utf8(key):
                    return "a dict key holds a lone surrogate"
                stack.append((child, depth + 1))
            continue
        return f"{type(item).__name__} is not a JSON type"
    return None


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr`` for an error message: at most ``limit`` characters, and safe for
    ints too long for ``str`` (whose ``repr`` raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<an integer of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception as exc:  # a user object whose __repr__ raises
        return f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _scalar_problem(item: int | float | str) -> str | None:
    if isinstance(item, int):
        return None if _int_encodable(item) else "an integer has too many digits to encode"
    if isinstance(item, float):
        return None if math.isfinite(item) else f"{item!r} is not a finite number"  # nan, inf or -inf
    return None if is_utf8(item) else "a string holds a lone surrogate"


def is_json_value(value: Any) -> bool:
    return json_problem(value) is None


def _int_encodable(number: int) -> bool:
    """False for ints too long for ``str()`` under Python's int-to-string digit limit."""
    limit = sys.get_int_max_str_digits()
    if not limit or number.bit_length() * 0.30103 < limit - 1:
        return True
    try:
        int.__repr__(number)
    except ValueError:
        return False
    return True


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _default(value: Any) -> Any:
    if value is JSON_NULL:
        return None
    raise TypeError(f"{type(value).__name__} is not a JSON type")


def dumps(value: Any, *, sort_keys: bool = False) -> str:
    """Compact, exact JSON; call only on values that passed ``json_problem``.
    ``sort_keys``: one text for equal values whatever their keys' order (an identity's hash)."""
    return json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_default, sort_keys=sort_keys
    )


def loads(text: str | bytes) -> Any:
    return json.loads(text)


NOT_JSON: Final = "{noun} must be a JSON value: {problem}"
TOO_LARGE: Final = "{noun} is {size} bytes, above max_payload_bytes ({limit})"


class PayloadError(ValueError):
    """A payload the journal refuses; ``reason`` is ``not_json`` or ``too_large``.

    Callers that report the two differently (a step fails with
    ``PayloadTooLarge``, a branch with ``TypeError``) read ``reason``.
    """

    def __init__(self, message: str, reason: Literal["not_json", "too_large"]) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[type[PayloadError], tuple[str, str]]:
        return type(self), (str(self), self.reason)


def encode_payload(
    value: Any,
    max_bytes: int,
    *,
    noun: str,
    text: bool = False,
    not_json: str = NOT_JSON,
    too_large: str = TOO_LARGE,
    **context: object,
) -> str:
    """``value`` as the journal stores it, or ``PayloadError`` saying why not.

    The one check every payload goes through (args, results, agent output,
    log lines, prompts): a JSON value, at most ``max_bytes`` UTF-8 bytes.
    ``text=True`` is for strings stored as they are (log lines, prompts):
    their own bytes count, not those of their JSON encoding. The messages
    are ``not_json`` and ``too_large`` formatted with ``noun``, ``problem``,
    ``size``, ``limit`` and ``context``, so each caller keeps its wording::

        encode_payload(result, limit, noun="Step result", key=key,
                       not_json="{noun} must be a JSON value: {key}", too_large=TOO_LARGE + ": {key}")
    """
    if text and not isinstance(value, str):
        raise TypeError(f"text=True takes a str, got {type(value).__name__}")
    problem = json_problem(value)
    if problem is not None:
        raise PayloadError(not_json.format(noun=noun, problem=problem, **context), "not_json")
    encoded = value if text else dumps(value)
    size = len(encoded.encode("utf-8"))
    if size > max_bytes:
        raise PayloadError(too_large.format(noun=noun, size=size, limit=max_bytes, **context), "too_large")
    return encoded
