"""Every Redis key and channel celery-durable uses, built in this one place.

Layout (``P`` is ``settings.key_prefix``, ``R`` a run id, ``N`` a namespace)::

    P:{R}:run        hash    the run record: status, epoch (the fencing token),
                             args, limits, result, snapshot counters, the
                             activation lock (lock, lock_until, wake) and the
                             attempt's lease (lease_until)
    P:{R}:journal    hash    the journal of the run (fields: schema.py)
    P:{R}:progress   stream  progress records, entry id "<seq>-0"; seq is dense
                             per run, and the run's next_seq is its revision
    P:{R}:progress:phases
                     zset    the phase index of the progress records: one
                             member "<phase_id>|<seq, 15 digits>" per record
                             of a phase, all scored 0, so a lexicographic
                             range is one phase's records in seq order and a
                             phase pages in O(log n + page)
    P:{R}:steps      hash    rows of settled steps, JSON (schema.StepRow):
                             completed, failed or interrupted
    P:{R}:running    hash    rows of steps running now, same format; kept
                             apart so ending an attempt touches only these
    P:{R}:agents     hash    agent rows by "<agent id>@<epoch>", JSON
                             (schema.parse_agent_row)
    P:{R}:live       hash    the attempt's Celery messages in flight, by task
                             id: queued or running (liveness in _prelude.lua)
    P:{R}:waits      hash    what the run's sequences wait for outside the
                             fleet (timers, signals, tasks), by "<seq>:<i>"
    P:{R}:signals    hash    signals sent to the run, per name, in order
    P:{R}:children   hash    the run's child runs by key (ctx.child,
                             ctx.start_child): run id, workflow, how they
                             are waited for (schema.CHILD_FIELDS)
    P:{R}:history    stream  the run's event history, entry id "<n>-0": n
                             is the event's seq, given by the run hash's
                             'events' counter in the script that made the
                             event (record_event in _prelude.lua; entry
                             fields: schema.history), so a page is one
                             XRANGE by number
    P:{R}:archive    string  a run settled completed or cancelled, once
                             archived (archive_run.lua): its history, steps,
                             progress and journal as one compressed document
                             (schema/archive.py), those keys (and the phase
                             index) deleted; kept as long as the run hash

    P:{ns:N}:runs    zset    run ids of namespace N, scored by start order
    P:{ns:N}:counter string  the start-order counter
    P:{ns:N}:ix      zset    the namespace's indexes, in one lexicographic
                             zset (all scored 0; member formats: indexes.py):
                             per run "t|<ord>|R" (every run), "s|<status>|
                             <ord>|R", "w|<workflow>|<ord>|R", "sw|<status>|
                             <workflow>|<ord>|R", "i|R" (by id), and while it
                             waits "a|<ord>|R" and "n|<wait name>|<ord>|R";
                             <ord> is "<created ms, 13 digits><start counter,
                             15 digits>", so a filter's runs are one range
    P:{ns:N}:ixstate hash    run id -> what the index holds of it, with the
                             run's 'ixv' version it was written from
                             (index_state_parse in _prelude.lua)
    P:{ns:N}:ixintent hash   run id -> "<count>|<ms>": writes under way that
                             may change its entries (Redis Cluster only,
                             run_index.py)
    P:{ns:N}:ixmeta  hash    'built' = '1' once the index covers every run
                             of the namespace (born so, or `runs reindex`)
    P:{ns:N}:idem:K  string  run id started with idempotency key K
    P:{ns:N}:events  channel pub/sub: a run of N changed ("<run_id> <what>",
                             what: created, status, progress or cancel)

    P:{throttle:N:T}:conf     hash  throttle T of namespace N: its settings
                             (concurrency, rate_n, rate_ms, pk_concurrency,
                             pk_rate_n, pk_rate_ms), created_at, updated_at,
                             seq (the waiters' arrival counter)
    P:{throttle:N:T}:holders  hash  holder "<run id>|<op>" -> "<epoch>|<since
                             ms>|<key>": the slots held now ("run" is a run's
                             own slot, else the op's identity)
    P:{throttle:N:T}:waiters  hash  holder -> "<epoch>|<since>|<rank>|<key>":
                             who waits; <rank> is "<10^9 - priority, 10
                             digits><seq, 15 digits>", so text order is
                             priority first, then first come first served
    P:{throttle:N:T}:queue    zset  every waiter, scored 0, "<key>\0<rank>|
                             <holder>": one key's waiters are one range of text
    P:{throttle:N:T}:ready    zset  scored 0, "<rank>|<holder>": waiters that may
                             go as far as their key is concerned (each key's
                             head at least; a key full or rate-bound drops out
                             and its head comes back when it may go again)
    P:{throttle:N:T}:keys     hash  throttle key -> slots its holders hold
    P:{throttle:N:T}:taken    zset  admissions in the last rate period,
                             "<ms>|<holder>" scored by ms (the sliding window)
    P:{throttle:N:T}:ktaken   zset  scored 0, "<key>\0<ms, 13 digits>|<holder>":
                             each key's admissions in its own rate period
    P:{throttle:N:T}:later    zset  keys held back by their per-key rate, scored
                             by when they may go again
    P:{ns:N}:throttles        zset  the namespace's throttle names (scored 0)
    P:{R}:throttles  hash    the run's slot intents by op: "<epoch>|<state
                             w(aiting) or g(ranted)>|<throttle>|<key>",
                             written before a slot is asked for, so a settle
                             or a take-over knows what to give back

    P:{sweep}:due    zset    runs the sweep must look at, scored by when:
                             a lease's end, a queued message's check, a
                             timer's due time (claim_due.lua hands each to
                             one sweeper)
    P:{sweep}:throttles
                     zset    throttles "<namespace> <name>" the sweep must
                             look at, scored by when: a rate's next admission,
                             a lease after a slot was asked for (repairs what
                             a process that died between a throttle's script
                             and a run's left behind)
    P:{sweep}:expiring
                     zset    settled runs, "<namespace> <run id>", scored by
                             when their retention runs out: the sweep takes
                             the runs gone by then out of their namespace's
                             index
    P:{fleet}:empty  hash    per queue name, the last ms a sweep found the
                             queue empty in the broker (liveness)
    P:{fleet}:workers zset   live workers, scored by the ms of their last beat
    P:{fleet}:held:W hash    messages worker W held at its last beat, task
                             id -> run id, or run id@delivery tag for a
                             call's answer (schema.live.HeldMessage)
    P:{fleet}:registry zset  every worker that beat in the last day, scored
                             by its last beat (not buried with its messages:
                             what list_workers shows, dead ones too)
    P:{fleet}:profiles hash  worker -> what it serves, written with its
                             beat: its queues and each workflow's code hash
                             and meta (JSON, schema.profiles)
    P:{fleet}:takeovers:N
                     zset    runs of namespace N taken over (or halted) by
                             the sweep or a redelivery in the last hour, a
                             JSON note each (fleet_store.TakeOverNote),
                             scored by when: what the web view's fleet page
                             lists

    P:{sched}:due    zset    every schedule that is not paused, member
                             "<N>/<schedule id>", scored by its next tick (ms),
                             or by a sweeper's claim on it (the claim's end
                             plus half a millisecond, schedule_claim.lua)
    P:{sched}:s:N:S  hash    schedule S of namespace N: its specification and
                             its firing state (schema.SCHEDULE_FIELDS)
    P:{sched}:recent:N:S
                     list    its last actions, newest first, JSON each
                             (schedules/spec.py), trimmed to 20
    P:{sched}:runs:N:S
                     zset    the runs it started, scored by their tick (ms),
                             for `runs list --schedule S`; trimmed to the run
                             retention
    P:{sched}:ids:N  zset    namespace N's schedule ids, all scored 0 (by id)

A schedule's tick starts a run whose id is derived from N, S and the tick
(schema.schedule_run_id): the schedules' slot and the run's are two, so a
tick is claimed in ``{sched}``, its run created in ``{R}`` (create_run.lua
refuses a second), then the tick recorded in ``{sched}`` (schedule_record.lua):
a sweeper that dies in between leaves the claim to run out, and the next
claim finds the run made and only records it.

A *sequence* is one ordered stream of calls: ``m`` is the workflow's main
body, ``m.3.7`` is branch 7 of the fan-out that was op 3 of ``m``.

A settled run's keys carry a TTL of ``settings.run_retention_seconds``, set
by the script that settles it (``retain_run`` in ``_prelude.lua``;
``resume.lua`` removes it), and its ``idem`` key one as long, set right after;
the sweep takes it out of its namespace's index once it is gone
(``{sweep}:expiring``); the progress stream keeps the run's newest ``progress_max`` records (a
run hash field, ``append_progress`` in ``_prelude.lua``).

Every key of one run carries the hash tag ``{R}`` so all of them live in one
Redis Cluster slot and a Lua script may touch several. Namespace keys carry
``{ns:N}``, the sweep's ``{sweep}``, every schedule's ``{sched}``. No script mixes two tags: writes that
span them (start a run, then index and schedule it) are ordered so that a
crash between them is harmless.
"""

