"""Storage that fails or lies (SPEC §8, §12; docs/security.md).

A journal entry replaced by garbage stops the run with ``error`` /
``workflow_storage_corrupt``, resumable once repaired; a corrupt run record is
``workflow_storage_corrupt`` to every caller and does not stop the recovery of
other runs; a missing run record is ``not_found``; a Redis that is out of
memory or refuses a user's ACL is ``workflow_storage_unavailable``, never
"corrupt". Redis URLs with a password, an ACL user and TLS work end to end
against real servers started with them. (Redis down and restarted:
tests/test_redis_durability.py.)
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.signals import task_postrun

from celery_durable import (
    Engine,
    RunNotFoundError,
    Settings,
    StorageCorruptError,
    StorageUnavailableError,
    WorkflowContext,
    WorkflowResumeError,
    workflow,
)
from celery_durable.broker.schema import StepRow
from celery_durable.local.redis_server import RedisServer, free_port
from celery_durable.tasks.app import BRANCH_TASK
from celery_durable.tasks.recovery import RecoverySweep
from tests.conftest import kill_attempt, worker_thread
from tests.support.poll import RUN_BOUND, poll

TIMEOUT = 30
HELD = threading.Event()
RELEASE = threading.Event()
CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _gate() -> Iterator[None]:
    HELD.clear()
    RELEASE.clear()
    CALLS.clear()
    yield
    RELEASE.set()


def hold() -> str:
    HELD.set()
    if not RELEASE.wait(TIMEOUT * 2):
        raise RuntimeError("never released")
    return "held"


@workflow(name="journaled", description="a step, a fan-out with a held branch, a step", phases=[])
def journaled(ctx: WorkflowContext) -> Any:
    first = ctx.step("a", lambda: CALLS.append("a") or 1)
    legs = ctx.parallel([lambda: ctx.step("leg", lambda: 2), lambda: ctx.step("held", hold)])
    return {"a": first, "legs": legs, "c": ctx.step("c", lambda: 3)}


@workflow(name="plain", description="one step", phases=[])
def plain(ctx: WorkflowContext) -> Any:
    return ctx.step("only", lambda: "done")


# -- a journal that lies -----------------------------------------------------------------------


def _garbage_value(raw: Any, journal: str) -> Any:
    saved = raw.hget(journal, "v:a")
    raw.hset(journal, "v:a", "garbage, not an outcome")
    return lambda: raw.hset(journal, "v:a", saved)


def _garbage_entry(raw: Any, journal: str) -> Any:
    saved = raw.hget(journal, "o:m:0")
    raw.hset(journal, "o:m:0", "no colon here")
    return lambda: raw.hset(journal, "o:m:0", saved)


def _wrong_type(raw: Any, journal: str) -> Any:
    saved = raw.dump(journal)
    raw.delete(journal)
    raw.set(journal, "a string where a hash belongs")

    def repair() -> None:
        raw.delete(journal)
        raw.restore(journal, 0, saved)

    return repair


@pytest.mark.parametrize("corrupt", [_garbage_value, _garbage_entry, _wrong_type], ids=["value", "entry", "type"])
def test_a_corrupt_journal_stops_the_run_resumably_and_a_repair_lets_it_finish(durable, raw_redis, corrupt) -> None:
    d = durable([journaled], branch_batch_ms=0)  # the held branch in a task of its own, the next pass a replay
    run_id = d.client.start_workflow("journaled")
    assert HELD.wait(TIMEOUT)
    journal = d.engine.store.run_keys(run_id).journal
    repair = corrupt(raw_redis, journal)
    RELEASE.set()  # the last branch out wakes the coordinator, whose replay reads the journal

    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert (envelope.status, envelope.reason, envelope.can_resume) == ("error", "workflow_storage_corrupt", True)
    assert envelope.error
    assert d.client.get_workflow_run_detail(run_id).run == envelope

    # Still corrupt: a resume is allowed and stops the same way, clearly.
    again = d.client.resume_workflow(run_id, timeout=TIMEOUT)
    assert (again.status, again.reason, again.attempt) == ("error", "workflow_storage_corrupt", envelope.attempt + 1)

    repair()
    done = d.client.resume_workflow(run_id, timeout=TIMEOUT)
    assert (done.status, done.result) == ("completed", {"a": 1, "legs": [2, "held"], "c": 3}), done.error
    assert CALLS == ["a"], "the journaled step was not run again"
    # The worker is healthy.
    assert d.client.run_workflow("journaled", timeout=TIMEOUT).status == "completed"


def test_a_corrupt_run_record_is_reported_as_such_to_every_caller(durable, raw_redis) -> None:
    d = durable([plain])
    run_id = d.client.run_workflow("plain", timeout=TIMEOUT).run_id
    run_key = d.engine.store.run_keys(run_id).run
    raw_redis.hset(run_key, "epoch", "not a number")
    for call in (
        lambda: d.client.get_workflow_run(run_id),
        lambda: d.client.get_workflow_run_detail(run_id),
        lambda: d.client.cancel_workflow_run(run_id),
    ):
        with pytest.raises(StorageCorruptError, match=run_id) as info:
            call()
        assert info.value.code == "workflow_storage_corrupt"
    # A listing names the damaged run instead of failing for the whole namespace.
    page = d.client.list_workflow_runs()
    assert [entry["run_id"] for entry in page.corrupt] == [run_id]
    assert page.corrupt[0]["code"] == "workflow_storage_corrupt"
    with pytest.raises(WorkflowResumeError) as resume:
        d.client.resume_workflow(run_id)
    assert resume.value.code == "workflow_storage_corrupt"

    raw_redis.hset(run_key, "epoch", "1")
    # Completed, its settled rows are in its archive (issue 42): one running row corrupt, then the archive.
    poll(lambda: raw_redis.exists(d.engine.store.run_keys(run_id).archive), within=RUN_BOUND, what="the archive")
    raw_redis.hset(d.engine.store.run_keys(run_id).running, "only", "garbage")
    with pytest.raises(StorageCorruptError, match="only"):
        d.client.get_workflow_run_detail(run_id)
    raw_redis.hset(d.engine.store.run_keys(run_id).running, "only", StepRow("completed", 1, 0, 1, None).encode())
    archive = d.engine.store.run_keys(run_id).archive
    saved = raw_redis.dump(archive)
    raw_redis.set(archive, "not zlib")
    for call in (
        lambda: d.client.get_workflow_run_detail(run_id),
        lambda: d.client.get_workflow_run_history(run_id),
        lambda: d.client.get_workflow_run_progress(run_id),
        lambda: d.client.export_history(run_id),
    ):
        with pytest.raises(StorageCorruptError, match=run_id):
            call()
    raw_redis.restore(archive, 0, saved, replace=True)
    raw_redis.hset(d.engine.store.run_keys(run_id).agents, "x@1", "{not json")
    with pytest.raises(StorageCorruptError, match="agent row"):
        d.client.get_workflow_run_detail(run_id)


def test_one_corrupt_run_does_not_stop_the_recovery_of_the_others(durable, raw_redis, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="celery_durable")
    d = durable([plain], worker=False)
    store = d.engine.store
    broken, healthy = d.client.start_workflow("plain"), d.client.start_workflow("plain")
    for run_id in (broken, healthy):  # both attempts "died", and are due now
        kill_attempt(raw_redis, d.engine, run_id)
    raw_redis.hset(store.run_keys(broken).run, "status", "no such status")

    RecoverySweep(d.engine).sweep_once()
    assert d.client.get_workflow_run(healthy).attempt == 2
    assert any(broken in record.getMessage() and "corrupt" in record.getMessage() for record in caplog.records)
    # It is looked at again later, once someone may have repaired it.
    assert raw_redis.zscore(store.keys.sweep_due, broken) > 0


def test_a_missing_run_record_is_not_found_and_its_attempt_stops_quietly(durable, raw_redis) -> None:
    d = durable([journaled, plain], branch_batch_ms=0)  # the held branch in a task of its own
    run_id = d.client.start_workflow("journaled")
    assert HELD.wait(TIMEOUT)
    raw_redis.delete(d.engine.store.run_keys(run_id).run)
    for call in (
        lambda: d.client.get_workflow_run(run_id),
        lambda: d.client.get_workflow_run_progress(run_id),
        lambda: d.client.cancel_workflow_run(run_id),
        lambda: d.client.wait_for_workflow_run(run_id, timeout=1),
    ):
        with pytest.raises(RunNotFoundError):
            call()
    with pytest.raises(WorkflowResumeError) as info:
        d.client.resume_workflow(run_id)
    assert info.value.code == "not_found"
    assert run_id not in {run.run_id for run in d.client.list_workflow_runs().runs}

    ended: list[str] = []

    def on_postrun(task: Any = None, **_: Any) -> None:
        ended.append(getattr(task, "name", ""))

    task_postrun.connect(on_postrun, weak=False)
    try:
        RELEASE.set()  # the held branch's writes find no record: refused, nothing written
        poll(lambda: BRANCH_TASK in ended, within=RUN_BOUND, what="the held branch task to end")
    finally:
        task_postrun.disconnect(on_postrun)
    assert not raw_redis.exists(d.engine.store.run_keys(run_id).run), "nothing re-created the record"
    assert d.client.run_workflow("plain", timeout=TIMEOUT).status == "completed"


# -- a Redis that is there but says no ---------------------------------------------------------------


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    with RedisServer(appendfsync="everysec") as server:
        yield server


def test_out_of_memory_is_unavailable_not_corrupt(private_redis: RedisServer) -> None:
    engine = Engine([plain], Settings(redis_url=private_redis.url, key_prefix="oom"))
    admin = redis.Redis.from_url(private_redis.url)
    admin.config_set("maxmemory", 1)  # every write is refused; noeviction, so nothing is dropped
    try:
        with pytest.raises(StorageUnavailableError, match="cannot serve the journal now") as info:
            engine.client().start_workflow("plain")
        assert info.value.code == "workflow_storage_unavailable"
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
    assert engine.client().list_workflow_runs().runs == [], "the refused start left no run behind"


def run_end_to_end(url: str, prefix: str) -> str:
    """A run started and completed through ``url`` (journal and broker both)."""
    engine = Engine([plain], Settings(redis_url=url, key_prefix=prefix, coordinator_queue=f"{prefix}.c",
                                      steps_queue=f"{prefix}.s", agents_queue=f"{prefix}.a"))
    with worker_thread(engine, concurrency=2):
        envelope = engine.client().run_workflow("plain", timeout=TIMEOUT)
    assert (envelope.status, envelope.result) == ("completed", "done"), envelope.error
    return envelope.run_id


def test_a_password_protected_redis_works_end_to_end(private_redis: RedisServer) -> None:
    admin = redis.Redis.from_url(private_redis.url)
    admin.config_set("requirepass", "s3cret pw")
    admin.close()
    base = f"127.0.0.1:{private_redis.port}/0"
    run_end_to_end(f"redis://:s3cret%20pw@{base}", "pw")

    engine = Engine([plain], Settings(redis_url=f"redis://:wrong@{base}", key_prefix="pw"))
    with pytest.raises(StorageUnavailableError, match="credentials") as info:
        engine.client().list_workflow_runs()
    assert "wrong" not in str(info.value), "the password does not leak into errors"
    with pytest.raises(StorageUnavailableError, match="credentials"):
        Engine([plain], Settings(redis_url=f"redis://{base}", key_prefix="pw")).client().list_workflow_runs()


def test_an_acl_user_works_end_to_end_and_missing_permissions_are_named(private_redis: RedisServer) -> None:
    admin = redis.Redis.from_url(private_redis.url)
    admin.acl_setuser("durable", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all"])
    admin.acl_setuser("noscripts", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                      commands=["+@all", "-eval", "-evalsha", "-script"])
    admin.acl_setuser("default", enabled=False)
    admin.close()
    base = f"127.0.0.1:{private_redis.port}/0"
    run_end_to_end(f"redis://durable:pw@{base}", "acl")

    limited = Engine([plain], Settings(redis_url=f"redis://noscripts:pw@{base}", key_prefix="acl2"))
    with pytest.raises(StorageUnavailableError, match="ACL") as info:
        limited.client().start_workflow("plain")
    assert info.value.code == "workflow_storage_unavailable"
    with pytest.raises(StorageUnavailableError, match="credentials"):
        Engine([plain], Settings(redis_url=f"redis://durable:nope@{base}", key_prefix="acl")).client().get_workflow_run(
            "0" * 32
        )


def test_redis_urls_of_other_schemes_are_refused_by_settings() -> None:
    with pytest.raises(ValueError, match="rediss://"):
        Settings(redis_url="http://127.0.0.1:6379/0")


# -- TLS ---------------------------------------------------------------------------------------------


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate with")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, int, Path]]:
    cert, key = make_certificate(tmp_path)
    tls_port = free_port()
    # The plain port stays open too: RedisServer checks that the server is up through it.
    server = RedisServer(
        tmp_path / "data",
        appendfsync="everysec",
        extra_args=("--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                    "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"),
    )
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(f"this redis-server has no TLS support: {exc}")
    try:
        yield server, tls_port, cert
    finally:
        server.cleanup()


def test_rediss_works_end_to_end_against_a_tls_server(tls_redis: tuple[RedisServer, int, Path]) -> None:
    _server, tls_port, cert = tls_redis
    run_end_to_end(f"rediss://127.0.0.1:{tls_port}/0?ssl_cert_reqs=required&ssl_ca_certs={cert}", "tls")


def test_rediss_without_the_servers_ca_fails_clearly(tls_redis: tuple[RedisServer, int, Path]) -> None:
    _server, tls_port, _cert = tls_redis
    url = f"rediss://127.0.0.1:{tls_port}/0?ssl_cert_reqs=required"  # the self-signed CA is not trusted
    with pytest.raises(StorageUnavailableError, match="Redis is unavailable") as info:
        Engine([plain], Settings(redis_url=url, key_prefix="tls")).client().list_workflow_runs()
    assert "certificate" in str(info.value).lower()
    assert info.value.code == "workflow_storage_unavailable"
