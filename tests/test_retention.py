"""A workflow cannot fill Redis by accident: progress is trimmed to
``progress_max_records`` per run, and settled runs expire after
``run_retention_seconds`` (docs/persistence.md, "Retention").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from celery_durable import WorkflowContext, workflow
from celery_durable.broker.replies.control import RequestVerdict
from celery_durable.tasks.recovery import RecoverySweep
from tests.conftest import kill_attempt
from tests.support.poll import RUN_BOUND, poll

TIMEOUT = 30
KEEP = 10


@workflow(name="chatty", description="logs more than it may keep", phases=[{"title": "One"}, {"title": "Two"}])
def chatty(ctx: WorkflowContext) -> Any:
    ctx.phase("One")
    for i in range(int(ctx.args.get("n", 12))):
        ctx.log(f"one {i}")
    ctx.step("a", lambda: 1)
    ctx.phase("Two")
    for i in range(int(ctx.args.get("n", 12))):
        ctx.log(f"two {i}")
    return ctx.step("b", lambda: 2)


@workflow(name="fails-once", description="fails on its first attempt", phases=[])
def fails_once(ctx: WorkflowContext) -> Any:
    ctx.step("first", lambda: "ok")
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return "second"


def all_pages(client: Any, run_id: str, **scope: Any) -> list[int]:
    seqs: list[int] = []
    after = 0
    while True:
        page = client.get_workflow_run_progress(run_id, after_seq=after, limit=3, **scope)
        seqs += [record.seq for record in page.records]
        if not page.has_more_newer:
            return seqs
        after = page.records[-1].seq


# -- progress is trimmed ---------------------------------------------------------------------


def test_progress_keeps_the_newest_records_and_pages_stay_consistent(durable, raw_redis) -> None:
    d = durable([chatty], progress_max_records=KEEP)
    client = d.client
    envelope = client.run_workflow("chatty", args={"n": 12}, timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    keys = d.engine.store.run_keys(envelope.run_id)

    newest = client.get_workflow_run_progress(envelope.run_id, limit=500)
    revision = newest.revision
    assert revision > 2 * KEEP, "the run wrote more records than it keeps"
    assert newest.newest_seq == revision
    # Records of a phase go with their index entry; only system records (the
    # last, "Run completed", written by a script without the phase index) may
    # stand one over the cap until the next record of a phase is written.
    assert KEEP <= len(newest.records) <= KEEP + 1
    # Completed, the run is archived (issue 42): its stream and phase index
    # are folded into the archive, which keeps exactly the records kept.
    poll(lambda: d.engine.store.archive(envelope.run_id) is not None, within=RUN_BOUND, what="the archive")
    archive = d.engine.store.archive(envelope.run_id)
    assert archive is not None and not raw_redis.exists(keys.progress, keys.progress_phases)
    assert len(archive.progress) == len(newest.records)
    seqs = [record.seq for record in newest.records]
    assert seqs == list(range(newest.oldest_seq, revision + 1)), "what is kept is dense and the newest"
    assert not newest.has_more_older and not newest.has_more_newer

    # Paging from the start begins at the oldest record kept; cursors before it are fine.
    assert all_pages(client, envelope.run_id) == seqs
    assert client.get_workflow_run_progress(envelope.run_id, after_seq=-1, limit=2).records[0].seq == seqs[0]
    before_oldest = client.get_workflow_run_progress(envelope.run_id, before_seq=seqs[0], limit=5)
    assert before_oldest.records == [] and not before_oldest.has_more_older
    assert client.get_workflow_run_progress(envelope.run_id, before_seq=seqs[2], limit=5).records[0].seq == seqs[0]

    # A phase's pages come from the records kept, as the phase index gave them.
    for phase_id in ("phase-1", "phase-2"):
        scoped = client.get_workflow_run_progress(envelope.run_id, phase_id=phase_id, limit=500)
        expected = [record.seq for record in newest.records if record.phase_id == phase_id]
        assert [record.seq for record in scoped.records] == expected
        assert all_pages(client, envelope.run_id, phase_id=phase_id) == expected
        if expected:
            assert (scoped.oldest_seq, scoped.newest_seq) == (expected[0], expected[-1])
        else:
            assert scoped.oldest_seq is None and scoped.newest_seq is None
    assert client.get_workflow_run_detail(envelope.run_id).progress[-1].seq == revision


def test_zero_keeps_every_record(durable) -> None:
    d = durable([chatty], progress_max_records=0)
    envelope = d.client.run_workflow("chatty", args={"n": 12}, timeout=TIMEOUT)
    page = d.client.get_workflow_run_progress(envelope.run_id, limit=500)
    assert page.oldest_seq == 1 and len(page.records) == page.revision


# -- settled runs expire ---------------------------------------------------------------------


def run_key_names(d: Any, run_id: str) -> list[str]:
    return list(dataclasses.astuple(d.engine.store.run_keys(run_id)))


def ttls(d: Any, raw: Any, run_id: str) -> dict[str, int]:
    """PTTL of each of the run's keys that exists (-1: no expiry)."""
    return {key: raw.pttl(key) for key in run_key_names(d, run_id) if raw.exists(key)}


