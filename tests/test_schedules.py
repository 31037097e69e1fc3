"""Schedules (SPEC §5d) on the in-process environment: the real Lua on a
private redis-server, the real firing code, a virtual clock stepped a
second at a time (a jump is an outage, which the catch-up window judges)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_durable import (
    ScheduleExistsError,
    ScheduleInfo,
    ScheduleNotFoundError,
    WorkflowContext,
    workflow,
)
from celery_durable.broker import schema
from celery_durable.schedules import firing
from celery_durable.schedules.calendar import Calendar, from_ms, to_ms, zone
from celery_durable.testing import WorkflowTestEnvironment


@workflow(name="stamp", description="Says which tick started it", phases=[])
def stamp(ctx: WorkflowContext) -> Any:
    at = ctx.scheduled_at
    return {"schedule": ctx.schedule_id, "at": at.isoformat() if at else None, "args": ctx.args}


@workflow(
    name="held",
    description="Runs until told to stop",
    phases=[],
    args_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
)
def held(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("stop").payload


@pytest.fixture
def env() -> WorkflowTestEnvironment:
    return WorkflowTestEnvironment([stamp, held])


def outage(env: WorkflowTestEnvironment, ms: int) -> None:
    """Time passes with no worker alive: no sweep runs meanwhile (the clock moved without its hook)."""
    env.clock._offset_ms += ms


def step(env: WorkflowTestEnvironment, seconds: int) -> None:
    for _ in range(seconds):
        env.clock.advance(1)


def actions(info: ScheduleInfo) -> list[str]:
    return [item["action"] for item in reversed(info.recent)]


def runs(env: WorkflowTestEnvironment, schedule_id: str) -> list[Any]:
    return list(reversed(env.client.list_workflow_runs(schedule_id=schedule_id, limit=500).runs))


# -- the calendar: cron, every, DST ------------------------------------------------------------


def local(tick_ms: int, tz: str) -> str:
    return from_ms(tick_ms).astimezone(zone(tz)).strftime("%m-%d %H:%M%z")


def ticks(cron: str, tz: str, start: datetime, count: int) -> list[str]:
    cal = Calendar(cron, None, tz, 0)
    first = cal.next_after(to_ms(start))
    assert first is not None
    return [local(t, tz) for t in cal.upcoming(first, count)]


def test_berlin_spring_forward_skips_the_time_that_does_not_exist_that_day() -> None:
    assert ticks("30 2 * * *", "Europe/Berlin", datetime(2030, 3, 30, tzinfo=UTC), 3) == [
        "03-30 02:30+0100",
        "04-01 02:30+0200",  # 2030-03-31 02:30 does not exist in Berlin
        "04-02 02:30+0200",
    ]


def test_berlin_fall_back_fires_a_repeated_time_once() -> None:
    assert ticks("30 2 * * *", "Europe/Berlin", datetime(2030, 10, 26, tzinfo=UTC), 3) == [
        "10-26 02:30+0200",
        "10-27 02:30+0200",  # the first of the two, not the second
        "10-28 02:30+0100",
    ]


def test_new_york_spring_forward_and_fall_back_every_half_hour() -> None:
    spring = ticks("*/30 * * * *", "America/New_York", datetime(2030, 3, 10, 6, 0, tzinfo=UTC), 4)
    assert spring == ["03-10 01:30-0500", "03-10 03:00-0400", "03-10 03:30-0400", "03-10 04:00-0400"]
    fall = ticks("*/30 * * * *", "America/New_York", datetime(2030, 11, 3, 4, 0, tzinfo=UTC), 6)
    # 01:00 and 01:30 happen twice that night: fired once each, the hour of EST after them is quiet.
    assert fall == [
        "11-03 00:30-0400",
        "11-03 01:00-0400",
        "11-03 01:30-0400",
        "11-03 02:00-0500",
        "11-03 02:30-0500",
        "11-03 03:00-0500",
    ]


def test_a_cron_with_seconds_goes_on_past_a_dst_gap_and_a_repeated_hour() -> None:
    """A cron with seconds has 3,600 local times in the hour a DST change skips or
    repeats; the calendar used to walk them one by one and give up at 2,000,
    leaving the schedule with no next tick: it never fired again."""
    berlin = zone("Europe/Berlin")
    cal = Calendar("* * * * * *", None, "Europe/Berlin", 0)
    before_gap = to_ms(datetime(2030, 3, 31, 1, 59, 59, tzinfo=berlin))
    assert cal.next_after(before_gap) == to_ms(datetime(2030, 3, 31, 3, 0, 0, tzinfo=berlin))
    # Unpaused (or created) at 02:10 the second time that night: 02:10-02:59 fired the first time.
    second_pass = to_ms(datetime(2030, 10, 27, 2, 10, 0, tzinfo=berlin, fold=1))
    assert cal.next_after(second_pass) == to_ms(datetime(2030, 10, 27, 3, 0, 0, tzinfo=berlin))
    after_gap = cal.upcoming(to_ms(datetime(2030, 3, 31, 1, 59, 59, tzinfo=berlin)), 3)
    assert [t - after_gap[0] for t in after_gap] == [0, 1_000, 2_000]  # 01:59:59, then 03:00:00, 03:00:01


def test_six_fields_have_seconds_first_and_names_ranges_steps_lists_parse() -> None:
    assert ticks("*/20 * * * * *", "UTC", datetime(2030, 1, 1, tzinfo=UTC), 3)[:1] == ["01-01 00:00+0000"]
    cal = Calendar("*/20 * * * * *", None, "UTC", 0)
    first = cal.next_after(to_ms(datetime(2030, 1, 1, tzinfo=UTC)))
    assert first is not None and cal.upcoming(first, 3)[1] - first == 20_000
    assert ticks("0 9 * jan-mar mon,wed-fri", "UTC", datetime(2030, 1, 1, tzinfo=UTC), 2) == [
        "01-02 09:00+0000",
        "01-03 09:00+0000",
    ]


def test_every_ticks_at_creation_plus_whole_multiples() -> None:
    cal = Calendar(None, 15_000, "UTC", 1_000)
    assert cal.next_after(1_000) == 16_000
    assert cal.next_after(16_000) == 31_000
    assert cal.between(0, 61_000, 100) == [16_000, 31_000, 46_000]


# -- bad input: refused, naming the problem, nothing stored -------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"cron": "* * * * *", "every": 60}, "exactly one of cron and every"),
        ({}, "exactly one of cron and every"),
        ({"cron": "61 * * * *"}, "does not parse"),
        ({"cron": "* * * *"}, "fields"),
        ({"cron": "0 0 31 2 *"}, "day-of-month"),
        ({"every": 0.5}, "every"),
        ({"every": 60, "timezone": "Mars/Olympus"}, "Mars/Olympus"),
        ({"every": 60, "workflow": "nope"}, "nope"),
        ({"every": 60, "workflow": "held", "args": {"n": "x"}}, "args"),
        ({"every": 60, "limits": {"retries": 3}}, "retries"),
        ({"every": 60, "overlap": "queue"}, "overlap"),
        ({"every": 60, "catchup_window": -1}, "catchup_window"),
        ({"every": 60, "catchup_window": float("nan")}, "catchup_window"),
    ],
)
def test_bad_input_is_refused_naming_it_and_stores_nothing(
    env: WorkflowTestEnvironment, kwargs: dict[str, Any], named: str
) -> None:
    workflow_name = kwargs.pop("workflow", "stamp")
    with pytest.raises(ValueError, match=named):
        env.client.create_schedule("s", workflow_name, **kwargs)
    assert env.client.list_schedules() == []
    with pytest.raises(ScheduleNotFoundError):
        env.client.get_schedule("s")


def test_ids_follow_the_workflow_name_rule_and_are_unique_unless_replaced(env: WorkflowTestEnvironment) -> None:
    with pytest.raises(ValueError, match="schedule_id"):
        env.client.create_schedule("no spaces", "stamp", every=60)
    env.client.create_schedule("s", "stamp", every=60, note="first")
    with pytest.raises(ScheduleExistsError) as caught:
        env.client.create_schedule("s", "stamp", every=30)
    assert caught.value.code == "schedule_exists" and isinstance(caught.value, ValueError)
    env.client.pause_schedule("s")
    info = env.client.create_schedule("s", "stamp", cron="0 * * * *", replace=True)
    assert (info.cron, info.every, info.paused, info.next_times) == ("0 * * * *", None, True, [])
    with pytest.raises(ScheduleNotFoundError) as missing:
        env.client.get_schedule("other")
    assert missing.value.code == "not_found" and isinstance(missing.value, LookupError)


# -- firing ------------------------------------------------------------------------------------


def test_every_tick_starts_one_run_with_its_schedule_and_tick(env: WorkflowTestEnvironment) -> None:
    info = env.client.create_schedule("s", "stamp", every=10, args={"region": "emea"})
    assert len(info.next_times) == 5 and info.next_times[1] - info.next_times[0] == timedelta(seconds=10)
    # the grid is anchored on the creation time itself: a tick one interval after it, none between
    assert info.next_times[0] == info.created_at + timedelta(seconds=10)
    first = info.next_times[0]
    step(env, 35)
    started = runs(env, "s")
    assert [run.scheduled_at for run in started] == [first + timedelta(seconds=10 * i) for i in range(3)]
    for run in started:
        assert run.status == "completed" and run.schedule_id == "s"
        assert run.result == {"schedule": "s", "at": run.scheduled_at.isoformat(), "args": {"region": "emea"}}
        assert run.run_id == schema.schedule_run_id("default", "s", to_ms(run.scheduled_at))
        assert run.to_dict()["scheduled_at"] == run.scheduled_at.isoformat()
    info = env.client.get_schedule("s")
    assert actions(info) == ["started"] * 3
    assert [item["run_id"] for item in reversed(info.recent)] == [run.run_id for run in started]


def test_overlap_skip_records_the_ticks_a_running_run_covers(env: WorkflowTestEnvironment) -> None:
    env.client.create_schedule("s", "held", every=10)
    step(env, 35)
    assert actions(env.client.get_schedule("s")) == ["started", "skipped", "skipped"]
    (first,) = runs(env, "s")
    env.signal(first.run_id, "stop", "done")
    step(env, 10)
    assert actions(env.client.get_schedule("s")) == ["started", "skipped", "skipped", "started"]


def test_overlap_buffer_one_starts_one_tick_when_the_run_settles(env: WorkflowTestEnvironment) -> None:
    env.client.create_schedule("s", "held", every=10, overlap="buffer_one")
    step(env, 35)
    assert actions(env.client.get_schedule("s")) == ["started", "buffered", "skipped"]
    first = runs(env, "s")[0]
    env.signal(first.run_id, "stop", "done")
    step(env, 1)
    found = runs(env, "s")
    assert len(found) == 2 and found[1].scheduled_at == first.scheduled_at + timedelta(seconds=10)
    assert actions(env.client.get_schedule("s"))[-1] == "started"


def test_overlap_allow_all_starts_every_tick(env: WorkflowTestEnvironment) -> None:
    env.client.create_schedule("s", "held", every=10, overlap="allow_all")
    step(env, 35)
    assert [run.status for run in runs(env, "s")] == ["running"] * 3


def test_overlap_cancel_other_cancels_the_last_run_then_starts(env: WorkflowTestEnvironment) -> None:
    env.client.create_schedule("s", "held", every=10, overlap="cancel_other")
    step(env, 25)
    assert [run.status for run in runs(env, "s")] == ["cancelled", "running"]
    assert actions(env.client.get_schedule("s")) == ["started", "started"]


def test_catch_up_within_the_window_after_an_outage_and_missed_beyond_it(env: WorkflowTestEnvironment) -> None:
    env.client.create_schedule("s", "stamp", every=10, catchup_window=25, overlap="allow_all")
    outage(env, 95_000)
    env.fire_schedules()
    env.wait(runs(env, "s")[-1].run_id)
    recent = actions(env.client.get_schedule("s"))
    # ticks at 10..90 s: the ones more than 25 s late are missed, the rest start, each its own run
    assert recent == ["missed"] * 7 + ["started"] * 2
    assert all(run.status == "completed" for run in runs(env, "s"))


def test_cancel_other_catching_up_cancels_each_tick_s_run_for_the_next(env: WorkflowTestEnvironment) -> None:
    """SPEC §5d: caught-up ticks are each their own run, overlap applied in tick
    order. Under cancel_other a tick's run made in the same fire as the next
    tick was cancelled before it existed: RunNotFoundError, and the schedule
    (with the others of its batch) never fired again."""
    env.client.create_schedule("s", "held", every=10, overlap="cancel_other")
    outage(env, 35_000)  # ticks at 10, 20 and 30 s, all within the window
    env.fire_schedules()
    env._fleet.drive()
    assert [run.status for run in runs(env, "s")] == ["cancelled", "cancelled", "running"]
    assert actions(env.client.get_schedule("s")) == ["started"] * 3


def test_catchup_window_zero_fires_on_time_ticks_and_catches_up_nothing(env: WorkflowTestEnvironment) -> None:
    env.client.create_schedule("s", "stamp", every=10, catchup_window=0)
    step(env, 11)  # a sweep a second late is on time
    outage(env, 29_500)
    env.fire_schedules()
    # 20 s and 30 s were seen 20 and 10 s late: missed; 40 s, about a second late: on time
    assert actions(env.client.get_schedule("s")) == ["started", "missed", "missed", "started"]


def test_pause_fires_nothing_and_unpause_does_not_catch_up(env: WorkflowTestEnvironment) -> None:
    env.client.create_schedule("s", "stamp", every=10)
    paused = env.client.pause_schedule("s", note="maintenance")
    assert paused.paused and paused.next_times == [] and paused.note == "maintenance"
    step(env, 35)
    assert runs(env, "s") == []
    info = env.client.unpause_schedule("s")
    assert not info.paused and info.next_times[0] > env.clock.now()
    step(env, 10)
    assert len(runs(env, "s")) == 1 and actions(env.client.get_schedule("s")) == ["started"]


def test_a_pause_note_follows_create_s_rule_so_a_later_update_is_not_refused(env: WorkflowTestEnvironment) -> None:
    """SPEC §5d: bad input raises a ValueError naming the problem, and nothing is stored."""
    env.client.create_schedule("s", "stamp", every=10)
    for method in (env.client.pause_schedule, env.client.unpause_schedule):
        with pytest.raises(ValueError, match="note must be a string of at most 1000 characters"):
            method("s", note="x" * 1001)
    info = env.client.get_schedule("s")
    assert (info.paused, info.note) == (False, None)
    assert env.client.update_schedule("s", every=30).every == 30


def test_trigger_starts_a_run_now_even_paused_and_overlap_applies(env: WorkflowTestEnvironment) -> None:
    env.client.create_schedule("s", "held", every=3600, paused=True)
    run_id = env.client.trigger_schedule("s")
    assert run_id is not None
    env._fleet.runs.append(run_id)
    env._fleet.drive()
    assert env.get(run_id).schedule_id == "s" and env.get(run_id).status == "running"
    assert env.client.trigger_schedule("s") is None  # skip: the first still runs
    assert actions(env.client.get_schedule("s")) == ["started", "skipped"]


def test_a_trigger_buffered_behind_a_live_run_starts_once_that_run_settles(env: WorkflowTestEnvironment) -> None:
    """SPEC §5d buffer_one: the tick starts as soon as that run settles, not at the next tick
    (an hour away here); trigger returns the run id it will have, as it is not skipped."""
    env.client.create_schedule("s", "held", every=3600, overlap="buffer_one")
    first = env.client.trigger_schedule("s")
    assert first is not None
    env._fleet.runs.append(first)
    env._fleet.drive()
    step(env, 1)
    buffered = env.client.trigger_schedule("s")
    assert buffered is not None and buffered != first
    assert actions(env.client.get_schedule("s")) == ["started", "buffered"]
    assert env.client.trigger_schedule("s") is None  # a further tick meanwhile is skipped
    assert env.signal(first, "stop", 1).status == "completed"
    step(env, 2)  # the sweep looks at a buffered tick every BUFFER_POLL_MS (0.5 s)
    assert [run.run_id for run in runs(env, "s")] == [first, buffered]
    assert actions(env.client.get_schedule("s")) == ["started", "buffered", "skipped", "started"]


def test_a_paused_schedule_with_a_buffered_trigger_fires_only_that_tick(env: WorkflowTestEnvironment) -> None:
    """SPEC §5d: a paused schedule fires nothing, and trigger works on it too.
    The sweep looks at a paused schedule only for the tick a trigger buffered;
    it used to fire the calendar's ticks as well, every 10 s while paused."""
    env.client.create_schedule("s", "held", every=10, overlap="buffer_one")
    first = env.client.trigger_schedule("s")
    assert first is not None
    env._fleet.runs.append(first)
    env._fleet.drive()
    env.client.pause_schedule("s")
    buffered = env.client.trigger_schedule("s")
    assert buffered is not None
    assert env.signal(first, "stop", 1).status == "completed"
    step(env, 45)  # four of the calendar's ticks pass, paused
    assert [run.run_id for run in runs(env, "s")] == [first, buffered]
    assert env.signal(buffered, "stop", 1).status == "completed"
    step(env, 25)
    assert [run.run_id for run in runs(env, "s")] == [first, buffered]
    assert actions(env.client.get_schedule("s")) == ["started", "buffered", "started"]
    assert env.client.get_schedule("s").paused


