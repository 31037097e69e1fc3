"""Sizes of every case: the issue's (full) and a tiny set for the CI smoke test.

Quick sizes keep the same *shape* (the fan-out sizes grow by about the same
factors as 4,096 -> 10,000 -> 50,000) so the smoke test exercises every
comparison the full run makes, only smaller; its numbers mean nothing.
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

    @property
    def max_fanout(self) -> int:
        return max(self.fanout_sizes)

    def fanout_runs(self, width: int) -> int:
        if self.wide_fanout and width > self.wide_fanout:
            return min(self.repeat, self.wide_fanout_runs)
        return self.repeat


def full_plan(repeat: int) -> Plan:
    return Plan(
        quick=False,
        repeat=repeat,
        sequential_steps=1_000,
        fanout_sizes=(4_096, 10_000, 50_000),
        # Plain Celery at 50,000 would add ~7 minutes per repeat on this
        # machine; the 50,000 figure is judged against the durable 4,096 one.
        fanout_baseline_sizes=(4_096, 10_000),
        pipeline_items=1_000,
        latency_samples=40,
        replay_sizes=(1_000, 2_500, 5_000, 10_000),
        recovery_tries=10,
        recovery_lease_seconds=2.0,
        footprint_steps=1_000,
        footprint_payload=100,
        timeout=1_800,
        # One 50,000-wide run takes about 6 minutes on this machine.
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
    )