def test_a_settled_run_expires_after_the_retention_and_a_resume_keeps_it(durable, raw_redis) -> None:
    retention = 3600
    d = durable([chatty, fails_once], run_retention_seconds=retention)
    done = d.client.run_workflow("chatty", timeout=TIMEOUT)
    poll(lambda: d.engine.store.archive(done.run_id) is not None, within=RUN_BOUND, what="the archive")
    poll(
        lambda: all(ttl > 0 for ttl in ttls(d, raw_redis, done.run_id).values()),
        within=RUN_BOUND,
        what="the retention clock to start",
    )
    left = ttls(d, raw_redis, done.run_id)
    # Completed, the run is its hash and its archive (issue 42), both on the clock.
    assert {k.rsplit("}:", 1)[1] for k in left} == {"run", "archive"}
    assert all(0 < ttl <= retention * 1000 for ttl in left.values()), left

    # A run in error expires too, unless it is resumed: the resume persists every key.
    failed = d.client.run_workflow("fails-once", timeout=TIMEOUT)
    assert (failed.status, failed.can_resume) == ("error", True)
    poll(
        lambda: all(ttl > 0 for ttl in ttls(d, raw_redis, failed.run_id).values()),
        within=RUN_BOUND,
        what="the failed run's clock",
    )
    kept = {k.rsplit("}:", 1)[1] for k in ttls(d, raw_redis, failed.run_id)}
    assert {"run", "journal", "progress", "steps"} <= kept and "archive" not in kept, "an error run is not archived"
    resumed = d.client.resume_workflow(failed.run_id, timeout=TIMEOUT)
    assert (resumed.status, resumed.result) == ("completed", "second")
    poll(
        lambda: all(ttl > 0 for ttl in ttls(d, raw_redis, failed.run_id).values()),
        within=RUN_BOUND,
        what="the clock to restart",
    )


def test_a_resumed_run_carries_no_expiry_while_it_runs(durable, raw_redis) -> None:
    d = durable([fails_once], worker=False, run_retention_seconds=3600)
    worker = durable([fails_once])
    failed = worker.client.run_workflow("fails-once", timeout=TIMEOUT)
    poll(
        lambda: all(ttl > 0 for ttl in ttls(d, raw_redis, failed.run_id).values()),
        within=RUN_BOUND,
        what="the retention clock",
    )
    record = d.engine.store.load_run(failed.run_id)
    assert record is not None
    # The resume itself (resume.lua), before any coordinator runs: no TTL survives it.
    epoch = d.engine.store.resume(record, limits_json="{}", message="test resume", code_hash="", message_id="m")
    assert epoch is not None
    assert set(ttls(d, raw_redis, failed.run_id).values()) == {-1}


def settled(d: Any, raw: Any, run_id: str) -> bool:
    """The run has left the sweep's schedule: what follows its settling is done."""
    return raw.zscore(d.engine.store.keys.sweep_due, run_id) is None


def test_a_paused_run_and_retention_zero_never_expire(durable, raw_redis) -> None:
    forever = durable([chatty], run_retention_seconds=0)
    done = forever.client.run_workflow("chatty", timeout=TIMEOUT)
    poll(lambda: settled(forever, raw_redis, done.run_id), within=RUN_BOUND, what="the run to settle")
    assert set(ttls(forever, raw_redis, done.run_id).values()) == {-1}

    # Queues of its own: the worker above must not pick the run up before the pause.
    later = f"{forever.settings.key_prefix}.later"
    own = {f"{kind}_queue": f"{later}.{kind}" for kind in ("coordinator", "steps", "agents")}
    d = durable([chatty], worker=False, run_retention_seconds=3600, **own)
    run_id = d.client.start_workflow("chatty")
    assert d.engine.store.pause(run_id, "default", "wake").verdict is RequestVerdict.REQUESTED
    durable([chatty], run_retention_seconds=3600, **own)
    assert d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT).status == "paused"
    poll(lambda: settled(d, raw_redis, run_id), within=RUN_BOUND, what="the run to settle")
    assert set(ttls(d, raw_redis, run_id).values()) == {-1}


