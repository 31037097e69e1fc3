"""The recovery sweep: every worker looks for runs whose attempt died.

A run is alive while its work is in flight: each Celery message of its
attempt is an entry in the run's live hash, queued or running, and running
ones are renewed by their task's heartbeat (liveness in ``_prelude.lua``).
The sweep looks at each run when it falls due in the ``{sweep}:due`` index
(``claim_due.lua`` hands every due run to one sweeper, so a fleet sweeping
together costs Redis what one sweeper does). A run is dead when a running
message's heartbeat stopped, when a queued message left its queue (the
broker was found holding nothing in it) and never started, or when nothing
of it is in flight and it waits for nothing. A backlog is never death: a
message that waits in a queue stays alive however long it waits. A dead run
is taken over with a new attempt (epoch + 1, ``resume.lua`` in recovery
mode, a compare-and-set that re-checks the death in the same script, so of
several sweepers exactly one wins); with ``auto_recover`` off it is halted,
and a run whose only fault is a coordinator message lost before it started
is no dead run: its main body is woken again at the same epoch.

Every sweep asks the broker how many messages wait in each of the engine's
queues (a passive declare, which both Redis and RabbitMQ answer) and
records when it found one empty: that is how a queued message is known to
have left its queue.

A store that stops answering is not the fleet's silence: no heartbeat could
land meanwhile. After this sweeper saw Redis fail, it takes nothing over
until Redis has answered for a whole lease, time enough for every live task
to renew its message.

It runs in a thread of every worker, started by a worker bootstep of the
engine's Celery app, so it works however the worker was started (the CLI,
plain ``celery -A``, or ``start_worker`` in tests).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from celery import bootsteps
from celery.signals import task_received

from celery_durable import telemetry
from celery_durable.broker import RunRecord, now_ms
from celery_durable.broker.fleet_store import TakeOverNote
from celery_durable.broker.replies.fleet import Examined, Liveness
from celery_durable.broker.run_control import Stop
from celery_durable.broker.schema import MAIN
from celery_durable.errors import StorageCorruptError, StorageError
from celery_durable.schedules.firing import fire_due
from celery_durable.tasks import flower_names, throttling
from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.children import settled_child, tell_parent
from celery_durable.tasks.queue_depths import BrokerQueues
from celery_durable.tasks.redelivery import give_back
from celery_durable.tasks.wakes import Wake, woken
from celery_durable.tasks.worker_beat import WorkerBeat
from celery_durable.workflows import jsonvalue

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

BATCH = 200
CLAIM_MS = 15_000
"""How long a claimed run is this sweeper's alone; it is rescheduled for real long before."""
MIN_SLEEP = 0.02

PRUNE_SECONDS = 5.0
"""How often a sweeper takes the runs whose retention ran out out of their indexes."""

EmptyQueues = Callable[[], Sequence[str]]
"""Which of the engine's queues the broker holds no message in, now."""


