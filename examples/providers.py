"""Fake booking providers that honour idempotency keys, as real ones do.

They keep their reservations in Redis under their own keys (not the
journal's), count every raw call, and return the first reservation again
when the same idempotency key comes twice: so a step that runs twice books
once.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import redis

PREFIX = "demo-provider"


def _redis() -> redis.Redis:
    url = os.environ.get("CELERY_DURABLE_REDIS_URL", "redis://localhost:6379/0")
    return redis.Redis.from_url(url, decode_responses=True)


def book(service: str, idempotency_key: str, details: dict[str, Any]) -> dict[str, Any]:
    """Reserve ``service`` once per idempotency key; returns the reservation."""
    client = _redis()
    client.hincrby(f"{PREFIX}:{service}:calls", "raw", 1)
    reservation = {"service": service, "confirmation": f"{service[:3].upper()}-{uuid.uuid4().hex[:8]}", **details}
    client.hsetnx(f"{PREFIX}:{service}:reservations", idempotency_key, json.dumps(reservation))
    return dict(json.loads(client.hget(f"{PREFIX}:{service}:reservations", idempotency_key) or "{}"))


def receipts(service: str) -> tuple[int, int]:
    """(raw calls, distinct reservations) a provider has seen."""
    client = _redis()
    calls = int(client.hget(f"{PREFIX}:{service}:calls", "raw") or 0)
    return calls, int(client.hlen(f"{PREFIX}:{service}:reservations"))