from __future__ import annotations

import re
from dataclasses import astuple, dataclass
from typing import Final

from celery_durable.names import NAMESPACE_PATTERN

__all__ = [
    "NAMESPACE_PATTERN",
    "RUN_ID_PATTERN",
    "KeySpace",
    "NamespaceKeys",
    "RunKeys",
    "ScheduleKeys",
    "ThrottleKeys",
]

RUN_ID_PATTERN = re.compile(r"\A[0-9a-f]{32}\Z")


@dataclass(frozen=True, slots=True)
class RunKeys:
    run: str
    journal: str
    progress: str
    progress_phases: str
    steps: str
    running: str
    agents: str
    live: str
    waits: str
    signals: str
    children: str
    history: str
    throttles: str
    archive: str


@dataclass(frozen=True, slots=True)
class ThrottleKeys:
    """One throttle's keys, all in its own slot, in the order its scripts take them."""

    conf: str
    holders: str
    waiters: str
    queue: str
    ready: str
    keys: str
    taken: str
    ktaken: str
    later: str

    def all(self) -> list[str]:
        return list(astuple(self))


@dataclass(frozen=True, slots=True)
class NamespaceKeys:
    runs: str
    counter: str
    events: str
    idempotency_prefix: str
    index: str
    index_state: str
    index_intents: str
    index_meta: str
    throttles: str

    def idempotency(self, key: str) -> str:
        return self.idempotency_prefix + key


