"""The crash-point explorer (issue 35, item 2): every boundary of each scenario's runs, killed and recovered.

Each scenario runs once cleanly; every boundary its processes cross (before
and after each script run or sweep-schedule write, before and after each
message published, client calls included) is recorded. Then, for each
boundary, the scenario runs again from scratch with that process dying
exactly there (``testing/explorer.py``), and the real recovery sweep runs on
the virtual clock until the run settles or ``DEFAULT_LEASES`` leases pass.
At every point the run must settle as the clean run did (status, result,
journaled step results, children, signals and compensations seen once), and
no producer may run more often than at-least-once allows: once more only
when its process died after it ran.

Real Redis and real Lua (the environment's private redis-server, a key
prefix per run); no sleeps: time is the environment's virtual clock.

``KNOWN_FAILING`` lists the points today's wake path loses a run at (a
script counts a wake in flight, then Python publishes it: a death between
leaves a run that only waits, which the sweep never looks at again). It is
strict: a listed point that now settles fails the test, so the list is
emptied as the fix lands.
"""

from __future__ import annotations

import os
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from celery_durable import CompensationFailed, StepFailed, WorkflowContext, workflow
from celery_durable.broker import schema
from celery_durable.broker.schema import schedule_run_id
from celery_durable.schedules.calendar import to_ms
from celery_durable.schedules.firing import fire_due
from celery_durable.testing.crash_test import compare
from celery_durable.testing.explorer import (
    Execution,
    Exploration,
    ExplorerEnvironment,
    Scenario,
    execute,
    explore,
    table,
)
from celery_durable.testing.mechanisms import Mechanisms
from celery_durable.testing.tracer import Tracer

TRACER: list[Tracer] = []
"""The tracer of the execution under way: step producers report to it."""

EXPLORATIONS: dict[str, Exploration] = {}


def did(name: str, value: Any = None) -> Any:
    """A step producer's effect, counted by the execution's tracer."""
    TRACER[0].effect(name)
    return value if value is not None else name


# -- (a) the trip: book a hotel, the car fails, the hotel is cancelled ---------------


def car_fails() -> Any:
    did("book-car")
    raise RuntimeError("no car left")


@workflow(name="x-trip", description="Hotel, then a car that fails: the saga cancels the hotel", phases=[])
def trip(ctx: WorkflowContext) -> Any:
    try:
        with ctx.saga() as saga:
            hotel = ctx.step("book-hotel", lambda: did("book-hotel", {"ref": "H-1"}))
            saga.compensate("cancel-hotel", lambda: did("cancel-hotel", {"cancelled": hotel["ref"]}))
            ctx.step("book-car", car_fails)
    except StepFailed as exc:
        return {"failed": exc.key, "error": exc.error_message}
    return {"failed": None}


# -- (a') the trip, its hotel's cancellation failing the first time: resumed, it runs again ----


def cancel_hotel_fails_first() -> Any:
    """Fails its first run in the execution (the hotel's system was down)."""
    did("cancel-hotel")
    if TRACER[0].effects["cancel-hotel"] == 1:
        raise RuntimeError("hotel system down")
    return {"cancelled": "H-1"}


@workflow(name="x-trip-undo", description="Flight, hotel, a car that fails; the hotel's undo fails once", phases=[])
def trip_undo(ctx: WorkflowContext) -> Any:
    try:
        with ctx.saga() as saga:
            ctx.step("book-flight", lambda: did("book-flight", {"ref": "F-1"}))
            saga.compensate("cancel-flight", lambda: did("cancel-flight", {"cancelled": "F-1"}))
            ctx.step("book-hotel", lambda: did("book-hotel", {"ref": "H-1"}))
            saga.compensate("cancel-hotel", cancel_hotel_fails_first)
            ctx.step("book-car", car_fails)
    except CompensationFailed:
        raise
    except StepFailed as exc:
        return {"failed": exc.key, "error": exc.error_message}
    return {"failed": None}


