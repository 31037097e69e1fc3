"""Compares a namespace's indexes with its run records, member by member: the
index-consistency check of issue 28, on one Redis and on a Redis Cluster.

The expected members are computed here from each record, independently of
``index_members`` in ``_prelude.lua`` that writes them (the format:
``broker/indexes.py``, keys.py).
"""

from __future__ import annotations

from collections import defaultdict
from typing import cast

from celery_durable.broker import RunRecord, RunStore


def expected_members(record: RunRecord, counter: int) -> set[str]:
    order = f"{record.created_at:013d}{counter:015d}"
    tail = f"{order}|{record.run_id}"
    members = {
        f"t|{tail}",
        f"s|{record.status}|{tail}",
        f"w|{record.workflow}|{tail}",
        f"sw|{record.status}|{record.workflow}|{tail}",
        f"i|{record.run_id}",
    }
    if record.waiting_for is not None:
        members.add(f"a|{tail}")
        if record.waiting_for["name"]:
            members.add(f"n|{record.waiting_for['name']}|{tail}")
    return members


def disagreements(store: RunStore, namespace: str) -> list[str]:
    """Every way the namespace's indexes and its records differ ([] when they agree)."""
    ns = store.keys.namespace(namespace)
    client = store.client
    listed = {str(member): int(score) for member, score in client.zrange(ns.runs, 0, -1, withscores=True)}
    members = cast(list[str], client.zrange(ns.index, 0, -1))
    states = cast(dict[str, str], client.hgetall(ns.index_state))
    actual: dict[str, set[str]] = defaultdict(set)
    for member in members:
        actual[member.rsplit("|", 1)[-1]].add(member)
    records, damaged = store.load_runs(sorted(listed))
    assert not damaged, damaged
    found = {record.run_id: record for record in records}
    problems = [f"{run_id}: listed, record gone" for run_id in sorted(set(listed) - set(found))]
    for run_id, record in found.items():
        expected = expected_members(record, listed[run_id])
        if actual.get(run_id, set()) != expected:
            problems.append(
                f"{run_id} ({record.status}, waiting {record.waiting_for}): "
                f"missing {sorted(expected - actual.get(run_id, set()))}, "
                f"extra {sorted(actual.get(run_id, set()) - expected)}"
            )
        if run_id not in states:
            problems.append(f"{run_id}: no index state")
    for run_id in sorted(set(actual) - set(found)):
        problems.append(f"{run_id}: indexed, not a listed run: {sorted(actual[run_id])}")
    for run_id in sorted(set(states) - set(found)):
        problems.append(f"{run_id}: index state of a run not listed")
    return problems
