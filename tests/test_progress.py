"""Progress, SPEC §7, and the run detail's phases (§3), against a real Redis.

Paging is checked exhaustively: every cursor, limit and scope of a finished
run against a model written from the spec's own sentences. Then the phase
index that makes phase pages O(page), revisions, the runtime's system
records, the detail's phase states, and the live-update API
(``watch_runs``, ``follow_workflow_run_progress``).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from celery_durable import (
    ProgressPage,
    RunNotFoundError,
    RunUpdate,
    StorageError,
    WorkflowWaitCancelled,
    define_workflow,
)
from celery_durable.client import progress
from celery_durable.tasks.recovery import RecoverySweep
from tests.conftest import kill_attempt
from tests.support.poll import RUN_BOUND, poll

GATE_SECONDS = 20


def gate(entered: threading.Event, release: threading.Event, value: Any) -> Any:
    """A step body that announces it started, then holds until the test releases it."""
    entered.set()
    if not release.wait(GATE_SECONDS):
        raise RuntimeError("the test never released this step")
    return value


def story(ctx: Any) -> Any:
    """Phases One, Two, One again, Three: phase One's records are not contiguous."""
    ctx.phase("One")
    for i in range(4):
        ctx.log(f"a{i}")
    ctx.step("s1", lambda: 1)
    ctx.phase("Two")
    for i in range(5):
        ctx.log(f"b{i}")
    ctx.step("s2", lambda: 2)
    ctx.phase("One")
    ctx.log("c0")
    ctx.log("c1")
    ctx.step("s3", lambda: 3)
    ctx.phase("Three")
    ctx.log("d0")
    return "done"


STORY = define_workflow(
    {
        "name": "story",
        "description": "phases and logs to page through",
        "phases": [{"title": "One", "detail": "first"}, {"title": "Two"}, {"title": "Three", "detail": "last"}],
    },
    story,
)
STORY_MESSAGES = [
    "Attempt 1 started",
    "One", "a0", "a1", "a2", "a3",
    "Two", "b0", "b1", "b2", "b3", "b4",
    "One", "c0", "c1",
    "Three", "d0",
    "Run completed",
]  # fmt: skip


@dataclass(frozen=True)
class Row:
    seq: int
    phase_id: str | None


def expected_page(rows: list[Row], scope: str | None, mode: str, cursor: int, limit: int) -> dict[str, Any]:
    """SPEC §7 read literally: what a page must hold and say."""
    inside = [row.seq for row in rows if scope is None or row.phase_id == scope]
    if mode == "after":
        page = [seq for seq in inside if seq > cursor][:limit]
    elif mode == "before":
        page = [seq for seq in inside if seq < cursor][-limit:]
    else:
        page = inside[-limit:]
    if page:
        older = any(seq < page[0] for seq in inside)
        newer = any(seq > page[-1] for seq in inside)
    else:  # an empty page sits at its cursor
        older = mode == "after" and any(seq <= cursor for seq in inside)
        newer = mode == "before" and any(seq >= cursor for seq in inside)
    return {
        "seqs": page,
        "oldest": inside[0] if inside else None,
        "newest": inside[-1] if inside else None,
        "older": older,
        "newer": newer,
    }


def observed(page: ProgressPage) -> dict[str, Any]:
    return {
        "seqs": [record.seq for record in page.records],
        "oldest": page.oldest_seq,
        "newest": page.newest_seq,
        "older": page.has_more_older,
        "newer": page.has_more_newer,
    }


# -- paging -----------------------------------------------------------------------


