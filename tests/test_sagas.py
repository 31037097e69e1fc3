"""Sagas (SPEC §5c): compensations registered in a block run in reverse, each
a journaled step, when an exception leaves it — or the run is cancelled.

Real Redis, real Celery workers (threads in this process); a whole fleet
killed mid-compensation is in ``test_children_crash.py``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from celery_durable import (
    ChildWorkflowFailed,
    CompensationFailed,
    StepFailed,
    WorkflowContext,
)
from tests.conftest import kill_attempt
from tests.support.poll import RUN_BOUND, poll
from tests.support.workflows import wf

TIMEOUT = 30
DONE: dict[str, list[str]] = {}
COUNTS: Counter[str] = Counter()
LOCK = threading.Lock()
GATES: dict[str, threading.Event] = {}


def did(run_id: str, what: str) -> str:
    with LOCK:
        DONE.setdefault(run_id, []).append(what)
        COUNTS[f"{run_id}:{what}"] += 1
    return what


def gate(name: str) -> threading.Event:
    with LOCK:
        return GATES.setdefault(name, threading.Event())


def boom(message: str) -> Any:
    raise RuntimeError(message)


def book_two_then(ctx: WorkflowContext, then: Any) -> Any:
    """Books a and b, each with its undo, then does ``then`` inside the saga."""
    rid = ctx.run_id
    with ctx.saga() as saga:
        ctx.step("book-a", lambda: did(rid, "book-a"))
        saga.compensate("undo-a", lambda: did(rid, "undo-a"))
        ctx.step("book-b", lambda: did(rid, "book-b"))
        saga.compensate("undo-b", lambda: did(rid, "undo-b"))
        return then(ctx)


def system_records(client: Any, run_id: str) -> list[str]:
    return [r.message for r in client.get_workflow_run_progress(run_id).records if r.kind == "system"]


def step_status(client: Any, run_id: str) -> dict[str, str]:
    return {row.key: row.status for row in client.get_workflow_run_detail(run_id).steps}


def test_a_failed_step_runs_the_compensations_in_reverse_then_propagates(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        try:
            book_two_then(ctx, lambda ctx: ctx.step("book-c", lambda: boom("no car left")))
        except StepFailed as exc:
            return [exc.key, exc.error_type, exc.error_message]
        return None

    d = durable([wf("trip", run)])
    envelope = d.client.run_workflow("trip", timeout=TIMEOUT)
    assert envelope.result == ["book-c", "RuntimeError", "no car left"]
    assert DONE[envelope.run_id] == ["book-a", "book-b", "undo-b", "undo-a"]
    steps = step_status(d.client, envelope.run_id)
    assert steps["undo-a"] == steps["undo-b"] == "completed"  # each a journaled step under its key
    assert "Compensating after StepFailed: running undo-b, undo-a" in system_records(d.client, envelope.run_id)


def test_a_normal_exit_runs_nothing_and_an_ordinary_exception_compensates(durable) -> None:
    def fine(ctx: WorkflowContext) -> Any:
        return book_two_then(ctx, lambda ctx: "booked")

    def raises(ctx: WorkflowContext) -> Any:
        return book_two_then(ctx, lambda ctx: boom("changed my mind"))

    d = durable([wf("fine", fine), wf("raises", raises)])
    ok = d.client.run_workflow("fine", timeout=TIMEOUT)
    assert ok.result == "booked" and DONE[ok.run_id] == ["book-a", "book-b"]
    assert not [m for m in system_records(d.client, ok.run_id) if "Compensating" in m]

    failed = d.client.run_workflow("raises", timeout=TIMEOUT)
    assert (failed.status, failed.reason) == ("error", "exception")
    assert failed.error == "RuntimeError: changed my mind"  # the same exception went on
    assert DONE[failed.run_id] == ["book-a", "book-b", "undo-b", "undo-a"]


def test_a_failed_child_compensates(durable) -> None:
    child = wf("broken-child", lambda ctx: ctx.step("x", lambda: boom("child down")))

    def run(ctx: WorkflowContext) -> Any:
        try:
            book_two_then(ctx, lambda ctx: ctx.child("kid", "broken-child"))
        except ChildWorkflowFailed as exc:
            return exc.child_status
        return None

    d = durable([wf("parent", run), child])
    envelope = d.client.run_workflow("parent", timeout=TIMEOUT)
    assert envelope.result == "error"
    assert DONE[envelope.run_id][-2:] == ["undo-b", "undo-a"]
    assert "Compensating after ChildWorkflowFailed: running undo-b, undo-a" in system_records(
        d.client, envelope.run_id
    )


def test_a_compensation_that_raises_does_not_stop_the_others(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        rid = ctx.run_id
        try:
            with ctx.saga() as saga:
                saga.compensate("undo-1", lambda: did(rid, "undo-1"))
                saga.compensate("undo-2", lambda: boom("provider refused the cancellation"))
                saga.compensate("undo-3", lambda: (_ for _ in ()).throw(KeyError("ref")))
                ctx.step("fail", lambda: boom("original"))
        except CompensationFailed as exc:
            cause = exc.__cause__
            return {
                "key": exc.key, "error_type": exc.error_type, "failures": exc.failures,
                "is_step_failed": isinstance(exc, StepFailed),
                "cause": [type(cause).__name__, getattr(cause, "key", None)],
            }
        return None

    d = durable([wf("undo-fails", run)])
    envelope = d.client.run_workflow("undo-fails", timeout=TIMEOUT)
    assert envelope.result == {
        "key": "undo-3",
        "error_type": "CompensationFailed",
        "failures": [
            {"key": "undo-3", "error_type": "KeyError", "message": "'ref'"},
            {"key": "undo-2", "error_type": "RuntimeError", "message": "provider refused the cancellation"},
        ],
        "is_step_failed": True,
        "cause": ["StepFailed", "fail"],
    }
    assert DONE[envelope.run_id] == ["undo-1"]  # after both failures, the last one still ran


def test_an_uncaught_compensation_failure_ends_the_run_naming_it(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        with ctx.saga() as saga:
            saga.compensate("undo", lambda: boom("cannot undo"))
            ctx.step("fail", lambda: boom("original"))

    d = durable([wf("undo-fails", run)])
    envelope = d.client.run_workflow("undo-fails", timeout=TIMEOUT)
    assert (envelope.status, envelope.reason) == ("error", "exception")
    assert envelope.error == (
        "StepFailed: step 'undo' raised CompensationFailed: Compensation failed: undo: RuntimeError: cannot undo"
    )


def test_a_run_being_cancelled_compensates_before_it_settles_cancelled(durable) -> None:
    """Cancelled while waiting (no pass runs: the cancel's pass replays it to the
    wait), and cancelled while a step runs (its next op meets the cancel)."""

    def waits(ctx: WorkflowContext) -> Any:
        return book_two_then(ctx, lambda ctx: ctx.wait_for_signal("never"))

    def busy(ctx: WorkflowContext) -> Any:
        return book_two_then(ctx, lambda ctx: [ctx.step("long", lambda: gate(ctx.run_id).wait(TIMEOUT)),
                                               ctx.step("next", lambda: did(ctx.run_id, "next"))])

    d = durable([wf("waits", waits), wf("busy", busy)])
    waiting = d.client.start_workflow("waits")
    poll(lambda: d.client.get_workflow_run(waiting).snapshot["waiting_for"], within=RUN_BOUND, what="the wait")
    cancelled = d.client.cancel_workflow_run(waiting, timeout=TIMEOUT)
    assert cancelled.status == "cancelled"
    assert DONE[waiting] == ["book-a", "book-b", "undo-b", "undo-a"]
    assert "Compensating after WorkflowCancelled: running undo-b, undo-a" in system_records(d.client, waiting)

    running = d.client.start_workflow("busy")
    poll(lambda: step_status(d.client, running).get("long") == "running", within=RUN_BOUND, what="the long step")
    threading.Timer(0.3, gate(running).set).start()  # finishes after the cancel was asked for
    assert d.client.cancel_workflow_run(running, timeout=TIMEOUT).status == "cancelled"
    assert DONE[running] == ["book-a", "book-b", "undo-b", "undo-a"]


def test_a_cancelled_run_waits_for_its_waiting_branches_to_compensate_before_it_settles(durable) -> None:
    """Branches that wait (a signal, a child) are sent again when the run is
    cancelled: each meets the cancellation there and undoes its own work;
    then the main body's saga undoes its own, and the run settles cancelled."""
    kid = wf("kid", lambda ctx: ctx.wait_for_signal("never").payload)

    def run(ctx: WorkflowContext) -> Any:
        rid = ctx.run_id

        def branch(i: int) -> Any:
            with ctx.saga() as saga:
                ctx.step(f"book-{i}", lambda: did(rid, f"book-{i}"))
                saga.compensate(f"undo-{i}", lambda: did(rid, f"undo-{i}"))
                return ctx.child(f"kid-{i}", "kid") if i == 0 else ctx.wait_for_signal("never").payload

        with ctx.saga() as main:
            ctx.step("book-main", lambda: did(rid, "book-main"))
            main.compensate("undo-main", lambda: did(rid, "undo-main"))
            return ctx.parallel([lambda i=i: branch(i) for i in range(2)])

    d = durable([wf("branchy", run), kid], fanout_tasks=2, branch_batch_ms=0)
    run_id = d.client.start_workflow("branchy")
    from celery_durable.broker.schema import child_run_id

    poll(lambda: len(d.engine.store.hashes(run_id).waits) == 2, within=RUN_BOUND, what="both branches to wait")
    envelope = d.client.cancel_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.status == "cancelled", envelope.error
    done = DONE[run_id]
    assert sorted(done[:3]) == ["book-0", "book-1", "book-main"]
    assert sorted(done[3:5]) == ["undo-0", "undo-1"] and done[5:] == ["undo-main"], done
    assert d.client.wait_for_workflow_run(child_run_id(run_id, "kid-0"), timeout=TIMEOUT).status == "cancelled"


