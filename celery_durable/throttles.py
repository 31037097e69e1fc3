"""Throttles (SPEC §5e): the pure parts of the client's throttle methods.

What a throttle's settings may be, how they are stored and read back, and
the ``ThrottleInfo`` a client returns: no Redis here, so the client and its
asyncio twin share every rule and every message; the store
(``broker/throttle_store.py``) does the I/O, the Lua scripts the logic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery_durable.names import WORKFLOW_NAME_MAX, WORKFLOW_NAME_PATTERN, name_rule
from celery_durable.workflows.jsonvalue import is_utf8, short_repr

if TYPE_CHECKING:
    from celery_durable.broker.throttle_store import ThrottleState

MAX_PRIORITY = 1_000_000_000
"""Priorities are ints within ±10^9 (the queue's rank stores them in ten digits)."""
MAX_THROTTLE_KEY = 256
MAX_PERIOD_SECONDS = 366 * 86_400.0
RUN_SLOT = "run"
"""The op name of a run's own slot (``start_workflow(..., throttle=)``)."""


@dataclass(frozen=True, slots=True)
class ThrottleSettings:
    """A throttle's four limits; ``rate`` pairs are ``(n, period_seconds)``."""

    concurrency: int | None = None
    rate: tuple[int, float] | None = None
    per_key_concurrency: int | None = None
    per_key_rate: tuple[int, float] | None = None

    def encode(self) -> list[str]:
        """throttle_set.lua's ARGV[2..7]: '' for each limit not set, periods in ms."""
        return [
            _text(self.concurrency),
            *_rate_text(self.rate),
            _text(self.per_key_concurrency),
            *_rate_text(self.per_key_rate),
        ]


@dataclass(frozen=True, slots=True)
class ThrottleHolder:
    """A slot held, or a place in the queue: the run, the op ("run" for the
    run's own slot), the attempt, the throttle key, since when."""

    run_id: str
    op: str
    attempt: int
    key: str | None
    since: datetime


@dataclass(frozen=True, slots=True)
class ThrottleInfo:
    """A throttle as ``get_throttle`` gives it: its settings, ``holding`` (slots
    held now), ``waiting`` (how many wait); ``holders``, ``waiters`` (in the
    order they will get slots) and ``top_keys`` (keys by slots held) for the
    views, filled by ``get_throttle`` (empty from ``list_throttles``)."""

    name: str
    namespace: str
    concurrency: int | None
    rate: tuple[int, float] | None
    per_key_concurrency: int | None
    per_key_rate: tuple[int, float] | None
    holding: int
    waiting: int
    created_at: datetime | None = None
    updated_at: datetime | None = None
    holders: list[ThrottleHolder] = field(default_factory=list)
    waiters: list[ThrottleHolder] = field(default_factory=list)
    top_keys: list[tuple[str, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def row(h: ThrottleHolder) -> dict[str, Any]:
            return {"run_id": h.run_id, "op": h.op, "attempt": h.attempt, "key": h.key, "since": h.since.isoformat()}

        return {
            "name": self.name,
            "namespace": self.namespace,
            "concurrency": self.concurrency,
            "rate": list(self.rate) if self.rate else None,
            "per_key_concurrency": self.per_key_concurrency,
            "per_key_rate": list(self.per_key_rate) if self.per_key_rate else None,
            "holding": self.holding,
            "waiting": self.waiting,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
            "holders": [row(h) for h in self.holders],
            "waiters": [row(h) for h in self.waiters],
            "top_keys": [{"key": k, "holding": n} for k, n in self.top_keys],
        }


def check_throttle_name(name: object) -> str:
    if not isinstance(name, str) or not WORKFLOW_NAME_PATTERN.match(name):
        raise ValueError(f"A throttle name must be {name_rule(WORKFLOW_NAME_MAX)}, got {short_repr(name)}")
    return name


def check_throttle_key(key: object) -> str:
    """A throttle key: a non-empty string of at most 256 characters, no NUL."""
    if not isinstance(key, str) or not key or len(key) > MAX_THROTTLE_KEY or "\0" in key:
        raise ValueError(
            f"throttle_key must be a non-empty string of at most {MAX_THROTTLE_KEY} characters, got {short_repr(key)}"
        )
    if not is_utf8(key):
        raise ValueError(f"throttle_key holds a lone surrogate: {short_repr(key)}")
    return key


def check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_PRIORITY:
        raise ValueError(
            f"priority must be an int between -{MAX_PRIORITY} and {MAX_PRIORITY}, got {short_repr(priority)}"
        )
    return priority


def validate_settings(
    *,
    concurrency: object = None,
    rate: object = None,
    per_key_concurrency: object = None,
    per_key_rate: object = None,
) -> ThrottleSettings:
    """``set_throttle``'s limits checked: at least one, each a positive int
    (a period a positive number), a per-key limit never above its
    throttle-wide counterpart (it could never bind); else ``ValueError``
    naming the option."""
    if concurrency is None and rate is None and per_key_concurrency is None and per_key_rate is None:
        raise ValueError("set_throttle needs at least one of concurrency, rate, per_key_concurrency, per_key_rate")
    settings = ThrottleSettings(
        concurrency=_positive_int("concurrency", concurrency),
        rate=_rate("rate", rate),
        per_key_concurrency=_positive_int("per_key_concurrency", per_key_concurrency),
        per_key_rate=_rate("per_key_rate", per_key_rate),
    )
    c, kc = settings.concurrency, settings.per_key_concurrency
    if c is not None and kc is not None and kc > c:
        raise ValueError(f"per_key_concurrency ({kc}) is above concurrency ({c}): it could never bind")
    r, kr = settings.rate, settings.per_key_rate
    if r is not None and kr is not None and kr != r and kr[0] >= r[0] * math.ceil(kr[1] / r[1]):
        # The throttle-wide rate lets at most n * ceil(kp / p) slots be taken in any
        # window of kp seconds: a per-key n at or above that is never reached.
        raise ValueError(f"per_key_rate {kr} is above rate {r}: it could never bind")
    return settings


def decode_settings(raw: Mapping[str, str]) -> ThrottleSettings:
    """The conf hash (throttle_set.lua) as settings."""

    def number(name: str) -> int | None:
        value = raw.get(name)
        return int(value) if value else None

    def rate(n: str, ms: str) -> tuple[int, float] | None:
        count, period = number(n), number(ms)
        return (count, period / 1000) if count is not None and period is not None else None

    return ThrottleSettings(
        concurrency=number("concurrency"),
        rate=rate("rate_n", "rate_ms"),
        per_key_concurrency=number("pk_concurrency"),
        per_key_rate=rate("pk_rate_n", "pk_rate_ms"),
    )


def decode_info(name: str, namespace: str, state: ThrottleState, top: int = 10) -> ThrottleInfo:
    """A ``ThrottleInfo`` from what the store read: the conf hash (its settings,
    field for field), the counts, and for ``get_throttle`` the holders and
    waiters hashes and the key counts."""
    held = [_holder(h, raw, waiter=False) for h, raw in state.holders.items()]
    queued = sorted(((raw.split("|")[2], _holder(h, raw, waiter=True)) for h, raw in state.waiters.items()))
    counts = sorted(((k, int(n)) for k, n in state.keys.items() if int(n) > 0), key=lambda kn: (-kn[1], kn[0]))
    return ThrottleInfo(
        name=name,
        namespace=namespace,
        **asdict(decode_settings(state.conf)),
        holding=state.holding,
        waiting=state.waiting,
        created_at=_when(state.conf.get("created_at")),
        updated_at=_when(state.conf.get("updated_at")),
        holders=sorted(held, key=lambda h: h.since),
        waiters=[h for _, h in queued],
        top_keys=counts[:top],
    )


def holder_id(run_id: str, op: str) -> str:
    return f"{run_id}|{op}"


def split_holder(holder: str) -> tuple[str, str]:
    run_id, _, op = holder.partition("|")
    return run_id, op


def _holder(holder: str, raw: str, *, waiter: bool) -> ThrottleHolder:
    parts = raw.split("|", 3 if waiter else 2)
    run_id, op = split_holder(holder)
    key = parts[-1]
    return ThrottleHolder(run_id, op, int(parts[0]), key or None, _when(parts[1]) or datetime.fromtimestamp(0, UTC))


def _when(ms: str | None) -> datetime | None:
    return datetime.fromtimestamp(int(ms) / 1000, UTC) if ms else None


def rate_of(text: str) -> tuple[int, float]:
    """``N/SECONDS`` as typed by an operator, as ``(n, period_seconds)``; a ValueError if it is not that shape
    (``validate_settings`` checks the numbers)."""
    n, sep, period = text.partition("/")
    if not sep:
        raise ValueError(f"not N/SECONDS: {text!r}")
    return int(n), float(period)


def _positive_int(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {short_repr(value)}")
    return value


def _rate(name: str, value: object) -> tuple[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise ValueError(f"{name} must be a pair (n, period_seconds), got {short_repr(value)}")
    n, period = value
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name}'s n must be a positive int, got {short_repr(n)}")
    if isinstance(period, bool) or not isinstance(period, int | float) or not math.isfinite(period) or period <= 0:
        raise ValueError(f"{name}'s period must be a positive number of seconds, got {short_repr(period)}")
    if period > MAX_PERIOD_SECONDS:
        # A period the store cannot keep is refused for what it is: too long, not "not positive".
        raise ValueError(
            f"{name}'s period must be at most {MAX_PERIOD_SECONDS:.0f} seconds (366 days), got {short_repr(period)}"
        )
    if round(period * 1000) < 1:
        raise ValueError(f"{name}'s period must be at least a millisecond, got {short_repr(period)}")
    return (n, float(period))


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def _rate_text(rate: tuple[int, float] | None) -> list[str]:
    return ["", ""] if rate is None else [str(rate[0]), str(round(rate[1] * 1000))]


@dataclass(frozen=True, slots=True)
class StartSlot:
    """``start_workflow``'s ``throttle=``, ``throttle_key=`` and ``priority=``, checked."""

    name: str
    key: str
    priority: int

    def fields(self, granted: bool) -> dict[str, str]:
        """The run hash's throttle fields (``schema.RUN_FIELDS``); ``granted``:
        its first attempt has its slot already."""
        slot = "1" if granted else ""
        return {"throttle": self.name, "throttle_key": self.key, "slot": slot, **priority_field(self.priority)}


def priority_field(priority: int) -> dict[str, str]:
    """The run hash's ``priority`` (absent: 0), which its throttled ops wait by,
    whether or not the run's start took a slot itself."""
    return {"priority": str(priority)} if priority else {}


def check_start(throttle: object, throttle_key: object, priority: object) -> StartSlot | None:
    """``start_workflow``'s throttle options checked (``ValueError`` naming them); None: not throttled."""
    checked = check_priority(priority)
    if throttle is None:
        if throttle_key is not None:
            raise ValueError("throttle_key is given without throttle")
        return None
    name = check_throttle_name(throttle)
    key = "" if throttle_key is None else check_throttle_key(throttle_key)
    return StartSlot(name, key, checked)