def test_every_page_of_a_run_matches_the_spec(durable) -> None:
    d = durable([STORY])
    envelope = d.client.run_workflow("story", timeout=30)
    assert envelope.status == "completed"
    everything = d.client.get_workflow_run_progress(envelope.run_id, after_seq=-1, limit=500)
    assert [record.message for record in everything.records] == STORY_MESSAGES
    n = len(STORY_MESSAGES)
    assert [record.seq for record in everything.records] == list(range(1, n + 1)), "seq is dense from 1"
    assert everything.revision == n
    rows = [Row(record.seq, record.phase_id) for record in everything.records]
    phase_ids = [phase.phase_id for phase in d.client.get_workflow_run_detail(envelope.run_id).phases]
    assert [record.phase_id for record in everything.records if record.kind == "system"] == [None, None]

    checked = 0
    for scope in [None, *phase_ids]:
        for limit in (1, 2, 3, 7, 500):
            queries: list[tuple[str, int, dict[str, Any]]] = [("newest", 0, {})]
            for cursor in range(-1, n + 3):
                queries.append(("after", cursor, {"after_seq": cursor}))
                queries.append(("before", cursor, {"before_seq": cursor}))
            for mode, cursor, options in queries:
                page = d.client.get_workflow_run_progress(envelope.run_id, phase_id=scope, limit=limit, **options)
                want = expected_page(rows, scope, mode, cursor, limit)
                assert observed(page) == want, (scope, limit, mode, cursor)
                assert page.revision == n
                checked += 1
    assert checked == 4 * 5 * (1 + 2 * (n + 4))


def test_cursors_walk_a_phase_forwards_and_backwards_without_gaps(durable) -> None:
    d = durable([STORY])
    run_id = d.client.run_workflow("story", timeout=30).run_id
    one = d.client.get_workflow_run_detail(run_id).phases[0].phase_id
    every = [r.seq for r in d.client.get_workflow_run_progress(run_id, phase_id=one, limit=500).records]
    assert len(every) == 8

    forwards: list[int] = []
    page = d.client.get_workflow_run_progress(run_id, phase_id=one, after_seq=0, limit=3)
    while True:
        forwards += [record.seq for record in page.records]
        if not page.has_more_newer:
            break
        page = d.client.get_workflow_run_progress(run_id, phase_id=one, after_seq=page.records[-1].seq, limit=3)
    assert forwards == every

    backwards: list[int] = []
    page = d.client.get_workflow_run_progress(run_id, phase_id=one, limit=3)
    while True:
        backwards = [record.seq for record in page.records] + backwards
        if not page.has_more_older:
            break
        page = d.client.get_workflow_run_progress(run_id, phase_id=one, before_seq=page.records[0].seq, limit=3)
    assert backwards == every


def test_a_run_without_records_has_empty_pages(durable) -> None:
    d = durable([STORY], worker=False)
    run_id = d.client.start_workflow("story")  # pending: no worker, no record yet
    for options in ({}, {"after_seq": 0}, {"before_seq": 5}, {"phase_id": "phase-2"}):
        page = d.client.get_workflow_run_progress(run_id, **options)
        assert page.records == []
        assert (page.oldest_seq, page.newest_seq) == (None, None)
        assert (page.has_more_older, page.has_more_newer) == (False, False)
        assert page.revision == 0


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"limit": "10"}, "limit"),
        ({"limit": True}, "limit"),
        ({"limit": 2.0}, "limit"),
        ({"after_seq": "3"}, "after_seq"),
        ({"after_seq": -2}, "after_seq"),
        ({"after_seq": 1.5}, "after_seq"),
        ({"after_seq": False}, "after_seq"),
        ({"before_seq": -2}, "before_seq"),
        ({"before_seq": None, "after_seq": [1]}, "after_seq"),
        ({"after_seq": 1, "before_seq": 5}, "after_seq and before_seq"),
        ({"phase_id": 1}, "phase_id"),
        ({"phase_id": ""}, "phase_id"),
        ({"phase_id": "phase-9"}, "phase_id"),
        ({"phase_id": "One"}, "phase_id"),  # a title is not an id
    ],
    ids=repr,
)
def test_a_bad_option_is_a_value_error_naming_it(durable, options: dict[str, Any], option: str) -> None:
    d = durable([STORY], worker=False)
    run_id = d.client.start_workflow("story")
    with pytest.raises(ValueError, match=option):
        d.client.get_workflow_run_progress(run_id, **options)


def test_limits_at_the_bounds_and_unknown_keywords(durable) -> None:
    d = durable([STORY])
    run_id = d.client.run_workflow("story", timeout=30).run_id
    assert len(d.client.get_workflow_run_progress(run_id, limit=1).records) == 1
    assert len(d.client.get_workflow_run_progress(run_id, limit=500).records) == len(STORY_MESSAGES)
    assert len(d.client.get_workflow_run_progress(run_id).records) == len(STORY_MESSAGES)  # default 200
    with pytest.raises(TypeError):
        d.client.get_workflow_run_progress(run_id, cursor="abc")  # type: ignore[call-arg]
    with pytest.raises(RunNotFoundError):
        d.client.get_workflow_run_progress("0" * 32)