def resume_after_compensation_failed(env: ExplorerEnvironment) -> tuple[str, bool]:
    """The run ends CompensationFailed (the hotel's undo failed, the flight's
    passed after it); the user resumes it: the hotel's undo runs again, in
    place, and the car's failure goes on to the workflow. (A death before
    the first attempt journaled that failure lets the next attempt pass the
    undo at once: then the run completes with nothing to resume.)"""
    run_id = env.client.start_workflow(trip_undo)
    env.recover(lambda: env.settled(run_id))
    if env.status(run_id) == "error":
        env.client_call("resume", lambda: env.client._resume(run_id, None, force=False, allow_code_change=False))
    return run_id, env.recover(lambda: env.settled(run_id))


# -- (b) a nightly parent with two children ------------------------------------------------


@workflow(name="x-report", description="One customer's report", phases=[])
def report(ctx: WorkflowContext) -> Any:
    customer = ctx.args["customer"]
    orders = ctx.step("orders", lambda: did(f"orders-{customer}", [10, 20]))
    return ctx.step("summary", lambda: did(f"summary-{customer}", {"customer": customer, "total": sum(orders)}))


@workflow(name="x-nightly", description="A child run per customer, then the totals", phases=[])
def nightly(ctx: WorkflowContext) -> Any:
    reports = ctx.parallel([partial(ctx.child, f"report-{c}", report, {"customer": c}) for c in ("acme", "globex")])
    return ctx.step("totals", lambda: did("totals", {"total": sum(r["total"] for r in reports)}))


# -- (c) an approval: a signal, then a timer ---------------------------------------------------


@workflow(name="x-approval", description="Asks, waits for a decision, waits a minute, notifies", phases=[])
def approval(ctx: WorkflowContext) -> Any:
    ctx.step("ask", lambda: did("ask"))
    decision = ctx.wait_for_signal("decision")
    ctx.sleep(60)
    return ctx.step("notify", lambda: did("notify", {"decision": decision.payload}))


# -- (d) a fulfilment: a Celery task as a step -------------------------------------------------


def charge(order: str) -> dict[str, Any]:
    did("charge")
    return {"charged": order}


@workflow(name="x-fulfilment", description="Reserve, charge with a task, ship", phases=[])
def fulfilment(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: did("reserve"))
    paid = ctx.call("charge", "payments.charge", args=("order-7",))
    return ctx.step("ship", lambda: did("ship", {"shipped": paid["charged"]}))


# -- (e) a fan-out of 16 ------------------------------------------------------------------------


def item(ctx: WorkflowContext, i: int) -> Any:
    return ctx.step(f"item-{i}", lambda: did(f"item-{i}", i * i))


@workflow(name="x-fanout", description="Sixteen steps at once, then their sum", phases=[])
def fanout(ctx: WorkflowContext) -> Any:
    squares = ctx.parallel([partial(item, ctx, i) for i in range(16)])
    return ctx.step("sum", lambda: did("sum", {"sum": sum(squares)}))


# -- (f) a run cancelled while it waits inside a saga -------------------------------------------


@workflow(name="x-held-seat", description="Holds a seat, waits for payment; cancelled, releases it", phases=[])
def held_seat(ctx: WorkflowContext) -> Any:
    with ctx.saga() as saga:
        ctx.step("hold-seat", lambda: did("hold-seat"))
        saga.compensate("release-seat", lambda: did("release-seat"))
        return ctx.wait_for_signal("paid").payload


# -- (g) a run paused inside a saga, then cancelled: one attempt compensates ------------------
# (the held seat again, driven by pause_then_cancel below)


# -- (h) a cancel that steps over a call still out, whose answer comes late ---------------------

CANCEL_FROM_TASK: list[Any] = []
"""The environment and run whose cancel the called task asks for, as it runs."""


def slow_charge(order: str) -> dict[str, Any]:
    """The charge is out when the run is cancelled: its answer comes after
    the cancel's pass stepped over the call (answers travel as messages here)."""
    env, run_id = CANCEL_FROM_TASK[0]
    if did("charge") and env.status(run_id) == "running":
        env.client._ask_cancel(run_id)
    return {"charged": order}


