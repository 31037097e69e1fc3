"""A run settled for good is archived (issue 42): its history, steps,
progress and journal folded into one compressed key, read as they were.

On the in-process environment (real Lua on a real redis-server): every
reader of a completed and of a cancelled run answers the same before and
after archiving; the keys go, the archive keeps the run's TTL; a run in
error is not archived and resumes; a late write to an archived run is
refused and recreates nothing; a run settled unarchived (before archives,
or its archiving died) reads as it always did; the archived replies are
the scripts' own, page for page.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import StaleAttemptError, WorkflowContext, workflow
from celery_durable.broker.history_log import read_events, read_tail
from celery_durable.broker.journal_export import read_journal
from celery_durable.broker.replies.control import ArchiveVerdict, RequestVerdict
from celery_durable.broker.run_control import RunControl
from celery_durable.broker.run_records import ARCHIVED_ENTRIES_MAX
from celery_durable.broker.schema.archive import build_archive, parse_archive, shape
from celery_durable.client.history import newest
from celery_durable.testing import WorkflowTestEnvironment

FLAKY: list[int] = []


@workflow(
    name="arch-shipped",
    description="Phases, steps, a fan-out, records, a signal",
    phases=[{"title": "Pack"}, {"title": "Ship"}],
)
def shipped(ctx: WorkflowContext) -> Any:
    ctx.phase("Pack")
    for i in range(6):
        ctx.step(f"pack-{i}", lambda i=i: {"item": i})
        ctx.log(f"packed {i}")
    boxes = ctx.parallel([lambda i=i: ctx.step(f"box-{i}", lambda: i * i) for i in range(4)])
    go = ctx.wait_for_signal("go")
    ctx.phase("Ship")
    ctx.log("shipping")
    when = ctx.now()
    return {"boxes": boxes, "go": go.payload, "day": when.isoformat()[:4] != ""}


@workflow(name="arch-held", description="Holds a seat, waits; cancelled, releases it", phases=[])
def held(ctx: WorkflowContext) -> Any:
    with ctx.saga() as saga:
        ctx.step("hold", lambda: "seat")
        saga.compensate("release", lambda: "released")
        ctx.log("holding")
        return ctx.wait_for_signal("paid").payload


def fails_once_step() -> str:
    FLAKY.append(1)
    if len(FLAKY) == 1:
        raise RuntimeError("first time")
    return "second"


@workflow(name="arch-flaky", description="Fails once, then completes on resume", phases=[])
def flaky(ctx: WorkflowContext) -> Any:
    ctx.log("trying")
    return ctx.step("flaky", fails_once_step, retry=None)


@workflow(name="arch-long", description="More history events than an archive holds", phases=[])
def long_run(ctx: WorkflowContext) -> Any:
    ctx.parallel([lambda i=i: ctx.step(f"s-{i}", lambda: i) for i in range(ARCHIVED_ENTRIES_MAX)])
    return "done"


@pytest.fixture
def env() -> WorkflowTestEnvironment:
    FLAKY.clear()
    return WorkflowTestEnvironment([shipped, held, flaky, long_run])


def suffixes(env: WorkflowTestEnvironment, run_id: str) -> set[str]:
    r = env.engine.store.client
    return {key.rsplit("}:", 1)[1] for key in r.scan_iter(match=f"*{{{run_id}}}*")}


def all_progress(env: WorkflowTestEnvironment, run_id: str, phase_id: str | None = None) -> list[Any]:
    """Every page, three records at a time, forwards then backwards."""
    pages: list[Any] = []
    after = 0
    while True:
        page = env.progress(run_id, phase_id=phase_id, after_seq=after, limit=3)
        pages.append(page)
        if not page.records:
            break
        after = page.records[-1].seq
    before = after + 1
    while True:
        page = env.progress(run_id, phase_id=phase_id, before_seq=before, limit=3)
        pages.append(page)
        if not page.records:
            break
        before = page.records[0].seq
    return pages


def views(env: WorkflowTestEnvironment, run_id: str) -> dict[str, Any]:
    """What every reader says of the run: detail, progress (all of it, each
    phase, pages), history (pages, the tail, values), the export, the
    replay check, a follow from the start."""
    client, store = env.client, env.engine.store
    detail = env.detail(run_id)
    history: list[Any] = []
    after: int | None = None
    while True:
        page = client.get_workflow_run_history(run_id, after=after, limit=4)
        history.append(page)
        if page.next is None:
            break
        after = page.next
    return {
        "detail": detail,
        "newest": env.progress(run_id),
        "pages": all_progress(env, run_id),
        "phases": {p.phase_id: all_progress(env, run_id, p.phase_id) for p in detail.phases},
        "history": history,
        "tail": newest(store, run_id, 5),
        "export": client.export_history(run_id),
        "journal": read_journal(store, run_id),
        "stored": (env.stored(run_id).journal, env.stored(run_id).steps),
        "check": client.check_replay([run_id]),
        "follow": list(client.follow_workflow_run_progress(run_id, timeout=5)),
    }


@pytest.fixture
def unarchived(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Runs settle without being archived (as before archives existed, or as
    a worker that died between the settle and the archive leaves them); the
    returned function archives one now, as the settle would have."""
    archive = RunControl.archive_run
    monkeypatch.setattr(RunControl, "archive_run", lambda self, run_id, read=None: None)
    return lambda env, run_id: archive(env.engine.store, run_id)