def test_the_default_page_is_the_newest_200(durable) -> None:
    def chatty(ctx: Any) -> None:
        ctx.phase("Talk")
        for i in range(250):
            ctx.log(f"line {i}")

    d = durable([define_workflow({"name": "chatty", "description": "d", "phases": [{"title": "Talk"}]}, chatty)])
    run_id = d.client.run_workflow("chatty", timeout=30).run_id
    page = d.client.get_workflow_run_progress(run_id)
    total = 1 + 1 + 250 + 1
    assert [r.seq for r in page.records] == list(range(total - 199, total + 1))
    assert page.has_more_older and not page.has_more_newer


def test_phase_pages_read_only_their_records(durable, raw_redis) -> None:
    """The phase index: one member per record of a phase, written with the
    record; a phase page reads a lexicographic range and the page's own
    stream entries, however many records other phases hold."""

    def lopsided(ctx: Any) -> None:
        ctx.phase("Big")
        for i in range(3000):
            ctx.log(f"big {i}")
        ctx.step("between", lambda: 0)
        ctx.phase("Small")
        ctx.log("small 0")
        ctx.log("small 1")
        ctx.wait_for_signal("done")  # not completed: its keys stay live, not folded into the archive

    d = durable(
        [define_workflow({"name": "lopsided", "description": "d", "phases": [{"title": "Big"}, {"title": "Small"}]},
                         lopsided)]
    )
    run_id = d.client.start_workflow("lopsided")
    poll(
        lambda: d.client.get_workflow_run(run_id).snapshot["waiting_for"],
        within=RUN_BOUND,
        what="the run to wait for its signal",
    )
    keys = d.engine.store.run_keys(run_id)
    members = raw_redis.zrange(keys.progress_phases, 0, -1)
    assert len(members) == 3001 + 3
    assert members[0] == "phase-1|000000000000002"
    assert members[-1] == "phase-2|000000000003005"  # "small 1"
    assert set(raw_redis.zrange(keys.progress_phases, 0, -1, withscores=True)) == {(m, 0.0) for m in members}

    def calls() -> dict[str, int]:
        stats = raw_redis.info("commandstats")
        names = ("xrange", "xrevrange", "zrangebylex", "zrevrangebylex")
        return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in names}

    before = calls()
    page = d.client.get_workflow_run_progress(run_id, phase_id="phase-2", after_seq=0, limit=2)
    after = calls()
    assert [record.message for record in page.records] == ["Small", "small 0"]
    assert page.has_more_newer and not page.has_more_older
    delta = {name: after[name] - before[name] for name in after}
    # Bounds: one range call each way; the page: one range call and one
    # exact-id read per record. Nothing proportional to the 3001 others.
    assert delta == {"xrange": 2, "xrevrange": 0, "zrangebylex": 2, "zrevrangebylex": 1}


def test_revision_grows_with_every_record_and_records_are_never_duplicated(durable) -> None:
    entered, release = threading.Event(), threading.Event()

    def gated(ctx: Any) -> str:
        ctx.phase("Go")
        ctx.log("before")
        ctx.step("hold", lambda: gate(entered, release, 1))
        ctx.log("after")
        return ctx.step("end", lambda: "ok")

    d = durable([define_workflow({"name": "gated", "description": "d", "phases": [{"title": "Go"}]}, gated)])
    run_id = d.client.start_workflow("gated")
    assert entered.wait(10)
    during = d.client.get_workflow_run_progress(run_id)
    release.set()
    assert d.client.wait_for_workflow_run(run_id, timeout=20).status == "completed"
    final = d.client.get_workflow_run_progress(run_id)
    assert during.revision == during.newest_seq == 3  # started, Go, before
    assert final.revision == final.newest_seq == 5  # + after, completed
    assert [r.message for r in final.records] == ["Attempt 1 started", "Go", "before", "after", "Run completed"]


# -- system records ----------------------------------------------------------------------