@workflow(name="x-reserve-and-charge", description="Reserves, charges by a task; cancelled, unreserves", phases=[])
def reserve_and_charge(ctx: WorkflowContext) -> Any:
    with ctx.saga() as saga:
        ctx.step("reserve", lambda: did("reserve"))
        saga.compensate("unreserve", lambda: did("unreserve"))
        charged = ctx.call("charge", "payments.charge", args=("order-9",))
        return ctx.step("confirm", lambda: did("confirm", charged))


# -- (i) a schedule's tick: the sweep fires it ---------------------------------------------------


@workflow(name="x-tick", description="A report a schedule starts every hour", phases=[])
def hourly(ctx: WorkflowContext) -> Any:
    return ctx.step("report", lambda: did("report", {"schedule": ctx.schedule_id}))


# -- (h) two runs through a throttle of one slot, each with a throttled step -----------------


@workflow(name="x-throttled", description="One step under a fleet-wide limit, in a run under another", phases=[])
def throttled(ctx: WorkflowContext) -> Any:
    n = ctx.args["n"]
    return ctx.step("work", lambda: did(f"work-{n}"), throttle="x-api")


def no_slot_held(env: ExplorerEnvironment) -> bool:
    return all(t.holding == 0 and t.waiting == 0 for t in env.client.list_throttles())


def two_through_one_slot(env: ExplorerEnvironment) -> tuple[str, bool]:
    env.client.set_throttle("x-one", concurrency=1)
    env.client.set_throttle("x-api", concurrency=1)
    first = env.client.start_workflow(throttled, args={"n": "a"}, throttle="x-one")
    second = env.client.start_workflow(throttled, args={"n": "b"}, throttle="x-one")
    # Settled means both ran, and no slot or place is left behind.
    return second, env.recover(lambda: env.settled(first) and env.settled(second) and no_slot_held(env))


# -- (j) a child call that times out: the child is cancelled, the call fails ChildTimeout -------


@workflow(name="x-slow-kid", description="A child that sleeps past its parent's time-out", phases=[])
def slow_kid(ctx: WorkflowContext) -> Any:
    ctx.sleep(600)
    return ctx.step("late", lambda: did("late"))


@workflow(name="x-impatient", description="Waits a minute for a child, then gives up on it", phases=[])
def impatient(ctx: WorkflowContext) -> Any:
    try:
        return ctx.child("slow", slow_kid, timeout=60)
    except StepFailed as exc:
        error_type = exc.error_type
    return ctx.step("gave-up", lambda: did("gave-up", {"error_type": error_type}))


def child_times_out(env: ExplorerEnvironment) -> tuple[str, bool]:
    run_id = env.client.start_workflow(impatient)
    kid = schema.child_run_id(run_id, "slow")
    # Settled means the parent gave up and its cancelled child settled too.
    return run_id, env.recover(lambda: env.settled(run_id) and env.settled(kid))


# -- (k) a parent cancelled while it waits for its child: the child is cancelled first ----------


@workflow(name="x-waiting-kid", description="Starts, then waits for a go", phases=[])
def waiting_kid(ctx: WorkflowContext) -> Any:
    ctx.step("kid-start", lambda: did("kid-start"))
    return ctx.wait_for_signal("go").payload


@workflow(name="x-waiting-parent", description="Waits for its child", phases=[])
def waiting_parent(ctx: WorkflowContext) -> Any:
    ctx.step("parent-start", lambda: did("parent-start"))
    return ctx.child("kid", waiting_kid)


def cancel_a_waiting_parent(env: ExplorerEnvironment) -> tuple[str, bool]:
    run_id = env.client.start_workflow(waiting_parent)
    kid = schema.child_run_id(run_id, "kid")
    env.recover(lambda: env.status(kid) != "missing" and env.waits_for_signal(kid))
    env.client_call("cancel", lambda: env.client._ask_cancel(run_id))
    # Settled means the parent is cancelled and so is the child it waited for.
    return run_id, env.recover(lambda: env.settled(run_id) and env.settled(kid))


