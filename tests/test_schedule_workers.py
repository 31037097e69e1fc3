"""Schedules on real worker processes (SPEC §5d): no beat, no singleton.

Two workers of eight threads each fire an every-second schedule: one run
per tick, none twice, none missed. A worker SIGKILLed (by its own pid) while
it fires, between the claim and the start or between the start and the
record: the tick still starts exactly one run, and nothing after it is lost.
"""

from __future__ import annotations

import itertools
import os
import statistics
from pathlib import Path
from typing import Any

import pytest

from celery_durable import Engine, Settings
from celery_durable.schedules.calendar import to_ms
from tests.support.apps.scheduled import stamp
from tests.support.fleet import Fleet, fleet  # noqa: F401  (the fixture)
from tests.support.poll import lease_bound, poll

APP = "tests.support.apps.scheduled:engine"
SOAK_SECONDS = int(os.environ.get("SCHEDULE_SOAK_SECONDS", "20"))
"""How long the two workers fire the every-second schedule (the issue's soak is 60: set it)."""


def scheduled_runs(client: Any, schedule_id: str) -> list[Any]:
    return list(reversed(client.list_workflow_runs(schedule_id=schedule_id, limit=500).runs))


def assert_every_tick_once(runs: list[Any], every_ms: int, first_ms: int) -> None:
    ticks = [to_ms(run.scheduled_at) for run in runs]
    assert ticks[0] == first_ms, "the first tick was not fired"
    assert len(ticks) == len(set(ticks)), "a tick started two runs"
    gaps = {b - a for a, b in itertools.pairwise(ticks)}
    assert gaps == {every_ms}, f"ticks missed or out of step: gaps {sorted(gaps)}"


def test_two_workers_of_eight_threads_fire_each_tick_once(settings: Settings, fleet: Fleet) -> None:  # noqa: F811
    client = Engine([stamp], settings).client()
    for name in ("a", "b"):
        fleet.start(APP, concurrency=8, name=name)
    store = client.engine.store
    # Both up and beating (sweeping) first: a worker's boot is not the firing's lag.
    poll(
        lambda: store.client.zcard(store.keys.workers) >= 2,
        within=lease_bound(settings, 6),
        what="two workers beating",
    )
    info = client.create_schedule("pulse", "tick-stamp", every=1, overlap="allow_all")
    first = to_ms(info.next_times[0])
    poll(
        lambda: len(scheduled_runs(client, "pulse")) >= SOAK_SECONDS,
        within=SOAK_SECONDS + 6 * settings.lease_seconds,
        what=f"{SOAK_SECONDS} ticks",
    )
    client.delete_schedule("pulse")
    runs = poll(
        lambda: (found := scheduled_runs(client, "pulse")) and all(r.status == "completed" for r in found) and found,
        within=lease_bound(settings, 6),
        what="every run completed",
    )
    assert_every_tick_once(runs, 1000, first)
    assert all(run.result == {"schedule": "pulse", "at": run.scheduled_at.isoformat()} for run in runs)
    lags = sorted((run.started_at - run.scheduled_at).total_seconds() for run in runs)
    p50, p99 = statistics.median(lags), lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    print(f"\n{len(runs)} ticks on 2 workers x 8 threads: lag tick -> run started p50 {p50:.3f} s, p99 {p99:.3f} s")
    assert p99 < 2.0, f"ticks fired late: p99 {p99:.3f} s"


@pytest.mark.parametrize("die_at", ["start", "record"])
def test_a_worker_killed_while_it_fires_doubles_and_loses_nothing(
    settings: Settings, fleet: Fleet, tmp_path: Path, die_at: str  # noqa: F811
) -> None:
    client = Engine([stamp], settings).client()
    mark = tmp_path / "died"
    dying = fleet.start(
        APP, concurrency=8, name="dying",
        env={"CD_TEST_SCHEDULE_DIE_AT": die_at, "CD_TEST_SCHEDULE_DIE_MARK": str(mark)},
    )
    # Its sweep runs before the schedule exists (its beat comes from the sweep): a
    # tick due before any sweeper looked is missed by rule (catchup_window 1 s),
    # and a loaded machine can take longer than a tick to start a process.
    poll(
        lambda: any(w.alive and w.name.startswith(dying.hostname_prefix) for w in client.list_workers()),
        within=lease_bound(settings, 4),
        what="the firing worker's first beat",
    )
    # catchup_window 1 s, well below the claim's lease the survivor waits out:
    # a death is not an outage, so the tick it died on is not missed (and a
    # loaded machine's late first sweep is not mistaken for one).
    info = client.create_schedule("pulse", "tick-stamp", every=2, overlap="allow_all", catchup_window=1)
    first = to_ms(info.next_times[0])
    poll(lambda: not dying.alive(), within=lease_bound(settings, 4), what="the firing worker's death")
    assert mark.read_text() == str(dying.pid) or mark.exists()
    fleet.start(APP, concurrency=8, name="survivor")
    runs = poll(
        lambda: len(found := scheduled_runs(client, "pulse")) >= 5 and found,
        within=lease_bound(settings, 10),
        what="five ticks after the death",
    )
    assert_every_tick_once(runs, 2000, first)
    recent = [item["action"] for item in client.get_schedule("pulse").recent]
    assert set(recent) == {"started"}, recent