def system_messages(d: Any, run_id: str) -> list[tuple[str, int]]:
    records = d.client.get_workflow_run_progress(run_id, limit=500).records
    for record in records:
        if record.kind == "system":
            assert record.phase_id is None
    return [(r.message, r.attempt) for r in records if r.kind == "system"]


def test_system_records_tell_start_failure_resume_and_completion(durable) -> None:
    fail = {"yes": True}

    def flaky(ctx: Any) -> str:
        ctx.phase("Try")
        return ctx.step("try", lambda: (_ for _ in ()).throw(RuntimeError("boom")) if fail["yes"] else "fine")

    d = durable([define_workflow({"name": "flaky", "description": "d", "phases": [{"title": "Try"}]}, flaky)])
    failed = d.client.run_workflow("flaky", timeout=20)
    assert failed.status == "error"
    fail["yes"] = False
    assert d.client.resume_workflow(failed.run_id, timeout=20).status == "completed"
    assert system_messages(d, failed.run_id) == [
        ("Attempt 1 started", 1),
        ("Run failed: StepFailed: step 'try' raised RuntimeError: boom", 1),
        ("Run resumed from error (attempt 2)", 2),
        ("Run completed", 2),
    ]


def test_system_records_tell_a_recovery_and_a_cancellation(durable, raw_redis) -> None:
    entered, release = threading.Event(), threading.Event()

    def held(ctx: Any) -> str:
        return ctx.step("hold", lambda: gate(entered, release, "x"))

    workflow = define_workflow({"name": "held", "description": "d", "phases": []}, held)
    # No worker yet: the run stays pending; its lease is made to look expired,
    # which is what a coordinator message lost with its worker looks like.
    idle = durable([workflow], worker=False)
    run_id = idle.client.start_workflow("held")
    kill_attempt(raw_redis, idle.engine, run_id)
    RecoverySweep(idle.engine).sweep_once()
    assert idle.client.get_workflow_run(run_id).attempt == 2
    d = durable([workflow])
    assert entered.wait(10)
    result: dict[str, Any] = {}
    canceller = threading.Thread(target=lambda: result.update(envelope=d.client.cancel_workflow_run(run_id, 20)))
    canceller.start()
    try:
        poll(lambda: d.engine.store.load_run(run_id).cancel_requested, within=RUN_BOUND, what="the cancel request")
    finally:
        release.set()  # the held step finishes; the run stops at its next call
    canceller.join(30)
    assert result["envelope"].status == "cancelled"
    system = system_messages(d, run_id)
    assert [attempt for _, attempt in system] == [2, 2, 2]
    # The record names the cause the sweep found (the run's history shows it as taken_over's cause).
    assert re.fullmatch(r"Run recovered after its attempt died \(.+\) \(attempt 2\)", system[0][0]), system
    assert [message for message, _ in system[1:]] == ["Cancel requested", "Run cancelled"]


# -- the detail's phases ---------------------------------------------------------------------


def test_detail_phases_pending_active_done_with_times(durable) -> None:
    entered, release = threading.Event(), threading.Event()

    def three(ctx: Any) -> str:
        ctx.phase("One")
        ctx.step("one", lambda: 1)
        ctx.phase("Two")
        ctx.log("in two")
        ctx.step("two", lambda: gate(entered, release, 2))
        ctx.phase("Three")
        return ctx.step("three", lambda: "end")

    workflow = define_workflow(
        {
            "name": "three",
            "description": "d",
            "phases": [{"title": "One", "detail": "first"}, {"title": "Two"}, {"title": "Three"}],
        },
        three,
    )
    d = durable([workflow])
    run_id = d.client.start_workflow("three")
    assert entered.wait(10)
    during = d.client.get_workflow_run_detail(run_id)
    release.set()
    one, two, three_ = during.phases
    assert [(p.phase_id, p.title, p.detail) for p in during.phases] == [
        ("phase-1", "One", "first"),
        ("phase-2", "Two", None),
        ("phase-3", "Three", None),
    ]
    assert [p.state for p in during.phases] == ["done", "active", "pending"]
    assert one.started_at is not None and one.finished_at is not None and one.started_at <= one.finished_at
    assert two.started_at is not None and two.finished_at is None and one.finished_at <= two.started_at
    assert three_.started_at is None and three_.finished_at is None
    assert [r.message for r in during.progress][-2:] == ["Two", "in two"]

    assert d.client.wait_for_workflow_run(run_id, timeout=20).status == "completed"
    after = d.client.get_workflow_run_detail(run_id)
    assert [p.state for p in after.phases] == ["done", "done", "done"]
    assert all(p.finished_at is not None for p in after.phases)
    assert after.to_dict()["phases"][2]["state"] == "done"