# -- (l) a child that fails, resumed by hand, then its parent resumed ---------------------------


def kid_work_fails_first() -> Any:
    """Fails its first run in the execution (a dependency was down)."""
    did("kid-work")
    if TRACER[0].effects["kid-work"] == 1:
        raise RuntimeError("kid broke")
    return "kid-ok"


@workflow(name="x-flaky-kid", description="Its work fails the first time", phases=[])
def flaky_kid(ctx: WorkflowContext) -> Any:
    return ctx.step("kid-work", kid_work_fails_first)


@workflow(name="x-flaky-parent", description="Waits for a child that fails once", phases=[])
def flaky_parent(ctx: WorkflowContext) -> Any:
    ctx.step("parent-start", lambda: did("parent-start"))
    got = ctx.child("kid", flaky_kid)
    return ctx.step("parent-end", lambda: did("parent-end", {"kid": got}))


def resume_kid_then_parent(env: ExplorerEnvironment) -> tuple[str, bool]:
    """The child ends error, so its parent does (ChildWorkflowFailed); the user
    resumes the child, which completes, then the parent, which looks at the
    child again (SPEC 5b: not cached across attempts) and completes."""
    run_id = env.client.start_workflow(flaky_parent)
    kid = schema.child_run_id(run_id, "kid")
    env.recover(lambda: env.settled(run_id))
    if env.status(kid) == "error":
        env.client_call("resume kid", lambda: env.client._resume(kid, None, force=False, allow_code_change=False))
    env.recover(lambda: env.settled(kid))
    if env.status(run_id) == "error":
        env.client_call("resume", lambda: env.client._resume(run_id, None, force=False, allow_code_change=False))
    return run_id, env.recover(lambda: env.status(run_id) in ("completed", "cancelled"))


# -- (m) automatic recovery off: every death halts the run, and the user resumes it -------------


def signal_with_halts_resumed(env: ExplorerEnvironment) -> tuple[str, bool]:
    """The approval with ``auto_recover`` off (SPEC 8): an attempt that dies
    leaves the run ``halted``, resumable; the user resumes it each time."""

    def resume_if_halted() -> None:
        if env.status(run_id) == "halted":
            env.client_call("resume", lambda: env.client._resume(run_id, None, force=False, allow_code_change=False))

    run_id = env.client.start_workflow(approval)
    env.recover(lambda: env.waits_for_signal(run_id))
    resume_if_halted()
    env.recover(lambda: env.waits_for_signal(run_id))
    env.client_call("signal", lambda: env.client.signal_workflow_run(run_id, "decision", {"ok": True}))
    env.recover(lambda: env.settled(run_id))
    resume_if_halted()
    return run_id, env.recover(lambda: env.status(run_id) in ("completed", "cancelled", "error"))


# -- the scenarios: what the clients do --------------------------------------------------------


def to_the_end(workflow_: Any, args: Any = None) -> Any:
    def drive(env: ExplorerEnvironment) -> tuple[str, bool]:
        run_id = env.client.start_workflow(workflow_, args=args)
        return run_id, env.recover(lambda: env.settled(run_id))

    return drive


def signal_while_waiting(env: ExplorerEnvironment) -> tuple[str, bool]:
    run_id = env.client.start_workflow(approval)
    env.recover(lambda: env.waits_for_signal(run_id))
    env.client_call("signal", lambda: env.client.signal_workflow_run(run_id, "decision", {"ok": True}))
    return run_id, env.recover(lambda: env.settled(run_id))


def cancel_while_waiting(env: ExplorerEnvironment) -> tuple[str, bool]:
    run_id = env.client.start_workflow(held_seat)
    env.recover(lambda: env.waits_for_signal(run_id))
    env.client_call("cancel", lambda: env.client._ask_cancel(run_id))
    return run_id, env.recover(lambda: env.settled(run_id))


