"""The fleet as an operator sees it: workers, queues, and the runs taken over lately.

Read from what the fleet already records for its own work, so showing it
costs the workers nothing: each worker's beat (``{fleet}:workers``) and the
messages it held then (``{fleet}:held:W``), both written by the recovery
sweep; the depth of each queue, asked of the broker as the sweep's queue
watcher asks it; when each queue was last found empty; and the take-overs
of the last hour, noted by ``take_over`` (``fleet_store.TakeOverNote``).

Workers serve every namespace, so the list of workers is the whole fleet's;
the runs a worker holds are named only when they belong to the namespace
asked about, and the others are counted, never named: what a client of one
namespace may see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from celery_durable.broker import now_ms
from celery_durable.broker.fleet_store import TAKE_OVER_WINDOW_MS, TakeOverNote
from celery_durable.client.fleet_registry import MixedDeploy, mixed_deploys, read_workers
from celery_durable.workflows.envelope import from_ms

if TYPE_CHECKING:
    from celery_durable.client.client import Client

TAKE_OVERS_SHOWN = 50


@dataclass(frozen=True, slots=True)
class WorkerRow:
    name: str
    """``<hostname>/<pid>``: one row per worker process that runs the sweep."""
    last_beat: datetime
    alive: bool
    """It beat within a lease; a silent one is buried by the next sweep (its messages counted lost)."""
    held: int
    """Messages of durable tasks it held at its last beat (received, waiting for a countdown, or running)."""
    runs: list[str]
    """The runs of this namespace those messages belong to."""
    elsewhere: int
    """Messages of runs of other namespaces (or of runs gone since)."""
    queues: list[str] = field(default_factory=list)
    """The queues it consumes, as it reported them with its beat (``fleet_registry``)."""
    workflows: dict[str, str] = field(default_factory=dict)
    """The workflows it serves, each to its code hash."""


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    role: str
    """``coordinator``, ``steps`` or ``agents``."""
    depth: int | None
    """Messages waiting to be received; None when the broker did not answer."""
    empty_at: datetime | None
    """When a sweep last found it empty (None: not since its record began)."""


@dataclass(frozen=True, slots=True)
class TakeOverRow:
    run_id: str
    at: datetime
    outcome: str
    cause: str
    epoch: int | None

    @classmethod
    def of(cls, note: TakeOverNote) -> TakeOverRow:
        return cls(note.run_id, from_ms(note.at_ms) or datetime.now(UTC), note.outcome, note.cause, note.epoch)


@dataclass(frozen=True, slots=True)
class FleetStatus:
    namespace: str
    read_at: datetime
    workers: list[WorkerRow]
    queues: list[QueueRow]
    queues_checked_at: datetime | None
    """When a sweep last looked at the queues: None when no worker ever did."""
    broker_error: str | None
    take_overs_total: int
    """Runs of the namespace taken over in the last ``window_minutes``."""
    take_overs: list[TakeOverRow] = field(default_factory=list)
    """The newest of them, at most ``TAKE_OVERS_SHOWN``."""
    mixed: list[MixedDeploy] = field(default_factory=list)
    """Workflows live workers serve with different code hashes (a mixed deploy)."""
    window_minutes: int = TAKE_OVER_WINDOW_MS // 60_000

    @property
    def alive(self) -> int:
        return sum(worker.alive for worker in self.workers)


def read_fleet(client: Client) -> FleetStatus:
    """What the fleet serving ``client``'s namespace is doing now (blocking: Redis and the broker)."""
    from celery_durable.tasks.queue_depths import BrokerQueues

    engine, namespace = client.engine, client.namespace
    store, settings = engine.store, engine.settings
    now = now_ms()  # the wall clock, as workers beat by it
    beats = store.fleet_workers()
    held = store.held_messages(sorted(beats))
    registry = {worker.name: worker for worker in read_workers(store)}
    owned = _runs_of(client, {run_id for messages in held.values() for run_id in messages.values()})
    lease_ms = int(settings.lease_seconds * 1000)
    workers = []
    for name in sorted(beats):
        messages = held.get(name, {})
        mine = sorted({run_id for run_id in messages.values() if run_id in owned})
        workers.append(
            WorkerRow(
                name=name,
                last_beat=from_ms(beats[name]) or datetime.now(UTC),
                alive=now - beats[name] <= lease_ms,
                held=len(messages),
                runs=mine,
                elsewhere=sum(run_id not in owned for run_id in messages.values()),
                queues=registry[name].queues if name in registry else [],
                workflows=registry[name].workflows if name in registry else {},
            )
        )
    broker_error = None
    queues = BrokerQueues(engine)
    try:
        depths: dict[str, int | None] = dict(queues.depths())
    except Exception as exc:  # kombu and amqp connection errors have no common base
        broker_error = f"{type(exc).__name__}: {exc}"
        depths = {}
    finally:
        queues.close()
    seen, checked = store.queues_seen_empty()
    roles = {"coordinator": settings.coordinator_queue, "steps": settings.steps_queue, "agents": settings.agents_queue}
    total, notes = store.take_overs_since(namespace, now - TAKE_OVER_WINDOW_MS, TAKE_OVERS_SHOWN)
    return FleetStatus(
        namespace=namespace,
        read_at=from_ms(now) or datetime.now(UTC),
        workers=workers,
        queues=[QueueRow(queue, role, depths.get(queue), from_ms(seen.get(queue))) for role, queue in roles.items()],
        queues_checked_at=from_ms(checked),
        broker_error=broker_error,
        take_overs_total=total,
        take_overs=[TakeOverRow.of(note) for note in notes],
        mixed=mixed_deploys(list(registry.values())),
    )


def _runs_of(client: Client, run_ids: set[str]) -> set[str]:
    """Those of ``run_ids`` that are runs of the client's namespace."""
    if not run_ids:
        return set()
    records, _ = client.engine.store.load_runs(sorted(run_ids))
    return {record.run_id for record in records if record.namespace == client.namespace}