def test_detail_keeps_the_phase_of_a_failed_run_active_and_shows_recent_progress(durable) -> None:
    def broken(ctx: Any) -> None:
        ctx.phase("Work")
        for i in range(30):
            ctx.log(f"line {i}")
        ctx.step("bad", lambda: 1 / 0)

    d = durable(
        [define_workflow({"name": "broken", "description": "d", "phases": [{"title": "Work"}, {"title": "Never"}]},
                         broken)]
    )
    envelope = d.client.run_workflow("broken", timeout=20)
    assert envelope.status == "error"
    detail = d.client.get_workflow_run_detail(envelope.run_id)
    assert [p.state for p in detail.phases] == ["active", "pending"]
    assert detail.phases[0].finished_at is None
    newest = d.client.get_workflow_run_progress(envelope.run_id, limit=20).records
    assert detail.progress == newest
    assert detail.progress[-1].kind == "system"


# -- live updates ---------------------------------------------------------------------------


def test_watch_runs_announces_changes_of_the_namespace(durable) -> None:
    d = durable([STORY])
    with d.client.watch_runs() as watch:
        assert watch.get(0) is None
        run_id = d.client.start_workflow("story")
        seen: list[RunUpdate] = []
        # The run may already be over when its first status update is read:
        # read until both status updates (running, then the end) are in.
        while [u.change for u in seen].count("status") < 2 or not d.client.get_workflow_run(run_id).is_terminal:
            update = watch.get(10)
            assert update is not None, f"no update after {seen}"
            seen.append(update)
    assert {update.run_id for update in seen} == {run_id}
    changes = [update.change for update in seen]
    assert changes[0] == "created"
    assert "progress" in changes and changes.count("status") >= 2  # running, then completed


def test_watch_runs_filters_by_run_and_stops_when_closed(durable) -> None:
    d = durable([STORY])
    other = durable([STORY], namespace="elsewhere", worker=False)
    first = d.client.start_workflow("story")
    assert d.client.wait_for_workflow_run(first, timeout=20).status == "completed"
    watch = d.client.watch_runs(run_ids=[first])
    d.client.start_workflow("story")  # another run: filtered out
    other.client.start_workflow("story")  # another namespace: another channel
    # Nothing of those two runs. The watch shares its process's subscription,
    # so the first run's last change, published just before the watch was
    # made and not yet handed out, may still come: an update only says that
    # a run changed.
    heard = []
    while (update := watch.get(0.5)) is not None:
        heard.append(update)
    assert {update.run_id for update in heard} <= {first}, heard
    ended = threading.Event()

    def consume() -> None:
        for _ in watch:
            pass
        ended.set()

    thread = threading.Thread(target=consume)
    thread.start()
    watch.close()
    assert ended.wait(5), "closing the watch ends its iteration"
    thread.join(5)
    with pytest.raises(ValueError, match="run_ids"):
        d.client.watch_runs(run_ids=first)  # type: ignore[arg-type]


def test_a_process_s_watches_share_one_subscription_which_outlives_them_a_while(durable) -> None:
    d = durable([STORY])
    raw = redis.Redis.from_url(d.settings.redis_url, decode_responses=True)
    channel = d.engine.store.channel(d.client.namespace)

    def subscribers() -> int:
        return int(raw.pubsub_numsub(channel)[0][1])

    everything, another = d.client.watch_runs(), d.client.watch_runs(run_ids=["0" * 32])
    assert subscribers() == 1
    run_id = d.client.start_workflow("story")
    update = everything.get(10)
    assert update is not None and (update.run_id, update.change) == (run_id, "created")
    assert another.get(0.2) is None  # another run's watch hears nothing of this one
    everything.close()
    another.close()
    # A wait after the last watch closed subscribes no second time.
    assert d.client.wait_for_workflow_run(run_id, timeout=20).status == "completed"
    assert subscribers() == 1


