"""Chaos: trips run while random workers are SIGKILLed and replaced.

Four real worker processes (threads pool, four slots each, a 2 s lease) run
a stream of at least 40 trips whose steps sleep at random, so kills land
mid-step. Every
200-600 ms a random worker that has finished starting is killed with SIGKILL
(its whole process group) and a replacement is started at once. A worker
takes some 2.5 s to start, so the last ready worker is spared: otherwise the
fleet is wiped out again as soon as it is back and nothing runs until the
chaos stops (a whole-fleet crash is test_recovery's subject). Chaos stops a
few seconds after the last run started; then every run must complete, with
exactly one reservation per service and run however often the providers
were called, and no step row left running.

The report line gives the recovery times: for every step a kill interrupted
(the chaos app marks steps while their producer runs), the time from the kill
until that step's outcome was journaled by a later attempt; and the time
until the run's take-over was recorded. The seed is printed; ``CHAOS_SEED``
replays the same schedule of starts and kills (not the same timing).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from celery_durable import Client, Engine, Settings, is_terminal_status
from celery_durable.broker import now_ms
from tests.support.apps.chaos import busy_key, chaos_trip, ready_key, trace_key
from tests.support.apps.trip import SERVICES, provider_key
from tests.support.fleet import Fleet, WorkerProcess
from tests.support.poll import START_BOUND, poll

CHAOS = "tests.support.apps.chaos:engine"
RUNS = 40  # at least; more while fewer than MIN_INTERRUPTED steps were interrupted, up to MAX_RUNS
MIN_INTERRUPTED = 5
MAX_RUNS = 80
WORKERS = 4
LEASE_SECONDS = 2.0
START_EVERY = (0.2, 0.6)  # seconds between two run starts
KILL_EVERY = (0.2, 0.6)  # seconds between two kills
TAIL = 5.0  # seconds of chaos after the last start
DRAIN = 90.0  # seconds for every run to settle once the chaos stopped
SLEEP_MS = [25, 150]  # each booking naps this twice (around its provider call), review and confirm once


@dataclass
class Kill:
    at_ms: int
    pid: int
    interrupted: list[tuple[str, str]] = field(default_factory=list)  # (run id, step key)


class Chaos:
    """The fleet under chaos: kills a random ready worker, starts a replacement."""

    def __init__(self, fleet: Fleet, raw: redis.Redis, prefix: str, rng: random.Random) -> None:
        self.fleet = fleet
        self.raw = raw
        self.prefix = prefix
        self.rng = rng
        self.workers: list[WorkerProcess] = []
        self.spawned = 0
        self.kills: list[Kill] = []
        self.timeline: list[str] = []  # "<ms> started|killed <name> pid <pid>", for failure reports

    def spawn(self) -> None:
        worker = self.fleet.start(CHAOS, concurrency=4, name=f"w{self.spawned}")
        self.workers.append(worker)
        self.spawned += 1
        self.timeline.append(f"{now_ms()} started {worker.name} pid {worker.pid}")

    def ready(self) -> list[WorkerProcess]:
        pids = {int(pid) for pid in self.raw.smembers(ready_key(self.prefix))}
        return [worker for worker in self.workers if worker.alive() and worker.pid in pids]

    def interrupted(self) -> int:
        return sum(len(kill.interrupted) for kill in self.kills)

    def kill_one(self) -> None:
        ready = self.ready()
        if len(ready) < 2:
            return  # the others are still starting: the last ready worker is spared
        victim = self.rng.choice(ready)
        kill = Kill(at_ms=now_ms(), pid=victim.pid)
        victim.kill()
        self.timeline.append(f"{kill.at_ms} killed {victim.name} pid {victim.pid}")
        self.workers.remove(victim)
        self.spawn()
        # The victim is dead: whatever step it still marks busy, it was in the middle of.
        suffix = f"|{victim.pid}"
        busy = self.raw.hkeys(busy_key(self.prefix))
        for marker in (m for m in busy if m.endswith(suffix)):
            run_id, step, _ = marker.split("|")
            kill.interrupted.append((run_id, step))
            self.raw.hdel(busy_key(self.prefix), marker)
        self.kills.append(kill)


def run_key(prefix: str, run_id: str, what: str) -> str:
    return f"{prefix}:{{{run_id}}}:{what}"


def statuses(raw: redis.Redis, prefix: str, run_ids: list[str]) -> list[str]:
    pipe = raw.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hget(run_key(prefix, run_id, "run"), "status")
    return [str(s) for s in pipe.execute()]


def unleash(chaos: Chaos, client: Client, raw: redis.Redis, prefix: str) -> list[str]:
    """Start the runs while killing workers; returns the run ids once the chaos is over.

    Kills are random, so on a slow machine few may land mid-step: runs keep
    being started until enough steps were interrupted to make the test mean
    something (or MAX_RUNS were started).
    """
    rng = chaos.rng
    run_ids: list[str] = []
    started = time.monotonic()
    next_start = started
    next_kill = started + rng.uniform(*KILL_EVERY)
    next_look = started
    last_start = 0.0
    while True:
        now = time.monotonic()
        wanted = RUNS if chaos.interrupted() >= MIN_INTERRUPTED else MAX_RUNS
        if len(run_ids) < wanted and now >= next_start:
            run_ids.append(client.start_workflow("chaos_trip", args={"sleep_ms": SLEEP_MS}))
            next_start = now + rng.uniform(*START_EVERY)
            last_start = now
        if now >= next_kill:
            chaos.kill_one()
            next_kill = now + rng.uniform(*KILL_EVERY)
        if len(run_ids) >= wanted and now >= next_look:
            next_look = now + 0.5
            if now - last_start >= TAIL or all(s == "completed" for s in statuses(raw, prefix, run_ids)):
                return run_ids
        time.sleep(0.01)


def step_rows(raw: redis.Redis, prefix: str, run_id: str) -> dict[str, str]:
    return {**raw.hgetall(run_key(prefix, run_id, "steps")), **raw.hgetall(run_key(prefix, run_id, "running"))}


def recovery_times(chaos: Chaos, client: Client) -> tuple[list[float], list[float]]:
    """(kill to interrupted step journaled again, kill to take-over recorded), seconds, per interrupted step.

    Read through the client: a completed run's rows and records are in its archive by now."""
    journaled: list[float] = []
    taken_over: list[float] = []
    for kill in chaos.kills:
        for run_id, step in kill.interrupted:
            rows = {row.key: row for row in client.get_workflow_run_detail(run_id).steps}
            row = rows.get(step)
            at = int(row.finished_at.timestamp() * 1000) if row is not None and row.finished_at is not None else None
            if row is not None and row.status == "completed" and at is not None and at >= kill.at_ms:
                journaled.append((at - kill.at_ms) / 1000)
            takeovers = [
                int(record.at.timestamp() * 1000)
                for record in client.get_workflow_run_progress(run_id, after_seq=0, limit=500).records
                if record.kind == "system" and "recovered" in record.message
                and int(record.at.timestamp() * 1000) >= kill.at_ms
            ]
            if takeovers:
                taken_over.append((min(takeovers) - kill.at_ms) / 1000)
    return journaled, taken_over