def test_backfill_starts_each_tick_of_the_range_once(env: WorkflowTestEnvironment) -> None:
    info = env.client.create_schedule("s", "stamp", cron="0 * * * *")
    start = info.created_at.replace(minute=0, second=0, microsecond=0, tzinfo=None) - timedelta(hours=5)
    ids = env.client.backfill_schedule("s", start, start + timedelta(hours=3))
    assert len(ids) == 3 and len(set(ids)) == 3
    assert env.client.backfill_schedule("s", start, start + timedelta(hours=3)) == ids
    assert {run.run_id for run in runs(env, "s")} == set(ids)
    assert actions(env.client.get_schedule("s")) == ["started"] * 3  # the second backfill started nothing
    ticks_ = sorted(run.scheduled_at for run in runs(env, "s"))
    assert ticks_[0] == start.replace(tzinfo=UTC)


def test_update_is_checked_and_changes_the_ticks(env: WorkflowTestEnvironment) -> None:
    env.client.create_schedule("s", "stamp", every=10)
    with pytest.raises(ValueError, match="overlap"):
        env.client.update_schedule("s", overlap="nope")
    with pytest.raises(TypeError, match="colour"):
        env.client.update_schedule("s", colour="red")
    info = env.client.update_schedule("s", cron="*/5 * * * * *", note="faster")
    assert (info.cron, info.every, info.note) == ("*/5 * * * * *", None, "faster")
    assert info.next_times[1] - info.next_times[0] == timedelta(seconds=5)
    with pytest.raises(ScheduleNotFoundError):
        env.client.update_schedule("gone", every=5)