def test_a_shared_subscription_that_fails_fails_its_watches_and_the_next_watch_subscribes_again(durable) -> None:
    d = durable([STORY])
    raw = redis.Redis.from_url(d.settings.redis_url, decode_responses=True)

    def subscribers() -> set[str]:
        # Channel subscribers only: the workers' kombu and Celery subscribe to patterns.
        return {c["id"] for c in raw.client_list(_type="pubsub") if c["sub"] != "0" and c["psub"] == "0"}

    others = subscribers()
    watch = d.client.watch_runs()
    [ours] = subscribers() - others
    assert raw.client_kill_filter(_id=ours) == 1
    # Pub/sub keeps nothing for an absent subscriber: the watch says so
    # rather than wait on a subscription that no longer is.
    with pytest.raises(StorageError):
        watch.get(RUN_BOUND)
    watch.close()
    with d.client.watch_runs() as again:
        run_id = d.client.start_workflow("story")
        update = again.get(RUN_BOUND)
        assert update is not None and update.run_id == run_id


def chatter(ctx: Any) -> int:
    for i in range(CHATTER_STEPS):
        ctx.log(f"record {i}")
        ctx.step(f"s{i}", lambda: None)  # each step's script writes the record before it: a progress update
    return CHATTER_STEPS


CHATTER_STEPS = 40
CHATTER = define_workflow({"name": "chatter", "description": "a record a step", "phases": []}, chatter)


def test_a_wait_reads_the_run_again_once_it_says_it_ended_not_on_each_record(durable) -> None:
    d = durable([CHATTER])
    reads = []
    read = d.client.get_workflow_run

    def counted(run_id: str) -> Any:
        reads.append(run_id)
        return read(run_id)

    d.client.get_workflow_run = counted  # type: ignore[method-assign]
    with d.client.watch_runs() as watch:
        run_id = d.client.start_workflow("chatter")
        # A quiet while longer than the run: every read is one an update caused.
        envelope = d.client.wait_for_workflow_run(run_id, timeout=RUN_BOUND, poll_interval_ms=600_000)
        assert (envelope.status, envelope.result) == ("completed", CHATTER_STEPS)
        updates = []
        while (update := watch.get(0.5)) is not None:
            updates.append(update)
    heard = [update.change for update in updates]
    assert heard.count("progress") >= CHATTER_STEPS // 2, heard  # the run did announce its records
    assert [u.status for u in updates if u.change == "status"] == ["running", "completed"], updates
    # The first read, then one once the run says it completed.
    assert len(reads) <= 2, reads


def test_follow_yields_every_record_in_order_until_the_run_settles(durable) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(ctx: Any) -> str:
        ctx.phase("One")
        ctx.log("first")
        ctx.step("hold", lambda: gate(entered, release, 1))
        ctx.phase("Two")
        ctx.log("second")
        return "ok"

    workflow = define_workflow({"name": "slow", "description": "d", "phases": [{"title": "One"}, {"title": "Two"}]},
                               slow)
    d = durable([workflow])
    run_id = d.client.start_workflow("slow")
    followed: list[str] = []
    iterator = d.client.follow_workflow_run_progress(run_id, timeout=20)
    for record in iterator:
        followed.append(record.message)
        if record.message == "first":
            assert entered.wait(10)
            release.set()  # the rest is written while the follower waits
    assert followed == ["Attempt 1 started", "One", "first", "Two", "second", "Run completed"]
    two = d.client.get_workflow_run_detail(run_id).phases[1].phase_id
    scoped = [r.message for r in d.client.follow_workflow_run_progress(run_id, phase_id=two, timeout=5)]
    assert scoped == ["Two", "second"]
    assert [r.seq for r in d.client.follow_workflow_run_progress(run_id, after_seq=4)] == [5, 6]


