"""Throttles on the fleet (SPEC §5e): a run's own slot, ops' slots, giving
them back, and telling a run its slot came.

A throttle's state is in its slot, a run's in its own, and no script spans
both. So every path writes what it may leave behind first, where whoever
comes next finds it:

- an op's intent is written in its run (``throttle_enter``) before its slot
  is asked for; a settle, a pause, a take-over read the intents and give
  back what the old attempt held or waited for (``give_back``, run by the
  store after each of those scripts: ``Engine``);
- a slot freed is given to the next waiter in the same script
  (``throttle_release``), and the waiter's run is told by one more
  (``throttle_granted``: it marks the grant, and wakes the owner waiting, a
  wake counted with its look first and sent by ``Engine.deliver``);
- asking for a slot schedules the throttle's look by the sweep a lease
  later, first (``ThrottleStore.throttle_acquire``); the look (``sweep``)
  gives back what belongs to runs settled, gone or of another attempt, tells
  again the grants a dead caller did not, admits what a rate lets go by now,
  and looks again while anyone holds or waits. So a process that dies
  between two of these scripts delays a waiter by a lease at most, and
  never leaks a slot.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING

from celery_durable.broker import RunRecord
from celery_durable.broker.replies.throttles import Admission, Admitted, GrantVerdict
from celery_durable.broker.throttle_store import RunHolds, split_member
from celery_durable.errors import DurableError, StaleAttemptError, StorageCorruptError, ThrottleNotFoundError
from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.wakes import Wake
from celery_durable.throttles import RUN_SLOT, StartSlot, holder_id, split_holder

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

TELL_ROUNDS = 16
"""Runs found gone give their slots back, which admits others: at most this
many rounds in one call (the sweep finishes what is left)."""
SWEEP_BATCH = 64


def after_admission(engine: Engine, namespace: str, name: str, admitted: Admitted) -> None:
    """Tell the runs a throttle script admitted, and have the sweep look at
    the throttle when a rate lets the next one go."""
    granted = admitted.granted
    wakes: list[Wake] = []
    for _ in range(TELL_ROUNDS):
        if not granted:
            break
        gone: list[tuple[str, str]] = []
        for holder, epoch in granted:
            wake = _tell(engine, holder, epoch)
            if wake is None:
                gone.append((holder, f"={epoch}"))
            elif isinstance(wake, Wake):
                wakes.append(wake)
        granted = []
        if gone:
            again = engine.store.throttle_release(namespace, name, gone)
            granted = again.granted
            if again.next_due is not None:
                engine.store.look_at_throttle(namespace, name, again.next_due)
    if admitted.next_due is not None:
        engine.store.look_at_throttle(namespace, name, admitted.next_due)
    engine.deliver(wakes)
    _observe(engine, name, "granted", len(admitted.granted))


def _tell(engine: Engine, holder: str, epoch: int) -> Wake | bool | None:
    """Tell one run its holder has a slot: its wake, True (marked, nothing
    to wake), or None: the run, attempt or intent is gone."""
    run_id, op = split_holder(holder)
    prefix = new_task_id()
    try:
        told = engine.store.throttle_granted(run_id, op, epoch, prefix)
    except StorageCorruptError:
        return None
    if told.verdict is GrantVerdict.GONE:
        return None
    if told.verdict is GrantVerdict.WOKEN:
        return Wake(run_id, epoch, told.workflow, told.owner, f"{prefix}-1")
    return True


class EngineThrottles:
    """An execution's ``ThrottlePort`` (``workflows/throttles.py``) on the fleet."""

    def __init__(self, engine: Engine, record: RunRecord) -> None:
        self._engine = engine
        self._record = record

    def enter(self, epoch: int, op: str, name: str, key: str) -> bool:
        return self._engine.store.throttle_enter(self._record.run_id, epoch, op, name, key)

    def acquire(self, epoch: int, op: str, name: str, key: str) -> str:
        r = self._record
        admitted = self._engine.store.throttle_acquire(
            r.namespace, name, holder_id(r.run_id, op), epoch, key, r.priority
        )
        if admitted.verdict is not Admission.UNKNOWN:
            after_admission(self._engine, r.namespace, name, admitted)
        _observe(self._engine, name, "waited" if admitted.verdict is Admission.QUEUED else "immediate", 1)
        return str(admitted.verdict)

    def wait(self, epoch: int, op: str, owner: str, name: str) -> bool:
        return self._engine.store.throttle_wait(self._record.run_id, epoch, op, owner, name)

    def done(self, epoch: int, op: str, name: str) -> None:
        op_done(self._engine, self._record.run_id, self._record.namespace, epoch, op, name)


