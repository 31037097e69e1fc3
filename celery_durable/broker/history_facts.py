"""What a run's history is derived from, read from Redis: the run hash, the
journal's op identities and wait times, step, agent and child rows, signal
times and the progress stream's system records, in one snapshot
(``read_history.lua``); and, for the one page shown, the values it previews.

The history is no log of its own (``celery_durable.history`` derives it), so
it is kept exactly as long as these keys: the run's retention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from celery_durable.broker.connection import storage_errors
from celery_durable.broker.replies import history as parse
from celery_durable.broker.store_core import StoreCore


@dataclass(frozen=True, slots=True)
class SystemRecord:
    """A ``system`` progress record: the runtime's own lifecycle events."""

    seq: int
    attempt: int
    at: int
    message: str


@dataclass(frozen=True, slots=True)
class HistoryFacts:
    """Every hash field the history reads, as ``read_history.lua`` sends it
    (formats: ``broker/schema``)."""

    run: dict[str, str]
    journal: dict[str, str]
    """Only ``o:`` fields but steps' (their rows say it all), ``x:`` names
    (their values are not sent), ``wd:``, ``wt:`` and ``wf:`` fields."""
    steps: dict[str, str]
    running: dict[str, str]
    agents: dict[str, str]
    signals: dict[str, str]
    """Only ``t:`` and ``k:`` fields: payloads are read for the page."""
    children: dict[str, str]
    system: list[SystemRecord]


VALUE_HASHES = ("journal", "signals")
"""Where a previewed value lives: a journal field (``v:``, ``a:``, ``i:``) or a signal's payload (``p:``)."""


def read_history_facts(store: StoreCore, run_id: str) -> HistoryFacts | None:
    """The run's facts in one atomic read; None for a run that does not exist."""
    k = store.run_keys(run_id)
    keys = [k.run, k.journal, k.steps, k.running, k.agents, k.signals, k.children, k.progress]
    reply = store._run("read_history", keys, [])
    flat = parse.read_history(reply, run_id)
    if flat is None:
        return None
    run, journal, steps, running, agents, signals, children, system = flat
    records = [
        SystemRecord(int(system[i]), int(system[i + 1] or 1), int(system[i + 2] or 0), system[i + 3])
        for i in range(0, len(system), 4)
    ]
    return HistoryFacts(run, journal, steps, running, agents, signals, children, records)


def read_values(store: StoreCore, run_id: str, refs: Sequence[tuple[str, str]]) -> list[str | None]:
    """The raw values at ``refs``, each (hash, field) with hash one of ``VALUE_HASHES``."""
    if not refs:
        return []
    k = store.run_keys(run_id)
    with storage_errors():
        pipe = store.client.pipeline(transaction=False)
        for hash_name, field in refs:
            pipe.hget(getattr(k, hash_name), field)
        return cast(list[str | None], pipe.execute())


def read_child_times(store: StoreCore, run_ids: Sequence[str]) -> list[tuple[str | None, str | None, str | None]]:
    """(created_at, finished_at, status) of each child run (other slots: one pipeline, no transaction)."""
    if not run_ids:
        return []
    with storage_errors():
        pipe = store.client.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hmget(store.run_keys(run_id).run, ["created_at", "finished_at", "status"])
        return [cast(tuple[str | None, str | None, str | None], tuple(row)) for row in pipe.execute()]


FINGERPRINT_FIELDS = (
    "epoch",
    "status",
    "steps_done",
    "steps_running",
    "next_seq",
    "agents_done",
    "agents_running",
    "children",
    "finished_at",
)


def read_fingerprint(store: StoreCore, run_id: str) -> tuple[str | int | None, ...] | None:
    """What changes whenever a fact the history reads does: counters of the
    run hash and the sizes of its hashes (a journal write adds a field; a
    step row settling moves between two hashes or bumps ``steps_done``; a
    later attempt's rewrite bumps the epoch). None for a run that does not exist."""
    k = store.run_keys(run_id)
    with storage_errors():
        # Not a transaction (a Cluster's pipelines are not): a torn read is only a cache miss.
        pipe = store.client.pipeline(transaction=False)
        pipe.hmget(k.run, list(FINGERPRINT_FIELDS))
        for key in (k.journal, k.steps, k.running, k.agents, k.signals, k.children):
            pipe.hlen(key)
        fields, *sizes = pipe.execute()
    if fields[0] is None:
        return None
    return (*fields, *sizes)