def pause_then_cancel(env: ExplorerEnvironment) -> tuple[str, bool]:
    run_id = env.client.start_workflow(held_seat)
    env.recover(lambda: env.waits_for_signal(run_id))
    env.client_call("pause", lambda: env.client._ask_pause(run_id))
    env.recover(lambda: env.settled(run_id))
    env.client_call("cancel", lambda: env.client._ask_cancel(run_id))
    return run_id, env.recover(lambda: env.status(run_id) not in ("pending", "running", "paused"))


def cancelled_by_its_task(env: ExplorerEnvironment) -> tuple[str, bool]:
    run_id = env.client.start_workflow(reserve_and_charge)
    CANCEL_FROM_TASK[:] = [(env, run_id)]
    return run_id, env.recover(lambda: env.settled(run_id))


def fire_a_tick(env: ExplorerEnvironment) -> tuple[str, bool]:
    """A sweeper fires the tick as a process of its own, which may die at any
    of its boundaries (the claim, the run's creation, listing and first
    message, the record); the sweep's later passes (untraced) repair it."""
    info = env.client.create_schedule("hourly", hourly, every=3600)
    tick = to_ms(info.next_times[0])
    env.clock.advance_to(tick)
    with env.tracer.process("sweep fire"):
        fire_due(env.engine)
    run_id = schedule_run_id("default", "hourly", tick)

    def fired() -> bool:
        """The run settled, and the tick recorded (the schedule waits for the next one)."""
        return env.settled(run_id) and bool(env.client.get_schedule("hourly").recent)

    return run_id, env.recover(fired)


SCENARIOS = [
    Scenario("trip", (trip,), to_the_end(trip)),
    Scenario("trip-undo-resumed", (trip_undo,), resume_after_compensation_failed),
    Scenario("nightly", (nightly, report), to_the_end(nightly)),
    Scenario("approval", (approval,), signal_while_waiting),
    Scenario("fulfilment", (fulfilment,), to_the_end(fulfilment), tasks={"payments.charge": charge}),
    Scenario("fanout-16", (fanout,), to_the_end(fanout)),
    Scenario("fanout-16-tasks", (fanout,), to_the_end(fanout), mechanisms=Mechanisms(False, False, False, False)),
    Scenario("cancel-saga", (held_seat,), cancel_while_waiting),
    Scenario("pause-cancel-saga", (held_seat,), pause_then_cancel),
    Scenario(
        "cancel-over-call",
        (reserve_and_charge,),
        cancelled_by_its_task,
        tasks={"payments.charge": slow_charge},
        mechanisms=Mechanisms(in_place=False, kept=False, home=False),
    ),
    Scenario("schedule-tick", (hourly,), fire_a_tick),
    Scenario("throttled", (throttled,), two_through_one_slot),
    Scenario("child-timeout", (impatient, slow_kid), child_times_out),
    Scenario("cancel-parent", (waiting_parent, waiting_kid), cancel_a_waiting_parent),
    Scenario("child-resumed", (flaky_parent, flaky_kid), resume_kid_then_parent),
    Scenario("approval-halted", (approval,), signal_with_halts_resumed),
]

ENVIRONMENT = {"approval-halted": {"CELERY_DURABLE_AUTO_RECOVER": "false"}}
"""Settings a scenario runs under, as the environment variables a deployment sets."""

CANCEL_PASS = ["activate#2", "begin_op#2", "commit_begin#2"]

KNOWN_FAILING: dict[str, set[str]] = {
    "trip": set(),
    "trip-undo-resumed": set(),
    "nightly": set(),
    "approval": set(),
    "fulfilment": set(),
    "fanout-16": set(),
    "fanout-16-tasks": set(),
    "cancel-saga": set(),
    "pause-cancel-saga": set(),
    "cancel-over-call": set(),
    "schedule-tick": set(),
    "throttled": set(),
    "child-timeout": set(),
    "cancel-parent": set(),
    "child-resumed": set(),
    "approval-halted": set(),
}
"""Points (``Boundary.name``) today's main fails at (hangs, or runs an effect
twice). Strict: a listed point that settles cleanly fails the test, so the
entries go as the wake path is fixed (a look scheduled at now+lease before
any script that can count a wake empties approval's and cancel-saga's)."""

