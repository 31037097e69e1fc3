"""Sizes of every case: the issue's (full) and a tiny set for the CI smoke test.

Quick sizes keep the same *shape* (the fan-out sizes grow by about the same
factors as 4,096 -> 10,000 -> 50,000) so the smoke test exercises every
comparison the full run makes, only smaller; its numbers mean nothing. Two
exceptions keep the smoke run short: the fan-out has no fourth width (the
full run's 100,000), and the cases that compare fleet sizes run on one
worker process only (starting a fleet takes seconds).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Plan:
    quick: bool
    repeat: int
    sequential_steps: int
    fanout_sizes: tuple[int, ...]
    fanout_baseline_sizes: tuple[int, ...]
    pipeline_items: int
    latency_samples: int
    replay_sizes: tuple[int, ...]
    recovery_tries: int
    recovery_lease_seconds: float
    footprint_steps: int
    footprint_payload: int
    timeout: float
    web_runs: int = 10_000
    web_requests: int = 50
    wide_fanout: int = 0
    """Fan-outs wider than this run ``wide_fanout_runs`` times instead of ``repeat`` (0: no cap)."""
    wide_fanout_runs: int = 1
    fleets: tuple[int, ...] = (1, 2)
    """Worker processes of the cases that compare fleet sizes (timers, many runs)."""
    timer_runs: int = 10_000
    timer_idle_points: tuple[int, ...] = (0, 1_000, 10_000)
    """Waiting runs at which one idle sweep pass is measured (first fleet only)."""
    timer_passes: int = 20
    timer_pilot: int = 300
    external_sweep: bool = False
    """What-if (``--external-sweep``): the timers case's fleets run no sweep; one in the benchmark process does."""
    burst_sizes: tuple[int, ...] = (1_000, 10_000, 100_000)
    """Timers due at one instant in the timer-burst case (issue 28); the claim rate is compared first to last."""
    burst_small_slack: float = 2.0
    """Seconds of slack before T of a burst under 1,000 timers (the full sizes leave ``bursts.SLACK_S``)."""
    capacity_runs: int = 300
    """Typical runs on the fleet whose Redis commands the capacity case counts."""
    capacity_stored: int = 100_000
    """Settled typical runs the capacity case stores through the real scripts to weigh one."""
    many_runs: int = 1_000
    sweep_stored: int = 20_000
    sweep_live: int = 100
    sweep_passes: int = 20
    sweep_window: float = 15.0
    """Seconds each sweeper count (0, 1, 8) runs while Redis commands are counted."""
    sweepers: int = 8
    soak_runs: int = 2_000
    soak_window: int = 16
    """Runs (or chains) kept in flight during the soak."""
    calls_sequential: int = 1_000
    """ctx.calls of the no-op task one after another in one run (vs as many ``delay().get()``)."""
    calls_width: int = 4_096
    """Branches of the parallel whose every branch is one ctx.call (vs a group as wide)."""
    children_sizes: tuple[int, ...] = (250, 1_000)
    throttle_runs: int = 1_000
    """Child runs started from one parallel (vs as many branches of the same step); the last is the issue's."""
    check_runs: int = 1_000
    """Runs in flight the replay check replays (``cases/replay_check.py``)."""
    check_steps: int = 50
    """Journaled steps of each of them."""
    history_steps: int = 10_000
    """Journaled steps of the run whose history is paged (``cases/history.py``)."""
    listing_runs: int = 1_000_000
    """Stored runs the listing case builds and pages through (``cases/listing.py``)."""
    listing_requests: int = 20
    schedule_count: int = 10_000
    """Schedules the fleet fires in the schedules case (``cases/schedules.py``), each once a period."""
    schedule_period: int = 60
    """Seconds between one schedule's ticks (a divisor of 60: the seconds field of a 6-field cron)."""
    schedule_periods: int = 3
    """Periods the case measures the fleet over (every schedule's ticks in them are judged)."""
    schedule_cost_sizes: tuple[int, ...] = (1_000, 10_000)
    """Schedules at which the sweep's cost per tick is measured in-process (first vs last: flat)."""
    async_runs: int = 1_000
    """Runs started and awaited per side of the async client's case (``cases/async_client.py``)."""

    @property
    def timer_fleets(self) -> tuple[int, ...]:
        return self.fleets

    @property
    def max_fanout(self) -> int:
        return max(*self.fanout_sizes, self.calls_width)

    def fanout_runs(self, width: int) -> int:
        if self.wide_fanout and width > self.wide_fanout:
            return min(self.repeat, self.wide_fanout_runs)
        return self.repeat


def full_plan(repeat: int) -> Plan:
    return Plan(
        quick=False,
        repeat=repeat,
        sequential_steps=1_000,
        fanout_sizes=(4_096, 10_000, 50_000, 100_000),
        # Plain Celery at 50,000 would add ~7 minutes per repeat on this
        # machine; the 50,000 and 100,000 figures are judged against the
        # durable 4,096 one.
        fanout_baseline_sizes=(4_096, 10_000),
        pipeline_items=1_000,
        latency_samples=40,
        replay_sizes=(1_000, 2_500, 5_000, 10_000),
        recovery_tries=10,
        recovery_lease_seconds=2.0,
        footprint_steps=1_000,
        footprint_payload=100,
        timeout=1_800,
        # One 50,000-wide run takes about a minute on this machine, 100,000 about two.
        wide_fanout=10_000,
        wide_fanout_runs=1,
    )


def quick_plan(repeat: int) -> Plan:
    return Plan(
        quick=True,
        repeat=repeat,
        sequential_steps=30,
        fanout_sizes=(16, 40, 80),
        fanout_baseline_sizes=(16, 40),
        pipeline_items=10,
        latency_samples=5,
        replay_sizes=(20, 200),
        recovery_tries=1,
        recovery_lease_seconds=1.0,
        footprint_steps=30,
        footprint_payload=100,
        timeout=120,
        web_runs=300,
        web_requests=10,
        fleets=(1,),
        timer_runs=24,
        timer_idle_points=(0, 8, 24),
        timer_passes=5,
        timer_pilot=10,
        burst_sizes=(20, 60),
        # Its runs are built in-process and at T as soon as built: 2 s of slack was only waiting.
        burst_small_slack=0.75,
        capacity_runs=10,
        capacity_stored=200,
        many_runs=20,
        sweep_stored=100,
        sweep_live=10,
        sweep_passes=5,
        sweep_window=0.2,
        soak_runs=24,
        soak_window=8,
        calls_sequential=20,
        calls_width=64,
        children_sizes=(8, 24),
        throttle_runs=60,
        check_runs=20,
        check_steps=10,
        history_steps=200,
        listing_runs=3_000,
        listing_requests=5,
        schedule_count=40,
        # Every schedule ticks each second: two periods are still each one's tick twice, in 2 s not 4.
        schedule_period=1,
        schedule_periods=2,
        schedule_cost_sizes=(50, 200),
        async_runs=40,
    )