@pytest.mark.topologies("redis", "cluster")
def test_expired_runs_leave_the_index_and_free_their_idempotency_key(durable, raw_redis) -> None:
    d = durable([chatty], run_retention_seconds=3600)
    first = d.client.start_workflow("chatty", idempotency_key="nightly")
    assert d.client.wait_for_workflow_run(first, timeout=TIMEOUT).status == "completed"
    idem = d.engine.store.keys.namespace("default").idempotency("nightly")
    poll(lambda: raw_redis.pttl(idem) > 0, within=RUN_BOUND, what="the idempotency key to expire with its run")
    other = d.client.run_workflow("chatty", timeout=TIMEOUT)

    # What expiry does, done now: the run's keys are gone.
    raw_redis.delete(*run_key_names(d, first))
    runs = d.client.list_workflow_runs().runs
    assert [run.run_id for run in runs] == [other.run_id]
    assert raw_redis.zrange(d.engine.store.keys.namespace("default").runs, 0, -1) == [other.run_id]
    # The key named a run that is gone: a start with it is a new run.
    again = d.client.start_workflow("chatty", idempotency_key="nightly")
    assert again != first
    assert d.client.wait_for_workflow_run(again, timeout=TIMEOUT).status == "completed"
    assert d.client.start_workflow("chatty", idempotency_key="nightly") == again


def test_a_settled_runs_keys_expire_though_what_follows_its_settling_fails(
    durable, raw_redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention was a write of its own after the settling, and a failure of
    it (logged, then forgotten) left the run's keys with no TTL at all (issue
    25 item 9): the script that settles the run starts the clock itself."""
    d = durable([chatty], run_retention_seconds=3600)
    monkeypatch.setattr(type(d.engine.store), "_settled", lambda *_, **__: None)  # what follows, lost
    run_id = d.client.start_workflow("chatty")
    assert d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT).status == "completed"
    ttls = {key: raw_redis.pttl(key) for key in run_key_names(d, run_id) if raw_redis.exists(key)}
    assert ttls and all(0 < ttl <= 3_600_000 for ttl in ttls.values()), ttls


def test_runs_whose_retention_ran_out_leave_their_namespace_index_with_no_listing(durable, raw_redis) -> None:
    """Pruned only when a listing met them, a namespace nobody lists kept the id
    of every run it ever had (issue 25 item 9): the sweep takes them out."""
    d = durable([chatty], run_retention_seconds=1)
    run_id = d.client.start_workflow("chatty")
    assert d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT).status == "completed"
    index = d.engine.store.keys.namespace("default").runs
    assert raw_redis.zscore(index, run_id) is not None
    poll(lambda: raw_redis.zscore(index, run_id) is None, within=TIMEOUT, what="the expired run to leave its index")
    assert not raw_redis.exists(d.engine.store.run_keys(run_id).run)
    assert raw_redis.zcard(d.engine.store.keys.sweep_expiring) == 0, "nothing left to prune"


# -- a recovery keeps what was asked of the dead attempt -------------------------------------


@pytest.mark.parametrize(("flag", "status"), [("cancel", "cancelled"), ("pause", "paused")])
def test_a_cancel_or_pause_requested_before_a_crash_survives_the_recovery(durable, raw_redis, flag, status) -> None:
    d = durable([chatty], worker=False)
    run_id = d.client.start_workflow("chatty")
    store = d.engine.store
    # A pass started the run (a pending run no attempt started is settled by
    # the cancel itself, with no worker): the request is of its attempt.
    [first] = raw_redis.hkeys(store.run_keys(run_id).live)
    store.activate(run_id, 1, first.decode() if isinstance(first, bytes) else first, "default", "resend")
    requested = (store.cancel if flag == "cancel" else store.pause)(run_id, "default", "wake")
    assert requested.verdict is RequestVerdict.REQUESTED
    # The attempt "died": its message's worker went silent. The sweep takes the run over.
    kill_attempt(raw_redis, d.engine, run_id)
    RecoverySweep(d.engine).sweep_once()
    record = store.load_run(run_id)
    assert record is not None and record.attempt == 2
    assert (record.cancel_requested, record.pause_requested) == (flag == "cancel", flag == "pause")
    durable([chatty])  # a worker, at last
    assert d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT).status == status
