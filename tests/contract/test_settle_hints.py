"""What follows a settle is a hint: the archive of a run settled for good
and the sweep's bookkeeping (``RunRecords._settled``). Neither may fail the
settle, and the bookkeeping is made whatever the archive's fate, on one
Redis and on a Cluster."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable.broker import run_records
from celery_durable.broker.connection import script_source
from celery_durable.broker.store_core import StoreCore
from celery_durable.errors import StorageUnavailableError
from tests.contract.conftest import BackendFactory
from tests.contract.test_run_scripts import running
from tests.support.contract import started


def test_an_archive_that_fails_after_the_settle_is_logged_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error reply of ``archive_run.lua`` (here WRONGTYPE: the keys
    changed type after ``finish.lua`` read them; OOM or BUSY alike) leaves
    the run settled and unarchived, its throttle slots given back."""
    run = running()
    store, run_id = run.store, run.run_id
    keys = store.run_keys(run_id)
    built = run_records.build_archive

    def then_corrupted(*read: Any) -> bytes:
        blob = built(*read)
        store.client.delete(keys.steps)
        store.client.set(keys.steps, "not a hash")
        return blob

    monkeypatch.setattr(run_records, "build_archive", then_corrupted)
    gave_back: list[str] = []
    monkeypatch.setattr(type(store), "_gave_up", lambda self, settled: gave_back.append(settled))
    store.client.hset(keys.run, "throttled", "1")
    store.client.zadd(store.keys.sweep_due, {run_id: 1})
    store.client.script_load(script_source("archive_run"))  # loaded, as on a worker that archived before
    assert store.finish(run_id, 1, "default", "completed", message="done") is True
    assert run.record().status == "completed" and gave_back == [run_id]
    assert store.client.exists(keys.archive) == 0
    assert store.client.zscore(store.keys.sweep_due, run_id) is None  # the sweep was told all the same


@pytest.mark.topologies("cluster")
def test_on_a_cluster_the_sweep_is_told_though_the_archive_fails(
    make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = started(make_backend)
    store, run_id = backend.store, backend.run_id  # type: ignore[attr-defined]
    store.client.zadd(store.keys.sweep_due, {run_id: 1})
    run_script = StoreCore._run

    def run_master_gone(self: StoreCore, name: str, keys: Any, args: Any) -> Any:
        if name == "archive_run":  # the run's master stops answering after the settle
            raise StorageUnavailableError("Redis is unavailable: simulated")
        return run_script(self, name, keys, args)

    monkeypatch.setattr(StoreCore, "_run", run_master_gone)
    assert store.finish(run_id, 1, "default", "completed", message="done") is True
    assert store.client.zscore(store.keys.sweep_due, run_id) is None