def test_delete_stops_the_ticks_and_leaves_the_runs(env: WorkflowTestEnvironment) -> None:
    env.client.create_schedule("s", "stamp", every=10)
    step(env, 11)
    (run,) = runs(env, "s")
    env.client.delete_schedule("s")
    step(env, 30)
    assert env.get(run.run_id).status == "completed"
    assert len(runs(env, "s")) == 1
    with pytest.raises(ScheduleNotFoundError):
        env.client.delete_schedule("s")


# -- crashes: a sweeper dying between claim, start and record ----------------------------------


def test_a_sweeper_dead_after_its_claim_leaves_the_tick_to_the_next_claim_on_time(
    env: WorkflowTestEnvironment,
) -> None:
    info = env.client.create_schedule("s", "stamp", every=60, catchup_window=0)
    outage(env, to_ms(info.next_times[0]) - env.clock.now_ms())
    store = env.engine.store
    dead = store.claim_schedules(store.now_ms(), 10, store.lease_ms)  # claimed, then the sweeper died
    assert [member for member, _ in dead.members] == ["default/s"]
    assert env.fire_schedules() is not None and runs(env, "s") == []  # held by the dead claim
    step(env, int(env.settings.lease_seconds) + 1)
    (run,) = runs(env, "s")
    assert run.scheduled_at == info.next_times[0] and run.status == "completed"
    assert actions(env.client.get_schedule("s")) == ["started"]  # judged from the dead claim: on time