def op_done(engine: Engine, run_id: str, namespace: str | None, epoch: int, op: str, name: str | None = None) -> None:
    """Op's outcome is journaled: its slot goes back and its intent is
    forgotten. ``name`` None: read from the intent, as the namespace (a
    call's, an agent turn's or a child's answer, journaled by a task that
    does not know whether the op was throttled)."""
    store = engine.store
    holds = store.throttle_holds(run_id) if name is None or namespace is None else None
    intent = holds.intents.get(op) if holds is not None else None
    if holds is not None:
        namespace = holds.namespace
    if name is None:
        if intent is None:
            return
        name = intent.split("|", 3)[2]
    assert namespace is not None
    admitted = store.throttle_release(namespace, name, [(holder_id(run_id, op), f"={epoch}")])
    if admitted.verdict is not Admission.UNKNOWN:
        after_admission(engine, namespace, name, admitted)
    if intent is None:
        intent = store.throttle_holds(run_id).intents.get(op)
    if intent is not None and intent.startswith(f"{epoch}|"):
        store.throttle_forget(run_id, {op: intent})


def answered(engine: Engine, run_id: str, epoch: int, op: str) -> None:
    """``op_done`` for an answer a task journaled, never failing that task:
    a slot not given back here is given back by the settle, or the sweep."""
    try:
        op_done(engine, run_id, None, epoch, op)
    except DurableError as exc:
        logger.warning("run %s: the slot of %s was not given back yet: %s", run_id, op, exc)


def take_run_slot(engine: Engine, record: RunRecord, token: str) -> bool:
    """Before a pass of an attempt not yet given its run's slot: take it
    (True: the pass goes on), or leave the run waiting for it, its message
    ended (False). A throttle deleted meanwhile lets the run go unthrottled."""
    store = engine.store
    assert record.throttle is not None
    name = record.throttle
    holder = holder_id(record.run_id, RUN_SLOT)
    admitted = store.throttle_acquire(
        record.namespace, name, holder, record.epoch, record.throttle_key or "", record.priority
    )
    if admitted.verdict is not Admission.UNKNOWN:
        after_admission(engine, record.namespace, name, admitted)
    try:
        if admitted.verdict is Admission.QUEUED:
            _observe(engine, name, "waited", 1)
            if not store.throttle_wait(record.run_id, record.epoch, RUN_SLOT, "m", name, token):
                return False
        else:
            _observe(engine, name, "immediate", 1)
        told = _tell(engine, holder, record.epoch)
    except StaleAttemptError:
        return False
    if isinstance(told, Wake):
        engine.deliver([told])  # a wait written meanwhile counted a message: it finds the pass done
    return told is not None


def give_back(engine: Engine, run_id: str) -> None:
    """After a run settled, paused, halted, was cancelled or taken over:
    give back every slot and place its old attempts (or, settled, any
    attempt) held or waited for, and forget their intents."""
    store = engine.store
    holds = store.throttle_holds(run_id)
    if holds.status is None:
        return
    by_throttle, forget = _what_to_give_back(run_id, holds)
    for name, pairs in by_throttle.items():
        admitted = store.throttle_release(holds.namespace, name, pairs)
        if admitted.verdict is not Admission.UNKNOWN:
            after_admission(engine, holds.namespace, name, admitted)
    store.throttle_forget(run_id, forget)


def _what_to_give_back(run_id: str, holds: RunHolds) -> tuple[dict[str, list[tuple[str, str]]], dict[str, str]]:
    live = holds.status in ("pending", "running")
    by_throttle: dict[str, list[tuple[str, str]]] = defaultdict(list)
    forget: dict[str, str] = {}
    if holds.throttle is not None:
        by_throttle[holds.throttle].append((holder_id(run_id, RUN_SLOT), f"!{holds.epoch}" if live else ""))
    for op, intent in holds.intents.items():
        epoch, _, name, _ = intent.split("|", 3)
        if live and int(epoch) == holds.epoch:
            continue
        by_throttle[name].append((holder_id(run_id, op), f"={epoch}"))
        forget[op] = intent
    return by_throttle, forget


def give_back_quietly(engine: Engine, run_id: str) -> None:
    """``give_back`` for the store's hook: a settle stands whatever happens
    here; what is not given back now, the sweep's look at the throttle does."""
    try:
        give_back(engine, run_id)
    except DurableError as exc:
        logger.warning("run %s: throttle slots not given back yet (the sweep will): %s", run_id, exc)


