"""Deploying new code under running runs: the replay check and histories (SPEC §8a).

``check_replay`` replays the selected runs of a namespace against the code
registered now, with nothing executed and nothing written
(``workflows/dry_replay.py``), so a deploy pipeline can refuse code that
would break a run in flight before a worker runs it. ``export_history``
turns a run into a JSON document that a test suite keeps, and
``celery_durable.testing.replay_history`` replays such a document against a
workflow in-process (``docs/versioning.md``).

A history document::

    {"format": "celery-durable-history", "version": 1,
     "run": <the run's envelope, RunEnvelope.to_dict()>,
     "epoch": <the attempt's fencing token>, "code_hash": <started with>,
     "last_code_hash": <the code its latest pass ran>,
     "journal": [[field, value], ...]}

``journal`` is the run's journal hash, field by field as stored
(``broker/schema``): the faithful form, replayed by the same scripts that
read the run. ``epoch`` says which journaled failures belong to the run's
latest attempt (a later attempt runs them again); the three fields after
``run`` are optional in a document read back (SPEC §8a names the others).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from celery_durable.broker import STATUSES, RunRecord
from celery_durable.broker.journal_export import read_journal
from celery_durable.broker.keys import RUN_ID_PATTERN
from celery_durable.errors import RunNotFoundError
from celery_durable.workflows.dry_replay import check_run
from celery_durable.workflows.envelope import RunEnvelope
from celery_durable.workflows.jsonvalue import short_repr
from celery_durable.workflows.versions import last_code_hash

if TYPE_CHECKING:
    from celery_durable.broker import RunStore
    from celery_durable.client.client import Client
    from celery_durable.config import Settings
    from celery_durable.workflows.definition import Workflow

HISTORY_FORMAT = "celery-durable-history"
HISTORY_VERSION = 1
CONTINUABLE = ("pending", "running", "paused", "halted", "error")
"""Statuses of the runs that can still continue (an ``error`` only with ``can_resume``)."""
MAX_LIMIT = 1_000_000
PAGE = 500


@dataclass(frozen=True, slots=True)
class ReplayCheck:
    """How one run replays against the code registered now.

    ``verdict``: ``"ok"``; ``"diverges"`` (``message`` is the error the run
    would end with); ``"failed"`` (the exception's type and message);
    ``"unknown_workflow"`` (no such workflow is registered)."""

    run_id: str
    workflow: str
    status: str
    verdict: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def check_replay(
    client: Client,
    run_ids: Iterable[str] | None,
    *,
    workflow: str | None,
    statuses: Iterable[str] | None,
    limit: int,
) -> list[ReplayCheck]:
    """``Client.check_replay``: the selected runs, each replayed read-only."""
    wanted = _names(run_ids, "run_ids")
    narrowed = _statuses(statuses)
    if workflow is not None and not isinstance(workflow, str):
        raise ValueError(f"workflow must be a name, got {type(workflow).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_LIMIT:,}, got {short_repr(limit)}")
    store = client.engine.store
    if wanted is not None:
        records = _named_runs(store, client.namespace, wanted)
        if workflow is not None:
            records = [record for record in records if record.workflow == workflow]
    else:
        records = _continuable_runs(store, client.namespace, narrowed, workflow, limit)
    settings = client.engine.settings
    return [check_record(store, record, client.engine.workflows.get(record.workflow), settings) for record in records]


def check_record(store: RunStore, record: RunRecord, workflow: Workflow | None, settings: Settings) -> ReplayCheck:
    """One run's check on the store that holds its journal."""
    if workflow is None:
        message = f"Workflow {record.workflow!r} is not registered with this engine"
        return ReplayCheck(record.run_id, record.workflow, record.status, "unknown_workflow", message)
    journal = store.replay_journal(record)  # an archived run's from its archive
    verdict, message = check_run(
        journal,
        record,
        workflow,
        max_fanout=settings.max_fanout,
        max_payload_bytes=settings.max_payload_bytes,
    )
    return ReplayCheck(record.run_id, record.workflow, record.status, verdict, message)


def can_continue(record: RunRecord) -> bool:
    return record.status in CONTINUABLE and (record.status != "error" or record.can_resume)


def _names(values: Iterable[str] | None, what: str) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ValueError(f"{what} must be a collection of strings, not {type(values).__name__}")
    names = list(values)
    if not all(isinstance(name, str) for name in names):
        raise ValueError(f"{what} must hold strings")
    return names


def _statuses(statuses: Iterable[str] | None) -> frozenset[str]:
    names = _names(statuses, "statuses")
    if names is None:
        return frozenset(CONTINUABLE)
    other = sorted(set(names) - set(CONTINUABLE))
    if other:
        raise ValueError(
            f"statuses narrows the runs that can still continue ({', '.join(CONTINUABLE)}), got "
            f"{', '.join(map(short_repr, other))}; check a settled run by naming it in run_ids"
        )
    return frozenset(names)


def _named_runs(store: RunStore, namespace: str, run_ids: list[str]) -> list[RunRecord]:
    for run_id in run_ids:
        if not RUN_ID_PATTERN.match(run_id):
            raise RunNotFoundError(f"Run not found: {run_id:.200}")
    loaded, damaged = store.load_runs(run_ids)
    records = {record.run_id: record for record in loaded}
    found: list[RunRecord] = []
    for run_id in run_ids:
        if run_id in damaged:
            raise damaged[run_id]
        record = records.get(run_id)
        if record is None or record.namespace != namespace:
            raise RunNotFoundError(f"Run not found: {run_id}")
        found.append(record)
    return found


def _continuable_runs(
    store: RunStore, namespace: str, statuses: frozenset[str], workflow: str | None, limit: int
) -> list[RunRecord]:
    """The namespace's runs that can still continue, with one of ``statuses``
    (and of ``workflow``, when named: the limit counts only those), newest
    first, at most ``limit``: the index read a page at a time, and each page's
    records in one round trip."""
    selected: list[RunRecord] = []
    before: float | None = None
    while len(selected) < limit:
        batch = store.list_run_ids(namespace, before, PAGE)
        if not batch:
            break
        before = batch[-1][1]
        loaded, _damaged = store.load_runs([run_id for run_id, _ in batch])
        for record in loaded:
            if (
                record.namespace == namespace
                and record.status in statuses
                and can_continue(record)
                and workflow in (None, record.workflow)
            ):
                selected.append(record)
    return selected[:limit]


# -- histories -----------------------------------------------------------------------


def export_history(client: Client, run_id: str) -> dict[str, Any]:
    """``Client.export_history``: the run and its journal as a history document."""
    record = client._record(run_id)
    journal = read_journal(client.engine.store, record.run_id)
    return {
        "format": HISTORY_FORMAT,
        "version": HISTORY_VERSION,
        "run": RunEnvelope.from_record(record).to_dict(),
        "epoch": record.epoch,
        "code_hash": record.code_hash,
        "last_code_hash": last_code_hash(record),
        "journal": [[field, value] for field, value in sorted(journal.items())],
    }


def read_history(history: Any) -> tuple[RunRecord, dict[str, str]]:
    """A history document as the run record a replay needs and its journal's
    fields; a document this version did not write is a ``ValueError`` naming
    what is wrong."""
    if not isinstance(history, Mapping):
        raise ValueError(f"A history is a JSON object, got {type(history).__name__}")
    if history.get("format") != HISTORY_FORMAT:
        raise ValueError(f"Not a celery-durable history: format is {short_repr(history.get('format'))}")
    if history.get("version") != HISTORY_VERSION:
        raise ValueError(
            f"History version {short_repr(history.get('version'))} is not one this celery-durable reads "
            f"({HISTORY_VERSION})"
        )
    run = history.get("run")
    if not isinstance(run, Mapping):
        raise ValueError("A history's run is its envelope, a JSON object")
    try:
        record = _record(history, run)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"A history's run is not an envelope celery-durable wrote: {exc!r}") from None
    journal = history.get("journal")
    if not isinstance(journal, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(part, str) for part in pair) for pair in journal
    ):
        raise ValueError("A history's journal is a list of [field, value] pairs of strings")
    return record, dict(journal)


