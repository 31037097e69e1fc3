"""Listing a namespace's runs, newest first, in pages (``Client.list_workflow_runs``).

The namespace index (``{ns:N}:runs``) orders runs by start; a page reads ids
from it in batches and the records they name, and keeps those that match the
filters. The cursor is the start score of the last run given, so a run that
changes meanwhile is neither skipped nor given twice.
"""

from __future__ import annotations

from celery_durable import progress as paging
from celery_durable.broker import STATUSES, RunStore
from celery_durable.workflows.envelope import RunEnvelope, RunPage
from celery_durable.workflows.jsonvalue import short_repr


def list_runs(
    store: RunStore, namespace: str, status: str | None, workflow: str | None, limit: int, cursor: str | None
) -> RunPage:
    """One page of ``namespace``'s runs that have ``status`` and ``workflow`` (None: any)."""
    if status is not None and status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {short_repr(status)}")
    if workflow is not None and not isinstance(workflow, str):
        raise ValueError(f"workflow must be a name, got {type(workflow).__name__}")
    paging.check_page_limit(limit)
    before = _parse_cursor(cursor)
    runs: list[RunEnvelope] = []
    corrupt: list[dict[str, str]] = []
    last_score = 0.0
    while True:
        batch = store.list_run_ids(namespace, before, max(limit * 2, 64))
        if not batch:
            return RunPage(runs, None, corrupt)
        loaded, damaged = store.load_runs([run_id for run_id, _ in batch])
        records = {record.run_id: record for record in loaded}
        # Indexed runs whose keys expired (run retention) leave the index as they are met.
        store.forget_runs(
            namespace, [run_id for run_id, _ in batch if run_id not in records and run_id not in damaged]
        )
        for run_id, score in batch:
            before = score
            if run_id in damaged:
                if status is None and workflow is None:
                    corrupt.append(
                        {"run_id": run_id, "code": damaged[run_id].code or "", "error": damaged[run_id].message}
                    )
                continue
            record = records.get(run_id)
            if record is None or record.namespace != namespace:
                continue
            if (status is None or record.status == status) and (workflow is None or record.workflow == workflow):
                if len(runs) == limit:
                    # A cursor only when another matching run exists, so a
                    # filtered listing never ends on an empty page.
                    return RunPage(runs, f"s{last_score:.0f}", corrupt)
                runs.append(RunEnvelope.from_record(record))
                last_score = score


def _parse_cursor(cursor: str | None) -> float | None:
    if cursor is None:
        return None
    if not isinstance(cursor, str) or not cursor.startswith("s") or not cursor[1:].isdigit():
        raise ValueError(f"cursor is not one list_workflow_runs returned: {short_repr(cursor)}")
    return float(cursor[1:])