def describe_run(client: Client, raw: redis.Redis, prefix: str, run_id: str, logs: Path, kills: list[Kill]) -> str:
    """Everything a person needs to see why a run did not complete."""
    run = raw.hgetall(run_key(prefix, run_id, "run"))
    keep = ("status", "reason", "error", "epoch", "attempt", "lease_until", "lock", "lock_until", "wake", "refused")
    lines = [f"run {run_id}: " + ", ".join(f"{k}={run.get(k)!r}" for k in keep)]
    lines.append(f"  now_ms={now_ms()} sweep_due={raw.zscore(f'{prefix}:{{sweep}}:due', run_id)}")
    for entry_id, record in raw.xrange(run_key(prefix, run_id, "progress")):
        kind, attempt, message = record["kind"], record["attempt"], record["message"]
        lines.append(f"  progress {entry_id} at {record['at']} [{kind}] attempt {attempt}: {message}")
    for step, row in sorted(step_rows(raw, prefix, run_id).items()):
        lines.append(f"  step {step}: {row}")
    journal = raw.hgetall(run_key(prefix, run_id, "journal"))
    lines.append("  journal: " + json.dumps(dict(sorted(journal.items())))[:2000])
    hits = [(k.at_ms, k.pid) for k in kills if any(r == run_id for r, _ in k.interrupted)]
    lines.append(f"  interrupted by kills (ms, pid): {hits}")
    lines.extend(f"  trace {event}" for event in raw.lrange(trace_key(prefix, run_id), 0, -1))
    for log in sorted(logs.glob("w*.log")):
        mentions = [line for line in log.read_text(errors="replace").splitlines() if run_id in line]
        lines.extend(f"  {log.name}: {line}" for line in mentions[-10:])
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.timeout(170)
def test_trips_complete_exactly_once_while_workers_are_killed(
    settings: Settings, fleet: Fleet, raw_redis: redis.Redis, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"\nchaos seed {seed} (CHAOS_SEED={seed} replays this schedule)")
    settings = settings.model_copy(update={"lease_seconds": LEASE_SECONDS})
    fleet.settings = settings
    prefix = settings.key_prefix
    client = Engine([chaos_trip], settings).client()
    chaos = Chaos(fleet, raw_redis, prefix, random.Random(seed))
    began = time.monotonic()

    for _ in range(WORKERS):
        chaos.spawn()
    poll(lambda: len(chaos.ready()) == WORKERS, within=START_BOUND, what="the first workers to start")
    unleashed = time.monotonic()
    run_ids = unleash(chaos, client, raw_redis, prefix)
    chaos_seconds = time.monotonic() - unleashed

    # The chaos is over; every slot of the fleet holds a live worker.
    assert sum(worker.alive() for worker in chaos.workers) == WORKERS
    deadline = time.monotonic() + DRAIN
    while time.monotonic() < deadline and not all(is_terminal_status(s) for s in statuses(raw_redis, prefix, run_ids)):
        time.sleep(0.2)
    envelopes = {run_id: client.get_workflow_run(run_id) for run_id in run_ids}
    unfinished = [run_id for run_id, envelope in envelopes.items() if envelope.status != "completed"]
    assert not unfinished, "\n".join(
        [f"seed {seed}: {len(unfinished)} of {len(run_ids)} runs did not complete", *chaos.timeline]
        + [describe_run(client, raw_redis, prefix, run_id, tmp_path, chaos.kills) for run_id in unfinished]
    )

    # Exactly one reservation per run and service, whatever the raw calls.
    duplicates = 0
    for service in SERVICES:
        reservations = raw_redis.hgetall(provider_key(prefix, service, "reservations"))
        assert set(reservations) == {f"{run_id}:book-{service}" for run_id in run_ids}, (seed, service)
        calls = {key: int(n) for key, n in raw_redis.hgetall(provider_key(prefix, service, "calls")).items()}
        assert set(calls) == set(reservations), (seed, service)
        assert all(n >= 1 for n in calls.values())
        duplicates += sum(calls.values()) - len(reservations)
        for run_id, envelope in envelopes.items():
            booked = {b["service"]: b for b in envelope.result["bookings"]}
            assert booked[service] == json.loads(reservations[f"{run_id}:book-{service}"]), (seed, run_id)
    for run_id, envelope in envelopes.items():
        assert envelope.result["confirmed"] is True, (seed, run_id)
        assert envelope.snapshot["steps_running"] == 0, (seed, run_id)
        rows = client.get_workflow_run_detail(run_id).steps
        assert {row.status for row in rows} == {"completed"}, (seed, run_id, rows)

    interrupted = chaos.interrupted()
    journaled, taken_over = recovery_times(chaos, client)
    taken = sum(1 for envelope in envelopes.values() if envelope.attempt > 1)
    report = (
        f"chaos: seed {seed}, {len(run_ids)} runs, {len(chaos.kills)} kills, "
        f"{interrupted} steps interrupted mid-flight, "
        f"{taken} runs taken over, {duplicates} duplicate provider calls absorbed by idempotency keys; "
        f"recovery (kill -> interrupted step journaled) median {summary(journaled)}; "
        f"take-over (kill -> 'recovered' record) median {summary(taken_over)}; "
        f"chaos {chaos_seconds:.1f}s, total {time.monotonic() - began:.1f}s"
    )
    # Shown even when pytest captures output (CI runs without -s).
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print(f"\n{report}")
    assert chaos.kills, f"seed {seed}: the chaos killed no worker"
    assert interrupted and journaled, f"seed {seed}: no kill interrupted a step: the chaos proved nothing"


def summary(seconds: list[float]) -> str:
    if not seconds:
        return "n/a"
    return f"{statistics.median(seconds):.1f}s max {max(seconds):.1f}s (n={len(seconds)})"