RACING = {"cancel-over-call": frozenset({"v:charge"}), "cancel-parent": frozenset({"v:kid"})}
"""Outcomes that may or may not be journaled, by scenario: the charge's
answer races the cancel. A cancel pass that died before it stepped over the
call leaves the answer to arrive first, and be journaled (the charge did
happen); the run is cancelled at its next step all the same, and compensates.
The cancelled child's end races the parent's settling alike: a cancel pass
of the parent that died after cancelling the child lets the child's end be
journaled first; the parent is cancelled all the same."""


def compare_tick(clean: Execution, crashed: Execution, racing: frozenset[str] = frozenset()) -> list[str]:
    """As ``compare``, and the tick started one run, ever, recorded once as started."""
    problems = compare(clean, crashed, racing)
    started = crashed.env.engine.store.list_run_ids("default", None, 10)
    if len(started) != 1:
        problems.append(f"duplicate runs: the tick started {len(started)}")
    info = crashed.env.client.get_schedule("hourly")
    recent = [(item["action"], item["run_id"]) for item in info.recent]
    if recent != [("started", crashed.run_id)]:
        problems.append(f"recent actions {recent} (clean: started {crashed.run_id})")
    if crashed.env.get(crashed.run_id).scheduled_at != info.next_times[0] - timedelta(hours=1):
        problems.append("the run is not the tick's, or the schedule did not move on to the next tick")
    return problems


def compare_cancelled_parent(clean: Execution, crashed: Execution, racing: frozenset[str] = frozenset()) -> list[str]:
    """As ``compare``, and the child the parent waited for is cancelled too (SPEC 5b)."""
    problems = compare(clean, crashed, racing)
    kid = crashed.env.status(schema.child_run_id(crashed.run_id, "kid"))
    if kid != "cancelled":
        problems.append(f"the child the cancelled parent waited for is {kid}")
    return problems


COMPARES = {"schedule-tick": compare_tick, "cancel-parent": compare_cancelled_parent}


def archived_whole(execution: Execution) -> list[str]:
    """A run settled for good is archived whole or not at all (issue 42): its
    archive and none of the keys folded into it, or those keys and no archive
    (a death before ``archive_run`` ends it so, and it reads the same); any
    other run has no archive."""
    store = execution.env.engine.store
    k, status = store.run_keys(execution.run_id), execution.env.status(execution.run_id)
    archived, folded = store.client.exists(k.archive), store.client.exists(k.history, k.journal, k.progress)
    if archived and (folded or status not in ("completed", "cancelled")):
        return [f"archived half: a {status} run with its archive and {folded} of the keys folded into it"]
    if not archived and status in ("completed", "cancelled") and folded == 0:
        return [f"a {status} run with neither its archive nor its keys"]
    return []


def judged(judge: Any, clean: Execution, crashed: Execution, racing: frozenset[str]) -> list[str]:
    return judge(clean, crashed, racing) + archived_whole(crashed)