class RecoverySweep:
    """Takes dead runs over (or halts them) and reports this worker's free queues."""

    def __init__(
        self,
        engine: Engine,
        worker_running: Callable[[], bool] = lambda: True,
        empty_queues: EmptyQueues | None = None,
        worker_id: str = "",
        queues: Callable[[], Collection[str]] = lambda: (),
    ) -> None:
        self.engine = engine
        self._worker_running = worker_running
        self._broker_queues: BrokerQueues | None = None
        if empty_queues is None:
            self._broker_queues = empty_queues = BrokerQueues(engine)
        self._empty_queues = empty_queues
        self._stop = threading.Event()
        self.beats = WorkerBeat(engine, worker_id, queues, self.interval, self._stop, self._turn) if worker_id else None
        """This worker's beats (``<hostname>/<pid>``); None for a sweep without a worker."""
        self._thread: threading.Thread | None = None
        self._random = random.Random()  # never the global one: user code may seed or rely on it
        self._healthy_since = float("-inf")
        """When Redis last started answering after a failure (monotonic); -inf: never failed."""
        self._last_pass = time.monotonic()
        self._next_prune = 0.0

    @property
    def interval(self) -> float:
        """The longest a sweeper sleeps: timers fire within about this much of their due time."""
        return min(self.engine.settings.lease_seconds / 4, 0.5)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="celery-durable-recovery", daemon=True)
        self._thread.start()
        if self.beats is not None:
            self.beats.start()
        # Apart, so that a broker that does not answer never holds up the
        # worker's beat or the sweep: it only stops the empty reports.
        threading.Thread(target=self._watch_queues, name="celery-durable-queues", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.beats is not None:
            self.beats.stop()

    def _loop(self) -> None:
        pause = self.interval * self._random.uniform(0.0, 1.0)  # spreads a fleet that started together
        while not self._stop.wait(pause):
            if not self._worker_running():
                return  # a worker that stopped without stopping its steps
            pause = self.interval
            self._held_up_since(self._last_pass)
            try:
                next_due = self.sweep_once()
                self._store_answered()
            except StorageError as exc:
                self._store_failed(exc)
                continue
            except Exception:
                logger.exception("recovery sweep failed")
                continue
            finally:
                self._last_pass = time.monotonic()
            if next_due is not None:
                wait = (next_due - now_ms()) / 1000
                pause = min(self.interval, max(MIN_SLEEP, wait)) * self._random.uniform(0.9, 1.0)

    @property
    def _stall_after(self) -> float:
        """A pass that comes this much later than the last one ended means something held the sweeper up."""
        return 2 * self.interval + self.engine.settings.redis_timeout_seconds + 1.0

    def _held_up_since(self, since: float) -> None:
        """Something held this sweeper up since ``since`` (a stalled store or
        broker blocked it): then it held up the heartbeats it judges by too,
        and the grace of a lease starts now."""
        now = time.monotonic()
        if now - since > self._stall_after:
            self._healthy_since = now

    def _store_failed(self, exc: Exception) -> None:
        self._healthy_since = float("inf")
        logger.warning("recovery sweep skipped: %s", exc)

    def _store_answered(self) -> None:
        if self._healthy_since == float("inf"):
            self._healthy_since = time.monotonic()

    def _may_take_over(self) -> bool:
        """Not within a lease of Redis coming back: heartbeats had no way to land."""
        return time.monotonic() - self._healthy_since >= self.engine.settings.lease_seconds

    def _turn(self, act: Callable[[], object], failed: str) -> bool:
        """A turn of a loop that lives as long as the worker (False: it stopped
        without stopping this); a store that fails is logged and tried next turn."""
        if not self._worker_running():
            return False
        try:
            act()
        except StorageError as exc:
            logger.warning(failed, exc)
        return True

    def bury_dead_workers(self) -> None:
        """Messages a dead worker had received but not started died with it;
        the calls' answers it held are given back first, as nothing else would
        find them before the broker's visibility timeout."""
        store = self.engine.store
        silent_since = now_ms() - int(self.engine.settings.lease_seconds * 1000)
        dead = store.claim_dead_workers(silent_since)
        for worker, held in dead.items():  # all before any mark_lost, which may fail for the rest
            self._give_back(worker, held.answers)
        for worker, held in dead.items():
            lost = {run_id: store.mark_lost(run_id, task_ids) for run_id, task_ids in held.runs.items()}
            for run_id, marked in lost.items():
                if marked:
                    store.schedule_check(run_id, 0)
            logger.warning("worker %s stopped beating; %d of its messages were lost", worker, sum(lost.values()))

    def _give_back(self, worker: str, answers: Sequence[str]) -> None:
        try:
            given = give_back(self.engine, answers)
        except Exception:  # kombu and amqp connection errors have no common base
            # Claimed, so no other sweep gives them back: the transport's
            # own restore does, once its visibility timeout has passed.
            logger.exception("worker %s: %d call answer(s) it held not given back", worker, len(answers))
            return
        if given:
            logger.warning("worker %s held %d call answer(s): given back to their queue", worker, given)

    def _watch_queues(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                if not self._turn(self.report_empty_queues, "could not record which queues are empty: %s"):
                    return
        finally:
            if self._broker_queues is not None:
                self._broker_queues.close()

    def report_empty_queues(self) -> None:
        at = now_ms()
        try:
            queues = self._empty_queues()
        except Exception as exc:  # kombu and amqp connection errors have no common base
            logger.warning("recovery sweep could not ask the broker for its queues: %s", exc)
            return
        self.engine.store.report_empty(queues, at)

    def sweep_once(self) -> int | None:
        """One look at every run that is due, and at every schedule whose tick
        is; returns when the next one falls due."""
        next_tick = self.fire_schedules()
        next_run = self._sweep_runs()
        return min((at for at in (next_tick, next_run) if at is not None), default=None)

    def fire_schedules(self) -> int | None:
        """Fire the schedules' due ticks (``schedules/firing.py``): any worker
        alive does, each tick once. A failure here never stops recovery."""
        try:
            return fire_due(self.engine)
        except StorageError:
            raise
        except Exception:
            logger.exception("firing schedules failed")
            return None

    def _sweep_runs(self) -> int | None:
        store = self.engine.store
        if self._may_take_over():
            self.bury_dead_workers()
        now, begun = now_ms(), time.monotonic()
        self._prune(now)
        # Throttles due: a rate's next admission fires like a timer (tasks/throttling.py).
        throttles = throttling.sweep(self.engine)
        due = store.claim_due(now, BATCH, CLAIM_MS)
        if not due.runs:
            return _sooner(due.next_due, throttles)
        self._look(due.runs, due.claim, store.queue_room(), now)
        telemetry.sweep_pass(len(due.runs), time.monotonic() - begun)
        return now if len(due.runs) == BATCH else _sooner(due.next_due, throttles)

    def _prune(self, now: int) -> None:
        """Every ``PRUNE_SECONDS``: runs whose retention ran out leave their
        namespace's index, whether or not a listing ever meets them."""
        if time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + PRUNE_SECONDS
        self.engine.store.prune_expired(now, BATCH)

    def _look(self, run_ids: Sequence[str], claim: str, room: str, now: int) -> None:
        """Look at the runs claimed, all at once: a timer burst costs a few
        round trips a batch, not a few a run. Their scripts run in one
        pipeline (``examine_each``: each fires its run's due timers, fenced
        and counted in flight as any wake), their next looks are written in
        one, and the wakes are published together, after the looks are
        written: a woken pass that settles its run is not put back in the
        sweep's schedule by a look written after it. Should this process die
        between the scripts and the publish, the wakes it counted and never
        sent leave their queue found empty, and their runs are taken over
        (liveness): the new attempt's replay finds the timer due, so no timer
        is lost, and none fires twice (it left its run's waits in the script
        that fired it). Dead runs are then taken over one by one."""
        store = self.engine.store
        prefixes = [new_task_id() for _ in run_ids]
        looks: dict[str, int] = {}
        done: list[str] = []
        wakes: list[Wake] = []
        dead: list[tuple[str, Examined]] = []
        # Automatic recovery off: a coordinator message lost before it started
        # is sent again at the same epoch (among the woken), not a halt.
        examined_each = store.examine_each(run_ids, room, prefixes, resend=not self.engine.settings.auto_recover)
        for run_id, prefix, examined in zip(run_ids, prefixes, examined_each, strict=True):
            if isinstance(examined, StorageCorruptError):
                # One damaged run must not stop the recovery of every other:
                # look at it again a lease later, once someone may have repaired it.
                logger.error("recovery of run %s skipped, its record is corrupt: %s", run_id, examined)
                looks[run_id] = now + int(self.engine.settings.lease_seconds * 1000)
                continue
            telemetry.sweep_found(examined)
            if examined is None or examined.verdict is Liveness.SETTLED:
                if examined is not None:
                    settled_child(self.engine, run_id)  # a child whose parent may not know yet
                done.append(run_id)  # gone, or settled: nothing to watch
                continue
            wakes += woken(run_id, examined.epoch, examined.workflow, examined.woken, prefix)  # timers due
            if examined.verdict is Liveness.DEAD:
                dead.append((run_id, examined))
            elif examined.next_check is None:
                done.append(run_id)  # waits for a signal: its sender asks a look first (store_core.LOOK_FIRST)
            else:
                looks[run_id] = examined.next_check
        store.looked(claim, looks, done)
        self.engine.deliver(wakes)
        for run_id, examined in dead:
            self._dead(run_id, examined)

    def _dead(self, run_id: str, examined: Examined) -> None:
        store = self.engine.store
        if not self._may_take_over():
            store.schedule_check(run_id, now_ms() + int(self.engine.settings.lease_seconds * 1000))
            return
        record = store.load_run(run_id)
        if record is None or record.epoch != examined.epoch:
            return
        take_over(self.engine, record, examined.detail)


def _sooner(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def take_over(engine: Engine, record: RunRecord, cause: str, *, forced: bool = False) -> None:
    """The run's attempt died (``cause`` says how): a new attempt takes it over
    (epoch + 1, a system record, its first coordinator message sent), or,
    with auto_recover off, it is halted; one whose passes die every time
    (``max_recoveries`` take-overs in a row, nothing new journaled between) ends
    ``error``/``recovery_limit``. ``forced``: a message of the attempt came back
    from a holder that died, as RabbitMQ gives a dead worker's messages back
    at once; the death is known, not judged by liveness (``tasks/redelivery.py``).
    Both checks are made again in the script, so of several sweepers (or a
    sweeper and a redelivery) one acts."""
    store, settings, run_id = engine.store, engine.settings, record.run_id
    taking = telemetry.take_over(record, cause, forced=forced)
    if not settings.auto_recover:
        if not store.halt(record, forced=forced):
            taking.end("lost")  # the run changed meanwhile: nothing done, as a resume that loses
            return
        taking.end("halted")
        _note(engine, record, "halted", cause, None)
        logger.warning("run %s: its attempt died (%s); halted (auto_recover is off)", run_id, cause)
        return
    if record.recoveries >= settings.max_recoveries:
        error = (
            f"Taken over {record.recoveries} times in a row with nothing new journaled between: its passes die "
            f"every time (the last: {cause}); fix the cause and resume it"
        )
        stop = Stop("error", "recovery_limit", error, f"Run stopped: {error}", recoveries=settings.max_recoveries)
        if not store.halt(record, stop, forced=forced):
            taking.end("lost")
            return
        taking.end("recovery_limit")
        _note(engine, record, "recovery_limit", cause, None)
        logger.warning("run %s of workflow %r ended error (recovery_limit): %s", run_id, record.workflow, error)
        tell_parent(engine, record, stop.status, stop.reason, stop.error, None)
        return
    message = new_task_id()
    epoch = store.resume(
        record,
        limits_json=jsonvalue.dumps(record.limits),
        message=f"Run recovered after its attempt died ({cause})",
        code_hash="",
        message_id=message,
        recovery=True,
        forced=forced,
        trace_attempt=taking.traceparent,
    )
    taking.end("recovered" if epoch is not None else "lost", epoch)
    if epoch is None:
        return
    _note(engine, record, "recovered", cause, epoch)
    logger.warning("run %s: attempt died (%s); recovering as epoch %s", run_id, cause, epoch)
    engine.deliver([Wake(run_id, epoch, record.workflow, MAIN, message, namespace=record.namespace)])


def _note(engine: Engine, record: RunRecord, outcome: str, cause: str, epoch: int | None) -> None:
    """Keep the take-over for the fleet page; it happened whether or not this write lands."""
    note = TakeOverNote(record.run_id, outcome, cause[:500], epoch, now_ms())
    try:
        engine.store.note_take_over(record.namespace, note)
    except StorageError as exc:
        logger.warning("run %s: the take-over could not be noted for the fleet page: %s", record.run_id, exc)


def install(engine: Engine) -> None:
    """Run a recovery sweep in every worker of ``engine``'s Celery app."""

    class RecoveryStep(bootsteps.StartStopStep):  # type: ignore[misc]
        """Starts the sweep with the worker and stops it at shutdown."""

        def __init__(self, worker: Any, **kwargs: Any) -> None:
            super().__init__(worker, **kwargs)
            # Celery skips the steps' stop() when a worker is stopped before
            # its blueprint counts as fully started, as test workers are.
            self.sweep = RecoverySweep(
                engine,
                lambda: worker.blueprint.state == bootsteps.RUN,
                worker_id=f"{worker.hostname}/{os.getpid()}",
                queues=lambda: list(worker.app.amqp.queues.consume_from or ()),
            )
            flower_names.follow_worker(worker)

        def start(self, worker: Any) -> None:
            task_received.connect(self._received, weak=False)
            self.sweep.start()

        def _received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
            if getattr(sender, "app", None) is engine.celery and self.sweep.beats is not None:
                self.sweep.beats.received(request)

        def stop(self, worker: Any) -> None:
            self.shutdown(worker)

        def shutdown(self, worker: Any) -> None:
            task_received.disconnect(self._received)
            self.sweep.stop()
            engine.parked.clear()  # bodies kept at a call unwind: their finally blocks run
            engine.kept_fanouts.clear()

    engine.celery.steps["worker"].add(RecoveryStep)