ARCHIVED_KEYS = {"history", "steps", "progress", "journal", "progress:phases"}


def assert_archived(env: WorkflowTestEnvironment, run_id: str) -> None:
    left = suffixes(env, run_id)
    assert "archive" in left and not left & ARCHIVED_KEYS, left
    r, k = env.engine.store.client, env.engine.store.run_keys(run_id)
    run_ttl, archive_ttl = r.pttl(k.run), r.pttl(k.archive)
    # The archive expires with the run: archive_run.lua's SET PX takes the
    # run's PTTL, read at the script's frozen start time, from a clock that may
    # have moved on a millisecond by the SET (and PTTL rounds down).
    assert run_ttl > 0 and 0 < archive_ttl <= run_ttl + 2 and run_ttl - archive_ttl < 5_000


def completed_run(env: WorkflowTestEnvironment) -> str:
    run_id = env.start(shipped)
    assert env.signal(run_id, "go", {"by": "ops"}).status == "completed"
    return run_id


def test_a_completed_run_reads_the_same_before_and_after_archiving(
    env: WorkflowTestEnvironment, unarchived: Any
) -> None:
    run_id = completed_run(env)
    assert suffixes(env, run_id) >= ARCHIVED_KEYS, "settled unarchived: the old form"
    before = views(env, run_id)
    assert before["detail"].steps and before["history"][0].events and before["export"]["journal"]
    assert before["check"][0].verdict == "ok"
    assert unarchived(env, run_id) is ArchiveVerdict.OK
    assert_archived(env, run_id)
    assert views(env, run_id) == before
    assert unarchived(env, run_id) is ArchiveVerdict.ARCHIVED  # once


def test_a_cancelled_run_reads_the_same_before_and_after_archiving(
    env: WorkflowTestEnvironment, unarchived: Any
) -> None:
    run_id = env.start(held)
    assert env.cancel(run_id).status == "cancelled"
    before = views(env, run_id)
    assert [s.key for s in before["detail"].steps] == ["hold", "release"]
    assert unarchived(env, run_id) is ArchiveVerdict.OK
    assert_archived(env, run_id)
    assert views(env, run_id) == before


def test_every_settle_for_good_archives_and_its_readers_agree(env: WorkflowTestEnvironment) -> None:
    """The settle itself archives: a completed run (finish), a cancel its
    attempt settles (finish, cancelled), and one cancel.lua settles at once
    (a paused run with nothing to undo)."""
    done = completed_run(env)
    assert_archived(env, done)
    assert env.get(done).result["boxes"] == [0, 1, 4, 9]
    cancelled = env.start(held)
    assert env.cancel(cancelled).status == "cancelled"
    assert_archived(env, cancelled)
    paused = env.start(shipped)
    assert env.pause(paused).status == "paused"
    assert "archive" not in suffixes(env, paused), "a paused run can resume: kept as it is"
    assert env.engine.store.cancel(paused, "default", "m-1").verdict is RequestVerdict.CANCELLED
    assert_archived(env, paused)
    assert [r.message for r in env.progress(done).records][-1] == "Run completed"


def test_a_run_longer_than_an_archive_keeps_its_streams_paged_by_id(env: WorkflowTestEnvironment) -> None:
    """SPEC §3: a history page costs time in proportion to its limit, not to
    the run's size. A page of an archived run decodes the whole archive, so a
    run of more events than the largest page is not archived: its streams
    stay, each page one XRANGE, as while it ran."""
    run_id = env.run(long_run).run_id
    left = suffixes(env, run_id)
    assert "archive" not in left and {"history", "progress", "steps", "journal"} <= left, left
    first = env.client.get_workflow_run_history(run_id, limit=1)
    assert [e.seq for e in first.events] == [1] and first.next == 1
    events = env.client.get_workflow_run_history(run_id, after=ARCHIVED_ENTRIES_MAX, limit=3).events
    assert [e.seq for e in events] == [ARCHIVED_ENTRIES_MAX + 1, ARCHIVED_ENTRIES_MAX + 2, ARCHIVED_ENTRIES_MAX + 3]
    assert env.get(run_id).result == "done"