# -- the sweep's look at a throttle -------------------------------------------


def sweep(engine: Engine) -> int | None:
    """Look at the throttles due; when the next is due (ms), else None."""
    store = engine.store
    due = store.claim_throttles(SWEEP_BATCH, engine.store.lease_ms)
    looks: dict[str, int | None] = {}
    for member in due.runs:
        namespace, name = split_member(member)
        try:
            looks[member] = examine(engine, namespace, name)
        except DurableError as exc:
            logger.warning("throttle %s/%s: its look failed, again in a lease: %s", namespace, name, exc)
            looks[member] = store.now_ms() + store.lease_ms
    store.throttles_looked(due.claim, looks)
    return due.next_due


def examine(engine: Engine, namespace: str, name: str) -> int | None:
    """One look at a throttle: give back what belongs to no live attempt,
    tell again grants not heard of, admit what may go now. The next look's
    time, or None when nobody holds or waits."""
    store = engine.store
    state = store.throttle_read(namespace, name, detail=True)
    if state is None:
        return None
    now, lease = store.now_ms(), store.lease_ms
    entries = [(h, raw, False) for h, raw in state.holders.items()] + [
        (h, raw, True) for h, raw in state.waiters.items()
    ]
    facts = store.runs_holding([split_holder(h) for h, _, _ in entries])
    stale: list[tuple[str, str]] = []
    retell: list[tuple[str, int]] = []
    for (holder, raw, waiting), (holds, waits) in zip(entries, facts, strict=True):
        epoch, since = int(raw.split("|")[0]), int(raw.split("|")[1])
        if _belongs(holder, epoch, holds, young=now - since < lease):
            if not waiting and waits:
                retell.append((holder, epoch))
        else:
            stale.append((holder, f"={epoch}"))
    admitted = store.throttle_release(namespace, name, stale)
    if admitted.verdict is Admission.UNKNOWN:
        return None
    after_admission(engine, namespace, name, Admitted(admitted.verdict, admitted.granted + retell, admitted.next_due))
    if stale:
        _observe(engine, name, "given_back", len(stale))
    after = store.throttle_read(namespace, name)
    if after is None or (after.holding == 0 and after.waiting == 0):
        return None
    look = now + lease
    return min(look, admitted.next_due) if admitted.next_due is not None else look


def _belongs(holder: str, epoch: int, holds: RunHolds, *, young: bool) -> bool:
    """Whether a slot or place still belongs to a live attempt of its run.
    A young one of a run not written yet (a start asks before it creates)
    is given the benefit of the doubt."""
    if holds.status is None:
        return young
    if holds.status not in ("pending", "running") or holds.epoch != epoch:
        return False
    _, op = split_holder(holder)
    if op == RUN_SLOT:
        return holds.throttle is not None
    intent = holds.intents.get(op)
    return (intent is not None and intent.startswith(f"{epoch}|")) or young


def _observe(engine: Engine, name: str, outcome: str, n: int) -> None:
    from celery_durable import telemetry

    if n and (watching := telemetry.observer) is not None:
        watching.throttle_waits(name, outcome, n)


def start_slot(engine: Engine, namespace: str, run_id: str, slot: StartSlot) -> dict[str, str]:
    """Ask for a new run's slot before the run is written (a start that dies
    between leaves a holder of no run, which the throttle's look gives back);
    the run hash's throttle fields. An unknown throttle raises
    ``ThrottleNotFoundError`` and nothing is written."""
    admitted = engine.store.throttle_acquire(
        namespace, slot.name, holder_id(run_id, RUN_SLOT), 1, slot.key, slot.priority
    )
    if admitted.verdict is Admission.UNKNOWN:
        raise ThrottleNotFoundError(f"No throttle named {slot.name!r} in namespace {namespace!r}")
    after_admission(engine, namespace, slot.name, admitted)
    granted = admitted.verdict in (Admission.GRANTED, Admission.HELD)
    _observe(engine, slot.name, "immediate" if granted else "waited", 1)
    return slot.fields(granted)


def drop_start(engine: Engine, namespace: str, run_id: str, slot: StartSlot) -> None:
    """A start that lost its idempotency race: its run's slot or place goes back."""
    try:
        admitted = engine.store.throttle_release(namespace, slot.name, [(holder_id(run_id, RUN_SLOT), "")])
        if admitted.verdict is not Admission.UNKNOWN:
            after_admission(engine, namespace, slot.name, admitted)
    except DurableError as exc:
        logger.warning("run %s: its throttle slot was not given back yet (the sweep will): %s", run_id, exc)
