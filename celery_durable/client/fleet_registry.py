"""The fleet as workers report it (SPEC §3 ``list_workers``): each worker's
queues and the workflows it serves with their code hashes, published with
its beat (``broker/schema/profiles.py``); a mixed deploy named; a
workflow's meta for a client whose own engine does not register it.

Everything here but ``read_workers`` is pure, so a client of another kind
(asyncio) builds the same ``WorkerInfo`` from the same rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery_durable.broker.schema.profiles import ServedWorkflow, WorkerProfile, parse_profile

if TYPE_CHECKING:
    from celery_durable.broker.store import RunStore


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker process as it reported itself: ``workflows`` maps each
    workflow it serves to its code hash."""

    name: str
    alive: bool
    last_beat: datetime
    queues: list[str]
    workflows: dict[str, str]
    meta: dict[str, ServedWorkflow] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "alive": self.alive,
            "last_beat": self.last_beat.isoformat(),
            "queues": list(self.queues),
            "workflows": dict(self.workflows),
        }


@dataclass(frozen=True, slots=True)
class MixedDeploy:
    """A workflow served by live workers with different code hashes: the workers of each hash."""

    workflow: str
    hashes: dict[str, list[str]]

    def describe(self) -> str:
        parts = [f"{code_hash[:12]} on {', '.join(workers)}" for code_hash, workers in sorted(self.hashes.items())]
        return f"Mixed deploy of {self.workflow}: {len(self.hashes)} code versions ({'; '.join(parts)})"


def build_workers(rows: Sequence[tuple[str, int, str | None]], now_ms: int, lease_ms: int) -> list[WorkerInfo]:
    """``WorkerInfo`` of each row (name, last beat ms, profile as stored), alive ones first, then by name."""
    out = []
    for name, beat, raw in rows:
        profile: WorkerProfile = parse_profile(name, raw)
        out.append(
            WorkerInfo(
                name=name,
                alive=now_ms - beat <= lease_ms,
                last_beat=datetime.fromtimestamp(beat / 1000, tz=UTC),
                queues=list(profile.queues),
                workflows={wf: served.code_hash for wf, served in sorted(profile.workflows.items())},
                meta=dict(profile.workflows),
            )
        )
    out.sort(key=lambda worker: (not worker.alive, worker.name))
    return out


def mixed_deploys(workers: Sequence[WorkerInfo]) -> list[MixedDeploy]:
    """Each workflow live workers serve with more than one code hash."""
    hashes: dict[str, dict[str, list[str]]] = {}
    for worker in workers:
        if not worker.alive:
            continue
        for workflow, code_hash in worker.workflows.items():
            hashes.setdefault(workflow, {}).setdefault(code_hash, []).append(worker.name)
    return [MixedDeploy(wf, by_hash) for wf, by_hash in sorted(hashes.items()) if len(by_hash) > 1]


def served_meta(workers: Sequence[WorkerInfo], workflow: str, code_hash: str | None = None) -> ServedWorkflow | None:
    """The workflow's meta as workers report it: from a worker running ``code_hash``
    when one does, a live worker before a dead one."""
    found = [worker.meta[workflow] for worker in workers if workflow in worker.meta]
    for served in found:
        if code_hash is None or served.code_hash == code_hash:
            return served
    return found[0] if found else None


def serves(workers: Sequence[WorkerInfo], workflow: str) -> bool:
    """Whether a live worker serves ``workflow``."""
    return any(worker.alive and workflow in worker.workflows for worker in workers)


def unserved(workers: Sequence[WorkerInfo], workflow: str) -> bool:
    """Whether live workers report what they serve and none serves ``workflow``.
    With none reporting at all (a fleet starting, workers of a version that
    does not report) nothing is known, and nothing is said."""
    return any(worker.alive and worker.workflows for worker in workers) and not serves(workers, workflow)


def read_workers(store: RunStore) -> list[WorkerInfo]:
    """The registry read now (the wall clock, as workers beat by it)."""
    from celery_durable.broker import now_ms

    now = now_ms()
    return build_workers(store.worker_profiles(now), now, int(store.settings.lease_seconds * 1000))


UNSERVED_NOTE = (
    "No live worker serves workflow {workflow}: the run waits until a worker that registers it starts "
    "(celery-durable fleet lists what each worker serves)"
)


class ServedWatch:
    """Whether a live worker serves a workflow, for ``start_workflow``'s note:
    the registry read at most once a second per client; a "no" is read again
    before it is said, so a note is never made of a stale view."""

    SECONDS = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._workers: list[WorkerInfo] = []

    def unserved(self, store: RunStore, workflow: str) -> bool:
        """``unserved`` of the registry as read within a second, a yes read again first."""
        with self._lock:
            fresh = time.monotonic() - self._read_at < self.SECONDS
            workers = self._workers
        if fresh and not unserved(workers, workflow):
            return False
        workers = read_workers(store)
        with self._lock:
            self._workers, self._read_at = workers, time.monotonic()
        return unserved(workers, workflow)