def test_an_error_run_is_not_archived_and_resumes(env: WorkflowTestEnvironment) -> None:
    run_id = env.start(flaky)
    failed = env.get(run_id)
    assert (failed.status, failed.can_resume) == ("error", True)
    assert "archive" not in suffixes(env, run_id) and {"journal", "steps", "progress", "history"} <= suffixes(
        env, run_id
    )
    assert env.resume(run_id).result == "second"
    assert_archived(env, run_id)
    assert [s.status for s in env.detail(run_id).steps] == ["completed"]
    kinds = [e.kind for e in env.client.get_workflow_run_history(run_id).events]
    assert "step_failed" in kinds and kinds[-1] == "run_settled"


def test_a_late_write_to_an_archived_run_is_refused_and_recreates_nothing(env: WorkflowTestEnvironment) -> None:
    run_id = completed_run(env)
    store, record = env.engine.store, env.engine.store.load_run(run_id)
    assert record is not None
    before = (views(env, run_id), suffixes(env, run_id))
    with pytest.raises(ValueError, match="completed"):
        env.client.signal_workflow_run(run_id, "go", 1)
    assert store.note(run_id, "unserved", "late") is False
    assert store.pause(run_id, "default", "m-2").verdict is RequestVerdict.SETTLED
    assert store.cancel(run_id, "default", "m-3").verdict is RequestVerdict.SETTLED
    with pytest.raises(StaleAttemptError):  # a zombie attempt settling again
        store.finish(run_id, record.epoch, "default", "completed", result_json="1")
    with pytest.raises(StaleAttemptError):  # or journaling a step
        store.journal(run_id, record.epoch, "default").read_sequence("m")  # reads pass...
        store.journal(run_id, record.epoch, "default").mark_sent("m:0")  # ...writes do not
    assert (views(env, run_id), suffixes(env, run_id)) == before


def test_archive_run_refuses_a_run_that_changed_since_it_was_read(
    env: WorkflowTestEnvironment, unarchived: Any
) -> None:
    run_id = completed_run(env)
    store, k = env.engine.store, env.engine.store.run_keys(run_id)
    r = store.client
    read = (r.xrange(k.history), r.hgetall(k.steps), r.xrange(k.progress), r.hgetall(k.journal))
    blob = build_archive(*read)
    assert parse_archive(blob).journal == read[3]
    r.hset(k.journal, "late", "x")  # a write between the read and the archive
    reply = store.call("archive_run", k, [blob, *shape(*read, r.zrange(k.progress_phases, 0, -1))])
    assert reply[0] == "changed" and "archive" not in suffixes(env, run_id)
    r.hdel(k.journal, "late")
    assert unarchived(env, run_id) is ArchiveVerdict.OK  # read again: archived
    error_run = env.start(flaky)
    assert unarchived(env, error_run) is ArchiveVerdict.CHANGED  # not completed or cancelled


def test_a_follow_under_way_when_the_run_is_archived_gets_every_record_once(env: WorkflowTestEnvironment) -> None:
    run_id = env.start(shipped)
    follow = env.client.follow_workflow_run_progress(run_id, timeout=5)
    first = [next(follow) for _ in range(3)]
    env.signal(run_id, "go", 1)  # it completes and is archived while the follow is under way
    assert_archived(env, run_id)
    seqs = [record.seq for record in first + list(follow)]
    newest_seq = env.progress(run_id).newest_seq
    assert seqs == list(range(1, newest_seq + 1))


def test_the_archive_replies_are_the_scripts_own(env: WorkflowTestEnvironment, unarchived: Any) -> None:
    """Every page the read scripts cut from the live keys, cut again from the
    archive built of them: the same, mode by mode and cursor by cursor."""
    run_id = completed_run(env)
    store = env.engine.store
    record = store.load_run(run_id)
    assert record is not None
    phases = ["", *(p.phase_id for p in env.detail(run_id).phases)]
    top = env.progress(run_id).newest_seq or 0
    grid = [
        (phase, mode, cursor, count)
        for phase in phases
        for mode in ("after", "before", "newest")
        for cursor in range(0, top + 2)
        for count in (1, 3, 50)
    ]
    live_pages = [store.progress_page(run_id, *point) for point in grid]
    live_history = [read_events(store, run_id, after, count) for after in range(0, 45) for count in (1, 7)]
    live_tails = [read_tail(store, run_id, count) for count in (1, 5, 100)]
    live = store.journal(run_id, record.epoch, "default")
    seqs = sorted({f.split(":", 1)[1] for f in store.hashes(run_id).journal if f.startswith("n:")})
    live_sequences = [live.read_sequence(seq, start) for seq in seqs for start in (0, 1, 3)]
    live_all = live.read_sequences(seqs)
    assert unarchived(env, run_id) is ArchiveVerdict.OK
    assert [store.progress_page(run_id, *point) for point in grid] == live_pages
    assert [read_events(store, run_id, after, count) for after in range(0, 45) for count in (1, 7)] == live_history
    assert [read_tail(store, run_id, count) for count in (1, 5, 100)] == live_tails
    archived = store.replay_journal(record)
    assert [archived.read_sequence(seq, start) for seq in seqs for start in (0, 1, 3)] == live_sequences
    assert archived.read_sequences(seqs) == live_all