def crashed_at_undo_a(d: Any, raw_redis: Any, workflow: str) -> tuple[str, Any]:
    """Start ``workflow``, kill its attempt while compensation ``undo-a`` runs
    (held at its gate), open the gate once another attempt took over; the run
    id and how the run settled."""
    run_id = d.client.start_workflow(workflow)
    poll(
        lambda: step_status(d.client, run_id).get("undo-a") == "running",
        within=RUN_BOUND,
        what="the second compensation",
    )
    kill_attempt(raw_redis, d.engine, run_id)  # its attempt is dead; its thread still waits at the gate
    poll(lambda: d.client.get_workflow_run(run_id).attempt == 2, within=RUN_BOUND, what="the take-over")
    gate(run_id).set()
    return run_id, d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)


def test_a_crash_while_compensating_resumes_the_rest_without_running_a_finished_one_again(
    durable, raw_redis
) -> None:
    def run(ctx: WorkflowContext) -> Any:
        rid = ctx.run_id
        with ctx.saga() as saga:
            saga.compensate("undo-a", lambda: (gate(rid).wait(TIMEOUT), did(rid, "undo-a"))[1])
            saga.compensate("undo-b", lambda: did(rid, "undo-b"))
            ctx.step("fail", lambda: boom("original"))

    d = durable([wf("crashy", run)], lease_seconds=2)
    run_id, envelope = crashed_at_undo_a(d, raw_redis, "crashy")
    assert envelope.status == "error" and envelope.error == "StepFailed: step 'fail' raised RuntimeError: original"
    assert COUNTS[f"{run_id}:undo-b"] == 1, "a compensation journaled before the crash does not run again"
    assert step_status(d.client, run_id)["undo-a"] == "completed"