@dataclass(frozen=True, slots=True)
class ScheduleKeys:
    """One schedule's keys, and the due zset every schedule shares (one slot)."""

    member: str
    """Its member in ``due``: ``"<namespace>/<schedule id>"``."""
    schedule: str
    recent: str
    runs: str
    ids: str
    due: str


class KeySpace:
    """Builds keys under one prefix; nothing else in the package formats keys."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        # The keys a whole fleet shares, made once: the hash tag is each one's slot.
        self.sweep_due: Final = f"{prefix}:{{sweep}}:due"
        self.sweep_expiring: Final = f"{prefix}:{{sweep}}:expiring"
        self.sweep_throttles: Final = f"{prefix}:{{sweep}}:throttles"
        self.queues_empty: Final = f"{prefix}:{{fleet}}:empty"
        self.workers: Final = f"{prefix}:{{fleet}}:workers"
        self.registry: Final = f"{prefix}:{{fleet}}:registry"
        self.profiles: Final = f"{prefix}:{{fleet}}:profiles"
        self.held_prefix: Final = f"{prefix}:{{fleet}}:held:"
        self.schedules_due: Final = f"{prefix}:{{sched}}:due"

    def run(self, run_id: str) -> RunKeys:
        base = f"{self.prefix}:{{{run_id}}}"
        # A field's name is its key's suffix, an underscore standing for a colon.
        return RunKeys(*(f"{base}:{part.replace('_', ':')}" for part in RunKeys.__dataclass_fields__))

    def take_overs(self, namespace: str) -> str:
        return f"{self.prefix}:{{fleet}}:takeovers:{namespace}"

    def namespace(self, namespace: str) -> NamespaceKeys:
        base = f"{self.prefix}:{{ns:{namespace}}}"
        return NamespaceKeys(
            runs=f"{base}:runs",
            counter=f"{base}:counter",
            events=f"{base}:events",
            idempotency_prefix=f"{base}:idem:",
            index=f"{base}:ix",
            index_state=f"{base}:ixstate",
            index_intents=f"{base}:ixintent",
            index_meta=f"{base}:ixmeta",
            throttles=f"{base}:throttles",
        )

    def schedule_ids(self, namespace: str) -> str:
        return f"{self.prefix}:{{sched}}:ids:{namespace}"

    def schedule(self, namespace: str, schedule_id: str) -> ScheduleKeys:
        base = f"{self.prefix}:{{sched}}"
        return ScheduleKeys(
            member=f"{namespace}/{schedule_id}",
            schedule=f"{base}:s:{namespace}:{schedule_id}",
            recent=f"{base}:recent:{namespace}:{schedule_id}",
            runs=f"{base}:runs:{namespace}:{schedule_id}",
            ids=self.schedule_ids(namespace),
            due=self.schedules_due,
        )


    def throttle(self, namespace: str, name: str) -> ThrottleKeys:
        base = f"{self.prefix}:{{throttle:{namespace}:{name}}}"
        return ThrottleKeys(*(f"{base}:{part}" for part in ThrottleKeys.__dataclass_fields__))

    def run_id_of(self, run_key: str) -> str:
        """The run id a key of ``run()`` names (the text of its hash tag)."""
        start = len(self.prefix) + 2
        return run_key[start : run_key.index("}", start)]