def _record(history: Mapping[str, Any], run: Mapping[str, Any]) -> RunRecord:
    status = run["status"]
    if status not in STATUSES:
        raise ValueError(f"status {status!r}")
    # SPEC §8a's document is format, version, run and journal: without the
    # epoch (export_history writes it), the envelope's attempt, which is the
    # epoch but after a Redis restart.
    epoch = history.get("epoch", run["attempt"])
    for name, value in (("epoch", epoch), ("attempt", run["attempt"])):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} {value!r}")
    texts = {name: run[name] for name in ("run_id", "workflow", "namespace")}
    texts.update(code_hash=history.get("code_hash", ""), last_code_hash=history.get("last_code_hash", ""))
    for name, value in texts.items():
        if not isinstance(value, str):
            raise TypeError(f"{name} {value!r}")
    if not isinstance(run.get("limits", {}), Mapping):
        raise TypeError("limits")
    return RunRecord(
        run_id=texts["run_id"],
        workflow=texts["workflow"],
        namespace=texts["namespace"],
        status=status,
        epoch=epoch,
        attempt=run["attempt"],
        reason=run.get("reason"),
        error=run.get("error"),
        can_resume=bool(run.get("can_resume")),
        args=run.get("args", {}),
        limits=dict(run.get("limits", {})),
        has_result=bool(run.get("has_result")),
        result=run.get("result"),
        code_hash=texts["code_hash"],
        attempt_code_hash=texts["last_code_hash"] or texts["code_hash"],
        created_at=0,
        started_at=None,
        finished_at=None,
        phase=None,
        phase_id=None,
        steps_done=0,
        steps_running=0,
        cancel_requested=False,
        pause_requested=False,
        lease_until=0,
        lock_until=0,
        idempotency_key=None,
    )
