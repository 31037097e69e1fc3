"""Everything that talks to storage: run records, the journal, progress, fencing."""

from celery_durable.broker.connection import now_ms, storage_errors
from celery_durable.broker.journal import Flags, Journal, PendingCommit
from celery_durable.broker.keys import KeySpace, NamespaceKeys, RunKeys
from celery_durable.broker.progress import ProgressRecord, ProgressSlice
from celery_durable.broker.schema import SequenceHistory
from celery_durable.broker.schema.run import STATUSES, TERMINAL_STATUSES, RunRecord
from celery_durable.broker.store import RunStore

__all__ = [
    "STATUSES",
    "TERMINAL_STATUSES",
    "Flags",
    "Journal",
    "KeySpace",
    "NamespaceKeys",
    "PendingCommit",
    "ProgressRecord",
    "ProgressSlice",
    "RunKeys",
    "RunRecord",
    "RunStore",
    "SequenceHistory",
    "now_ms",
    "storage_errors",
]