def test_a_sweeper_dead_after_the_start_before_the_record_doubles_nothing(
    env: WorkflowTestEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = env.client.create_schedule("s", "stamp", every=60)
    store = env.engine.store
    real = type(store).record_ticks_each

    def dies(self: Any, records: Any) -> Any:
        monkeypatch.setattr(type(store), "record_ticks_each", real)
        raise SystemExit("killed between the start and the record")

    monkeypatch.setattr(type(store), "record_ticks_each", dies)
    outage(env, to_ms(info.next_times[0]) - env.clock.now_ms())
    with pytest.raises(SystemExit):
        env.fire_schedules()
    step(env, int(env.settings.lease_seconds) + 1)
    (run,) = runs(env, "s")
    assert run.run_id == schema.schedule_run_id("default", "s", to_ms(info.next_times[0]))
    assert actions(env.client.get_schedule("s")) == ["started"]


def test_sweepers_at_once_fire_a_tick_once(env: WorkflowTestEnvironment) -> None:
    import threading

    env.client.create_schedule("s", "stamp", every=60, overlap="allow_all")
    outage(env, to_ms(env.client.get_schedule("s").next_times[0]) - env.clock.now_ms())
    gate = threading.Barrier(8)

    def sweeper() -> None:
        gate.wait()
        firing.fire_due(env.engine)

    threads = [threading.Thread(target=sweeper) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(env.engine.store.list_run_ids("default", None, 10)) == 1
    assert actions(env.client.get_schedule("s")) == ["started"]
