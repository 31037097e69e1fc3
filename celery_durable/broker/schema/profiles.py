"""What a worker serves, as it publishes it with its beat
(``P:{fleet}:profiles``, by worker name): a JSON object
``{"queues": [...], "workflows": {name: {"code_hash", "description",
"phases": [{"phase_id", "title", "detail"}], "version"}}}``.

Written whole by each beat, read by ``Client.list_workers`` and by a client,
CLI or web view whose own engine does not register a run's workflow (its
meta, from the workers that run it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from celery_durable.errors import StorageCorruptError


@dataclass(frozen=True, slots=True)
class ServedPhase:
    phase_id: str
    title: str
    detail: str | None


@dataclass(frozen=True, slots=True)
class ServedWorkflow:
    """A workflow as a worker reports it: enough to show a run of it."""

    name: str
    code_hash: str
    description: str
    phases: tuple[ServedPhase, ...]
    version: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerProfile:
    queues: tuple[str, ...]
    workflows: dict[str, ServedWorkflow]


def encode_profile(queues: list[str], workflows: list[ServedWorkflow]) -> str:
    body: dict[str, Any] = {
        "queues": sorted(queues),
        "workflows": {
            served.name: {
                "code_hash": served.code_hash,
                "description": served.description,
                "phases": [{"phase_id": p.phase_id, "title": p.title, "detail": p.detail} for p in served.phases],
                "version": served.version,
            }
            for served in workflows
        },
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def parse_profile(worker: str, raw: str | None) -> WorkerProfile:
    """A worker's profile; an empty one for a worker that reported none (an older version)."""
    if not raw:
        return WorkerProfile((), {})
    try:
        body = json.loads(raw)
        workflows = {
            str(name): ServedWorkflow(
                str(name),
                str(entry["code_hash"]),
                str(entry.get("description") or ""),
                tuple(ServedPhase(str(p["phase_id"]), str(p["title"]), p.get("detail")) for p in entry["phases"]),
                entry.get("version"),
            )
            for name, entry in body["workflows"].items()
        }
        return WorkerProfile(tuple(str(queue) for queue in body["queues"]), workflows)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise StorageCorruptError(f"The profile of worker {worker!r:.80} is not one celery-durable wrote") from None
