"""Hostile input for the fuzz tests: Hypothesis strategies and a Redis snapshot.

The strategies make what a careless or malicious caller might pass: JSON that
is not quite JSON (NaN, non-str keys, lone surrogates, 10**5000), values nested
far too deep, strings far above ``max_payload_bytes``, run ids that are not
ours, options of every wrong type.
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import redis
from hypothesis import strategies as st

from celery_durable import DurableError
from celery_durable.workflows.limits import LIMIT_KEYS

PAYLOAD_BYTES = 4096
"""``max_payload_bytes`` of the fuzzed engines: small, so "huge" is cheap."""

ANY_CHAR = st.characters(exclude_categories=())  # surrogates and control characters included
text = st.text(ANY_CHAR, max_size=24)
names = text | st.text("abcXYZ019._-", min_size=1, max_size=12) | st.just("x" * 129)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
    | st.floats(allow_nan=True, allow_infinity=True)
    | text
)
json_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(text, kids, max_size=4), max_leaves=16
)


class _HugeInt(int):
    """An int too long for ``str()``; Hypothesis prints it, so it prints short."""

    def __repr__(self) -> str:
        return "10**5000"


HUGE_INT = _HugeInt(10**5000)


def _nest(depth: int, as_dict: bool) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


not_json_leaves = st.sampled_from(
    [
        object(),
        {1, 2},
        (1, 2),
        b"bytes",
        bytearray(b"ba"),
        float("nan"),
        float("-inf"),
        HUGE_INT,
        datetime.datetime(2024, 1, 1),
        decimal.Decimal("1.5"),
        uuid.UUID(int=7),
        "\ud800 lone surrogate",
        len,
        Ellipsis,
    ]
)
hostile_keys = st.integers() | st.none() | st.booleans() | st.tuples(st.integers()) | st.floats() | st.just("\udfff")
hostile_values = st.recursive(
    scalars | not_json_leaves,
    lambda kids: st.lists(kids, max_size=3)
    | st.dictionaries(text | hostile_keys, kids, max_size=3)
    | st.tuples(kids, kids),
    max_leaves=10,
)
deep = st.builds(_nest, st.integers(min_value=200, max_value=400), st.booleans())
huge = st.builds(
    lambda n, c: c * n, st.integers(PAYLOAD_BYTES - 64, PAYLOAD_BYTES * 3), st.sampled_from(["x", "é", "💥"])
)
payloads = json_values | hostile_values | deep | huge | st.builds(lambda s: {"blob": s}, huge)

limit_values = scalars | not_json_leaves | st.floats(min_value=1e-12, max_value=1e-8)
limits = (
    st.dictionaries(st.sampled_from(LIMIT_KEYS) | text, limit_values, max_size=4)
    | st.dictionaries(st.sampled_from(LIMIT_KEYS), limit_values, min_size=1, max_size=4)
    | hostile_values
)

junk = scalars | not_json_leaves | st.lists(scalars, max_size=3) | st.binary(max_size=8)
bad_numbers = (
    st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | text
    | st.none()
    | st.just(HUGE_INT)
)


def run_ids(*known: str) -> st.SearchStrategy[Any]:
    """Ids that name no run of the caller's namespace, made from ``known`` ones too."""
    variants = [
        f(run_id)
        for run_id in known
        for f in (str.upper, lambda r: " " + r, lambda r: r + "\n", lambda r: r[:-1], lambda r: r + "0")
    ]
    return (
        st.uuids().map(lambda u: u.hex)
        | st.sampled_from(variants or ["0" * 32])
        | text
        | st.sampled_from(["", "../../etc/passwd", "*", "{x}", "a" * 32, "0" * 33, "\x00" * 32])
        | junk
    )


# -- what a refused call must look like, and the state it must leave ----------------------


CLEAR_ERRORS = (ValueError, TypeError, DurableError)


def refusal(call: Callable[[], Any], seen: set[str], *, also: tuple[type[BaseException], ...] = ()) -> Any:
    """Run ``call``; return its result, or the clear error it raised (named, non-empty).

    Anything else — a ``KeyError``, a ``redis`` error, a crash — fails the test.
    """
    try:
        return call()
    except (*CLEAR_ERRORS, *also) as exc:
        # The encoder's own error (a lone surrogate on its way to Redis) names no option.
        assert not isinstance(exc, UnicodeError), f"{exc!r} instead of a refusal naming the value"
        message = str(exc)
        assert message.strip(), f"{type(exc).__name__} without a message"
        seen.add(f"{type(exc).__name__}: {template(message)}")
        return exc


def template(message: str) -> str:
    """A message with its quoted values and numbers blanked, to count distinct kinds."""
    out: list[str] = []
    quote = ""
    message = message.split(", got ", 1)[0].split(": ", 2 if message.startswith("Workflow") else 1)[0]
    for char in message[:160]:
        if quote:
            if char == quote:
                quote = ""
            continue
        if char in "'\"":
            quote = char
            out.append("…")
        elif char.isdigit():
            if not out or out[-1] != "#":
                out.append("#")
        else:
            out.append(char)
    return "".join(out)


HEARTBEAT_FIELDS = frozenset({"lease_until", "lock_until"})


def snapshot(client: redis.Redis, prefix: str, *, skip: Iterable[str] = ()) -> dict[str, Any]:
    """Every key under ``prefix`` with its content, less what heartbeats move.

    The sweep's schedule is compared by members only: its scores follow leases;
    so are a run's messages in flight (heartbeats renew them); the fleet's own
    bookkeeping (worker beats, when each queue was last empty) is left out.
    """
    skipped = set(skip)
    state: dict[str, Any] = {}
    for key in sorted(client.scan_iter(match=f"{prefix}:*", count=1000)):
        if key in skipped or ":{fleet}:" in key:
            continue
        kind = client.type(key)
        value: Any
        if kind == "hash" and key.endswith(":live"):
            value = sorted(client.hkeys(key))
        elif kind == "hash":
            value = {k: v for k, v in client.hgetall(key).items() if k not in HEARTBEAT_FIELDS}
        elif kind == "stream":
            value = client.xrange(key)
        elif kind == "zset":
            withscores = not key.endswith(":{sweep}:due")
            value = client.zrange(key, 0, -1, withscores=withscores)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "none":
            continue  # expired between the scan and the read
        elif key.endswith(":archive"):
            value = client.execute_command("GET", key, NEVER_DECODE=True)  # a run's archive is zlib
        else:
            value = client.get(key)
        state[key] = value
    return state


UNPICKLED: list[str] = []
"""What ``Unpickles`` objects recorded as they were unpickled in this process."""


def _unpickled(tag: str) -> str:
    UNPICKLED.append(tag)
    return tag


class Unpickles:
    """Pickled, it runs code as it is unpickled (it records ``tag``): what a
    pickle from the broker can do to a worker that loads it."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_unpickled, (self.tag,))