def test_follow_checks_at_once_and_ends_on_timeout_or_cancel(durable) -> None:
    entered, release = threading.Event(), threading.Event()

    def held(ctx: Any) -> str:
        return ctx.step("hold", lambda: gate(entered, release, "x"))

    d = durable([define_workflow({"name": "held", "description": "d", "phases": []}, held)])
    with pytest.raises(RunNotFoundError):
        d.client.follow_workflow_run_progress("f" * 32)  # at the call, not at the first next()
    run_id = d.client.start_workflow("held")
    with pytest.raises(ValueError, match="timeout"):
        d.client.follow_workflow_run_progress(run_id, timeout=0)
    with pytest.raises(ValueError, match="phase_id"):
        d.client.follow_workflow_run_progress(run_id, phase_id="phase-1")
    try:
        assert entered.wait(10)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            list(d.client.follow_workflow_run_progress(run_id, timeout=0.5))
        assert time.monotonic() - started < 5
        stop = threading.Event()
        follower = d.client.follow_workflow_run_progress(run_id, cancel_event=stop, poll_interval_ms=50)
        assert next(follower).message == "Attempt 1 started"
        stop.set()
        with pytest.raises(WorkflowWaitCancelled):
            next(follower)
    finally:
        release.set()
    assert d.client.wait_for_workflow_run(run_id, timeout=20).status == "completed"


# -- the one wait loop (progress.settling), behind waiting and following ------------------------


def held_workflow(entered: threading.Event, release: threading.Event) -> Any:
    def held(ctx: Any) -> str:
        return ctx.step("hold", lambda: gate(entered, release, "x"))

    return define_workflow({"name": "held", "description": "d", "phases": []}, held)


def test_wait_for_run_returns_the_settled_run_or_ends_on_timeout_or_cancel(durable) -> None:
    entered, release = threading.Event(), threading.Event()
    d = durable([held_workflow(entered, release)])
    run_id = d.client.start_workflow("held")
    try:
        assert entered.wait(10)
        started = time.monotonic()
        with pytest.raises(TimeoutError) as late:
            progress.wait_for_run(d.client, run_id, timeout=0.3)
        assert 0.3 <= time.monotonic() - started < 5
        assert str(late.value) == f"Run {run_id} is still running after 0.3s"
        stop = threading.Event()
        stop.set()
        with pytest.raises(WorkflowWaitCancelled, match="the run goes on"):
            progress.wait_for_run(d.client, run_id, cancel_event=stop)
        assert d.client.get_workflow_run(run_id).status == "running"
    finally:
        release.set()
    envelope = progress.wait_for_run(d.client, run_id, timeout=20, poll_interval_ms=50)
    assert (envelope.status, envelope.result) == ("completed", "x")


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": 2e9}, "timeout"),
        ({"poll_interval_ms": 0}, "poll_interval_ms"),
        ({"poll_interval_ms": 1.5}, "poll_interval_ms"),
        ({"cancel_event": True}, "cancel_event"),
    ],
    ids=repr,
)
def test_wait_options_are_checked_before_the_run_is_read(durable, options: dict[str, Any], option: str) -> None:
    d = durable([STORY], worker=False)
    with pytest.raises(ValueError, match=option):
        progress.wait_for_run(d.client, "0" * 32, **options)  # an unknown run: RunNotFoundError once read
    with pytest.raises(RunNotFoundError):
        progress.wait_for_run(d.client, "0" * 32, timeout=1)


def test_settling_yields_the_run_as_it_changes_and_ends_with_it_settled(durable) -> None:
    entered, release = threading.Event(), threading.Event()
    d = durable([held_workflow(entered, release)])
    run_id = d.client.start_workflow("held")
    try:
        assert entered.wait(10)
        envelopes = progress.settling(d.client, run_id, timeout=20, poll_interval=5.0, cancel_event=None)
        assert next(envelopes).status == "running"
    finally:
        release.set()
    rest = list(envelopes)
    assert rest[-1].status == "completed"
    assert not any(envelope.is_terminal for envelope in rest[:-1])


def test_settling_reads_again_after_a_quiet_poll_interval(durable, raw_redis) -> None:
    """Pub/sub may drop an update: a change nobody announced is seen after ``poll_interval``."""
    d = durable([STORY], worker=False)
    run_id = d.client.start_workflow("story")
    envelopes = progress.settling(d.client, run_id, timeout=20, poll_interval=0.2, cancel_event=None)
    assert next(envelopes).status == "pending"
    raw_redis.hset(d.engine.store.run_keys(run_id).run, "status", "paused")  # written without a PUBLISH
    started = time.monotonic()
    assert [envelope.status for envelope in envelopes] == ["paused"]
    assert time.monotonic() - started < 5