def table_path(tmp: Path) -> Path:
    return Path(os.environ.get("CRASH_EXPLORER_TABLE", str(tmp / "crash_explorer.txt")))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_crash_point_settles_as_the_clean_run(
    scenario: Scenario, tmp_path_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENVIRONMENT.get(scenario.name, {}).items():
        monkeypatch.setenv(name, value)
    judge = COMPARES.get(scenario.name, compare)
    racing = RACING.get(scenario.name, frozenset())
    clean, exploration = explore(scenario, TRACER, lambda clean, crashed: judged(judge, clean, crashed, racing))
    EXPLORATIONS[scenario.name] = exploration
    assert clean.tracer.trace.boundaries, "the clean run crossed no boundary: the explorer traced nothing"
    # Every scenario's run settles completed or cancelled: its settle archives it,
    # and a death on either side of archive_run.lua is one of the points explored.
    assert clean.env.engine.store.archive(clean.run_id) is not None, "the clean run was not archived"
    assert {p.boundary.moment for p in exploration.points if p.boundary.label.startswith("archive_run#")} == {
        "before",
        "after",
    }
    path = table_path(tmp_path_factory.getbasetemp())
    text = table([EXPLORATIONS[s.name] for s in SCENARIOS if s.name in EXPLORATIONS])
    path.write_text(text + "\n")
    print(f"\n{text}\n(written to {path})")
    failing = exploration.failing()
    known = KNOWN_FAILING[scenario.name]
    unexpected = {point: why for point, why in failing.items() if point not in known}
    fixed = sorted(known - set(failing))
    assert not unexpected, f"{scenario.name}: {len(unexpected)} crash points did not settle as clean: {unexpected}"
    assert not fixed, f"{scenario.name}: these listed points settle now, take them out of KNOWN_FAILING: {fixed}"


def test_a_crashed_process_does_nothing_more_and_the_others_go_on() -> None:
    """The explorer's own model, checked on the fan-out: the coordinator killed
    after publishing the first branch publishes no other and writes nothing
    more (not even ``mark_sent``), the branch already queued is still
    delivered and runs, and recovery finishes the run."""
    scenario = next(s for s in SCENARIOS if s.name == "fanout-16-tasks")
    clean = execute(scenario, None, TRACER)
    first = next(b for b in clean.tracer.trace.boundaries if b.label == "publish branch#1" and b.moment == "after")
    crashed = execute(scenario, first.index, TRACER)
    assert crashed.tracer.crashed_at == first
    after = [b for b in crashed.tracer.trace.boundaries if b.index > first.index]
    assert not [b for b in after if b.process == first.process], "the dead process went on"
    assert after[0].label == "branch_start#1", "the branch published before the crash was not delivered next"
    assert crashed.tracer.effects["item-0"] == 1
    assert crashed.settled and crashed.env.get(crashed.run_id).result == {"sum": sum(i * i for i in range(16))}


def test_the_cancel_over_a_call_steps_over_it_and_its_answer_comes_late() -> None:
    """Scenario (h) explores what it says: its clean run's cancel pass steps
    over the call still out (a journaled mark), and the answer that comes
    after it is late: not journaled, and the run is cancelled, compensated."""
    scenario = next(s for s in SCENARIOS if s.name == "cancel-over-call")
    clean = execute(scenario, None, TRACER)
    journal = clean.env.hashes(clean.run_id).journal
    assert clean.env.status(clean.run_id) == "cancelled"
    assert "so:v:charge" in journal and "v:charge" not in journal
    assert dict(clean.tracer.effects) == {"reserve": 1, "charge": 1, "unreserve": 1}


def test_a_parent_dead_inside_a_child_time_out_ends_the_call_by_the_time_out() -> None:
    """Scenario (j) at the deaths that used to end it otherwise: the parent's
    pass dies after cancelling the child, or after journaling ChildTimeout;
    the cancelled child's end reaches the attempt that takes over first. That
    attempt still fails the call with ChildTimeout (SPEC 5b), as the clean run
    does, never with ChildWorkflowFailed for the child the time-out cancelled."""
    scenario = next(s for s in SCENARIOS if s.name == "child-timeout")
    clean = execute(scenario, None, TRACER)
    assert clean.env.get(clean.run_id).result == {"error_type": "ChildTimeout"}
    points = ["after publish coordinator#2 (in coordinator)", "after child_done#1 (in coordinator)"]
    for point in points:
        target = next(b.index for b in clean.tracer.trace.boundaries if b.name == point)
        crashed = execute(scenario, target, TRACER)
        assert crashed.tracer.crashed_at is not None and crashed.tracer.crashed_at.name == point
        assert crashed.settled, point
        envelope = crashed.env.get(crashed.run_id)
        assert (envelope.status, envelope.attempt) == ("completed", 2), point
        assert envelope.result == {"error_type": "ChildTimeout"}, point
        assert crashed.env.status(schema.child_run_id(crashed.run_id, "slow")) == "cancelled", point