def test_a_crash_while_compensating_keeps_the_failure_it_undoes_though_the_step_would_pass_now(
    durable, raw_redis
) -> None:
    """SPEC §5c against §4: a failure is run again by a later attempt, unless
    its attempt began compensating it. Run again and passing, the step used to
    end the saga well: the journaled undo cut away, the rest never run, and
    the run completed with its bookings undone."""

    def flaky(rid: str) -> str:
        did(rid, "fail")
        if COUNTS[f"{rid}:fail"] == 1:
            raise RuntimeError("original")
        return "passed"

    def run(ctx: WorkflowContext) -> Any:
        rid = ctx.run_id
        with ctx.saga() as saga:
            saga.compensate("undo-a", lambda: (gate(rid).wait(TIMEOUT), did(rid, "undo-a"))[1])
            saga.compensate("undo-b", lambda: did(rid, "undo-b"))
            ctx.step("fail", lambda: flaky(rid))
        return "paid"

    d = durable([wf("crashy-flaky", run)], lease_seconds=2)
    run_id, envelope = crashed_at_undo_a(d, raw_redis, "crashy-flaky")
    assert (envelope.status, envelope.error) == ("error", "StepFailed: step 'fail' raised RuntimeError: original")
    assert COUNTS[f"{run_id}:fail"] == 1, "the failure the saga undid is not run again"
    assert COUNTS[f"{run_id}:undo-b"] == 1
    assert step_status(d.client, run_id)["undo-a"] == "completed"


