"""Everything that talks to Redis: run records, the journal, progress, fencing."""

from celery_durable.broker.keys import KeySpace, NamespaceKeys, RunKeys
from celery_durable.broker.progress import ProgressRecord, ProgressSlice
from celery_durable.broker.records import STATUSES, TERMINAL_STATUSES, RunRecord
from celery_durable.broker.store import Flags, PendingCommit, RunStore, SequenceHistory, now_ms, storage_errors

__all__ = [
    "STATUSES",
    "TERMINAL_STATUSES",
    "Flags",
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
