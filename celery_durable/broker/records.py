"""The run record as stored in the ``run`` hash, parsed into one object."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from celery_durable.errors import StorageCorruptError

TERMINAL_STATUSES = frozenset({"completed", "halted", "paused", "cancelled", "error"})
STATUSES = ("pending", "running", *sorted(TERMINAL_STATUSES))


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    workflow: str
    namespace: str
    status: str
    epoch: int
    attempt: int
    reason: str | None
    error: str | None
    can_resume: bool
    args: Any
    limits: dict[str, Any]
    has_result: bool
    result: Any
    code_hash: str
    created_at: int
    started_at: int | None
    finished_at: int | None
    phase: str | None
    phase_id: str | None
    steps_done: int
    steps_running: int
    cancel_requested: bool
    pause_requested: bool
    lease_until: int
    lock_until: int
    idempotency_key: str | None
    agents_running: int = 0
    agents_done: int = 0
    subagents_used: int = 0
    credits_nano: int = 0
    limit_reached: str | None = None
    phase_times: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)

    @classmethod
    def parse(cls, run_id: str, raw: dict[str, str]) -> RunRecord:
        """Parse a hash; anything that does not fit is corruption, said as such."""
        try:
            phase_times: dict[str, tuple[int | None, int | None]] = {}
            for name, value in raw.items():
                if name.startswith("ps:") or name.startswith("pe:"):
                    phase_id = name[3:]
                    start, end = phase_times.get(phase_id, (None, None))
                    if name.startswith("ps:"):
                        start = int(value)
                    else:
                        end = int(value)
                    phase_times[phase_id] = (start, end)
            status = raw["status"]
            if status not in STATUSES:
                raise ValueError(f"unknown status {status!r}")
            has_result = raw.get("has_result") == "1"
            return cls(
                run_id=run_id,
                workflow=raw["workflow"],
                namespace=raw["namespace"],
                status=status,
                epoch=int(raw["epoch"]),
                attempt=int(raw.get("attempt") or raw["epoch"]),
                reason=raw.get("reason") or None,
                error=raw.get("error") or None,
                can_resume=raw.get("can_resume") == "1",
                args=json.loads(raw["args"]),
                limits=json.loads(raw.get("limits") or "{}"),
                has_result=has_result,
                result=json.loads(raw["result"]) if has_result else None,
                code_hash=raw.get("code_hash", ""),
                created_at=int(raw["created_at"]),
                started_at=_optional_int(raw.get("started_at")),
                finished_at=_optional_int(raw.get("finished_at")),
                phase=raw.get("phase") or None,
                phase_id=raw.get("phase_id") or None,
                steps_done=int(raw.get("steps_done") or 0),
                steps_running=max(0, int(raw.get("steps_running") or 0)),
                cancel_requested=raw.get("cancel") == "1",
                pause_requested=raw.get("pause") == "1",
                lease_until=int(raw.get("lease_until") or 0),
                lock_until=int(raw.get("lock_until") or 0),
                idempotency_key=raw.get("idempotency_key") or None,
                phase_times=phase_times,
                agents_running=max(0, int(raw.get("agents_running") or 0)),
                agents_done=int(raw.get("agents_done") or 0),
                subagents_used=int(raw.get("subagents_used") or 0),
                credits_nano=int(raw.get("credits_nano") or 0),
                limit_reached=raw.get("limit") or None,
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise StorageCorruptError(f"Run record {run_id} is corrupt: {exc!r}") from None


def _optional_int(value: str | None) -> int | None:
    return int(value) if value else None