def test_a_ceiling_reached_runs_nothing_in_that_attempt_and_the_next_compensates_there(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        rid = ctx.run_id
        with ctx.saga() as saga:
            saga.compensate("undo", lambda: did(rid, "undo"))
            ctx.step("slow", lambda: time.sleep(1.2))
            ctx.step("after", lambda: boom("fails once it runs"))

    d = durable([wf("capped", run, limits={"timeout_seconds": 1})])
    envelope = d.client.run_workflow("capped", timeout=TIMEOUT)
    assert (envelope.status, envelope.reason) == ("error", "workflow_limit_reached")
    assert DONE.get(envelope.run_id, []) == []
    resumed = d.client.resume_workflow(envelope.run_id, limits={"timeout_seconds": 60}, timeout=TIMEOUT)
    assert resumed.status == "error"
    assert resumed.error == "StepFailed: step 'after' raised RuntimeError: fails once it runs"
    assert DONE[envelope.run_id] == ["undo"]


def test_nested_sagas_and_sagas_in_branches_compensate_their_own_scope(durable) -> None:
    def nested(ctx: WorkflowContext) -> Any:
        rid = ctx.run_id
        with ctx.saga() as outer:
            outer.compensate("undo-outer", lambda: did(rid, "undo-outer"))
            try:
                with ctx.saga() as inner:
                    inner.compensate("undo-inner", lambda: did(rid, "undo-inner"))
                    ctx.step("inner-fails", lambda: boom("inner"))
            except StepFailed:
                did(rid, "caught-inside-outer")
            with ctx.saga() as second:
                second.compensate("undo-second", lambda: did(rid, "undo-second"))
                ctx.step("outer-fails", lambda: boom("outer"))

    def branches(ctx: WorkflowContext) -> Any:
        rid = ctx.run_id

        def branch(i: int) -> Any:
            with ctx.saga() as saga:
                ctx.step(f"book-{i}", lambda: did(rid, f"book-{i}"))
                saga.compensate(f"undo-{i}", lambda: did(rid, f"undo-{i}"))
                if i == 1:
                    ctx.step("fail-1", lambda: boom("branch 1"))
                return i

        with ctx.saga() as main:
            main.compensate("undo-main", lambda: did(rid, "undo-main"))
            return ctx.parallel([lambda i=i: branch(i) for i in range(3)])

    d = durable([wf("nested", nested), wf("branches", branches)])
    envelope = d.client.run_workflow("nested", timeout=TIMEOUT)
    assert envelope.status == "error"
    assert DONE[envelope.run_id] == ["undo-inner", "caught-inside-outer", "undo-second", "undo-outer"]

    fanned = d.client.run_workflow("branches", timeout=TIMEOUT)
    assert fanned.result == [0, None, 2]
    assert COUNTS[f"{fanned.run_id}:undo-1"] == 1
    assert not {"undo-0", "undo-2", "undo-main"} & set(DONE[fanned.run_id])


def test_compensate_checks_its_arguments(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        errors = []
        with ctx.saga() as saga:
            for key, producer in (("", lambda: 1), ("k", "not callable")):
                try:
                    saga.compensate(key, producer)  # type: ignore[arg-type]
                except ValueError as exc:
                    errors.append(str(exc))
        return errors

    d = durable([wf("bad-saga", run)])
    assert d.client.run_workflow("bad-saga", timeout=TIMEOUT).result == [
        "Compensation key must be a non-empty string of at most 1024 characters: ''",
        "Compensation 'k' producer must be callable, got str",
    ]


# -- a run cancelled while it stands settled but resumable, inside a saga -----------------


def test_a_paused_run_cancelled_inside_a_saga_compensates_once_in_one_more_attempt(durable) -> None:
    """cancel.lua does not settle a paused run whose saga registered undos: it
    gives it one attempt, whose pass meets the cancellation at its next call,
    runs the undos (each once) and settles cancelled (SPEC §5c)."""

    def run(ctx: WorkflowContext) -> Any:
        return book_two_then(ctx, lambda ctx: [ctx.step("long", lambda: gate(ctx.run_id).wait(TIMEOUT)),
                                               ctx.step("next", lambda: did(ctx.run_id, "next"))])

    d = durable([wf("pausy", run)])
    run_id = d.client.start_workflow("pausy")
    poll(lambda: step_status(d.client, run_id).get("long") == "running", within=RUN_BOUND, what="the long step")
    threading.Timer(0.3, gate(run_id).set).start()
    paused = d.client.pause_workflow_run(run_id, timeout=TIMEOUT)
    assert paused.status == "paused" and DONE[run_id] == ["book-a", "book-b"]
    envelope = d.client.cancel_workflow_run(run_id, timeout=TIMEOUT)
    assert (envelope.status, envelope.reason) == ("cancelled", "cancelled"), envelope.error
    assert envelope.attempt == paused.attempt + 1, "one more attempt ran, to compensate"
    assert DONE[run_id] == ["book-a", "book-b", "undo-b", "undo-a"], "'next' never ran; each undo ran once"
    assert (COUNTS[f"{run_id}:undo-a"], COUNTS[f"{run_id}:undo-b"]) == (1, 1)
    records = system_records(d.client, run_id)
    assert "Compensating after WorkflowCancelled: running undo-b, undo-a" in records
    assert records[-1] == "Run cancelled"
    kinds = [event.kind for event in d.client.get_workflow_run_history(run_id).events]
    assert max(kinds.index("cancel_requested"), kinds.index("resumed")) < kinds.index("compensation_started"), kinds


def test_a_halted_run_cancelled_inside_a_saga_compensates_and_one_without_a_saga_settles_at_once(
    durable, raw_redis
) -> None:
    """A halted run (its attempt died, auto_recover off) inside a saga gets the
    attempt that undoes its work; one whose code registered no undo is settled
    by the cancel itself, as before, with no worker needed."""
    from celery_durable.tasks.recovery import RecoverySweep

    def saga_run(ctx: WorkflowContext) -> Any:
        return book_two_then(ctx, lambda ctx: ctx.wait_for_signal("never"))

    def plain_run(ctx: WorkflowContext) -> Any:
        ctx.step("one", lambda: did(ctx.run_id, "one"))
        return ctx.wait_for_signal("never")

    d = durable([wf("halts", saga_run), wf("plain", plain_run)], auto_recover=False)
    runs = {name: d.client.start_workflow(name) for name in ("halts", "plain")}
    for run_id in runs.values():
        poll(
            lambda run_id=run_id: d.client.get_workflow_run(run_id).snapshot["waiting_for"],
            within=RUN_BOUND,
            what="the wait",
        )
        kill_attempt(raw_redis, d.engine, run_id)
    RecoverySweep(d.engine).sweep_once()
    for run_id in runs.values():
        poll(
            lambda run_id=run_id: d.client.get_workflow_run(run_id).status == "halted",
            within=RUN_BOUND,
            what="halted",
        )

    plain = d.client.cancel_workflow_run(runs["plain"], timeout=TIMEOUT)
    assert (plain.status, plain.error) == ("cancelled", "Cancelled while halted")
    halted = d.client.get_workflow_run(runs["halts"])
    envelope = d.client.cancel_workflow_run(runs["halts"], timeout=TIMEOUT)
    assert envelope.status == "cancelled", envelope.error
    assert envelope.attempt == halted.attempt + 1
    assert DONE[runs["halts"]] == ["book-a", "book-b", "undo-b", "undo-a"]


def test_a_run_stopped_on_nondeterminism_inside_a_saga_is_cancelled_at_once(durable) -> None:
    """A non-resumable error (nondeterminism, the code that diverged still
    registered) is not given the attempt a resumable one compensates in: that
    attempt would replay the same code, diverge again and end error, never
    meeting the cancellation, at every cancel (SPEC §8: non_resumable). The
    cancel settles it itself, as it does a run with nothing to undo; no pass
    runs its code again, so its undo does not run."""

    def run(ctx: WorkflowContext) -> Any:
        rid = ctx.run_id
        with ctx.saga() as saga:
            ctx.step("book", lambda: did(rid, "book"))
            saga.compensate("undo", lambda: did(rid, "undo"))
            COUNTS[f"{rid}:pass"] += 1
            ctx.step(f"pass-{COUNTS[f'{rid}:pass']}", lambda: did(rid, "keyed by the pass"))  # nondeterministic
            return ctx.wait_for_signal("never")

    d = durable([wf("diverges-in-saga", run)])
    run_id = d.client.start_workflow("diverges-in-saga")
    poll(lambda: d.client.get_workflow_run(run_id).snapshot["waiting_for"], within=RUN_BOUND, what="the wait")
    # A take-over replays the body from the top: its step key is another, and the run stops.
    stopped = d.client.resume_workflow(run_id, force=True, timeout=TIMEOUT)
    assert (stopped.status, stopped.reason, stopped.can_resume) == ("error", "nondeterminism", False), stopped.error
    passes = COUNTS[f"{run_id}:pass"]
    envelope = d.client.cancel_workflow_run(run_id, timeout=TIMEOUT)
    assert (envelope.status, envelope.reason, envelope.error) == ("cancelled", "cancelled", "Cancelled while error"), (
        envelope.status, envelope.reason, envelope.error,
    )  # fmt: skip
    assert envelope.attempt == stopped.attempt, "no attempt was given to it"
    assert COUNTS[f"{run_id}:pass"] == passes, "no pass ran its code again"
    assert DONE[run_id] == ["book", "keyed by the pass"], DONE[run_id]
    assert system_records(d.client, run_id)[-2:] == ["Cancel requested", "Run cancelled"]


def test_a_run_stopped_by_a_ceiling_inside_a_saga_and_cancelled_compensates_past_its_ceiling(durable) -> None:
    """A resumable error (a ceiling reached) is cancelled through one more
    attempt too; the ceiling that stopped it must not stop its undo."""

    def run(ctx: WorkflowContext) -> Any:
        rid = ctx.run_id
        with ctx.saga() as saga:
            saga.compensate("undo", lambda: did(rid, "undo"))
            ctx.step("slow", lambda: time.sleep(1.2))
            ctx.step("after", lambda: did(rid, "after"))

    d = durable([wf("capped-cancel", run, limits={"timeout_seconds": 1})])
    stopped = d.client.run_workflow("capped-cancel", timeout=TIMEOUT)
    assert (stopped.status, stopped.reason, stopped.can_resume) == ("error", "workflow_limit_reached", True)
    envelope = d.client.cancel_workflow_run(stopped.run_id, timeout=TIMEOUT)
    assert (envelope.status, envelope.reason) == ("cancelled", "cancelled"), envelope.error
    assert DONE[stopped.run_id] == ["undo"]


def test_an_undo_registered_from_a_branch_with_the_blocks_saga_is_refused_wherever_the_branch_runs(
    durable,
) -> None:
    """SPEC §5c: a saga's scope is its own sequence. An undo a branch registered
    with the saga of the block around its fan-out was run by the block's
    failure only where the fan-out's thunks ran in the same pass (in process,
    inline); on a fleet, where branches run as tasks and the pass after the
    fan-out takes their results from the journal, it was dropped: the
    branch's booking was never undone and nothing said so."""

    def run(ctx: WorkflowContext) -> Any:
        rid = ctx.run_id
        with ctx.saga() as saga:
            ctx.step("book-a", lambda: did(rid, "book-a"))
            saga.compensate("undo-a", lambda: did(rid, "undo-a"))

            def branch(i: int) -> Any:
                ctx.step(f"book-b{i}", lambda: did(rid, f"book-b{i}"))
                saga.compensate(f"undo-b{i}", lambda: did(rid, f"undo-b{i}"))
                return i

            ctx.parallel([lambda i=i: branch(i) for i in range(2)], errors="raise")
            ctx.step("fail", lambda: boom("no car left"))

    d = durable([wf("branch-undos", run)], fanout_tasks=2, branch_batch_ms=0)
    envelope = d.client.run_workflow("branch-undos", timeout=TIMEOUT)
    assert envelope.status == "error"
    assert envelope.error is not None and "registered in a branch with a saga opened outside it" in envelope.error, (
        envelope.error
    )
    assert sorted(DONE[envelope.run_id]) == ["book-a", "book-b0", "book-b1", "undo-a"]
