"""Child workflows (SPEC §5b): a run starts another registered workflow as its
child, waits for it holding no worker, and is woken when it ends.

Real Redis, real Celery workers (threads in this process); the crash tests
with worker processes killed by SIGKILL are in ``test_children_crash.py``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from typing import Any

import pytest

from celery_durable import ChildWorkflowFailed, RunNotFoundError, StepFailed, WorkflowContext
from celery_durable.broker import schema
from tests.conftest import kill_attempt
from tests.support.poll import RUN_BOUND, poll
from tests.support.workflows import wf

TIMEOUT = 30
COUNTS: Counter[str] = Counter()
LOCK = threading.Lock()
GATES: dict[str, threading.Event] = {}


def count(name: str) -> None:
    with LOCK:
        COUNTS[name] += 1


def gate(name: str) -> threading.Event:
    with LOCK:
        return GATES.setdefault(name, threading.Event())


def double(ctx: WorkflowContext) -> Any:
    count(f"{ctx.run_id}:double")
    ctx.log(f"doubling {ctx.args['n']}")
    return ctx.step("double", lambda: ctx.args["n"] * 2)


def held(ctx: WorkflowContext) -> Any:
    """Waits at a gate the test opens (by the run's key), in a step."""
    count(f"{ctx.args['gate']}:started")
    ctx.step("hold", lambda: gate(ctx.args["gate"]).wait(TIMEOUT))
    return ctx.step("done", lambda: ctx.args.get("value", "done"))


def failing(ctx: WorkflowContext) -> Any:
    if not gate(ctx.args["gate"]).is_set():
        ctx.step("fail", lambda: (_ for _ in ()).throw(RuntimeError("the child broke")))
    return "fixed"


def signalled(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go").payload


def nothing(ctx: WorkflowContext) -> None:
    ctx.step("noop", lambda: 1)


DOUBLE = wf(
    "double", double, args_schema={"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
)
HELD = wf("held", held)
FAILING = wf("failing", failing)
SIGNALLED = wf("signalled", signalled)
NOTHING = wf("nothing", nothing)
LEAVES = [DOUBLE, HELD, FAILING, SIGNALLED, NOTHING]


def child_of(client: Any, run_id: str, key: str) -> Any:
    return client.get_workflow_run(schema.child_run_id(run_id, key))


def waiting(client: Any, run_id: str) -> Any:
    """What the run waits for; None too while it does not exist yet."""
    try:
        return client.get_workflow_run(run_id).snapshot["waiting_for"]
    except RunNotFoundError:
        return None


# -- a child's result, identity and place --------------------------------------------------


def test_a_child_runs_as_its_own_run_and_its_result_is_journaled_under_the_key(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        first = ctx.child("first", "double", {"n": 21}, limits={"max_total_subagents": 3})
        again = ctx.child("first", DOUBLE, {"n": 1000})  # a key names one child: the journaled result
        none = ctx.child("nothing", NOTHING)
        return [first, again, none]

    d = durable([wf("parent", parent), *LEAVES], namespace="tenant-a")
    envelope = d.client.run_workflow("parent", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [42, 42, None]
    assert envelope.parent_run_id is None and envelope.to_dict()["parent_run_id"] is None

    child = child_of(d.client, envelope.run_id, "first")
    assert child.run_id == schema.child_run_id(envelope.run_id, "first")
    assert len(child.run_id) == 32 and child.run_id != envelope.run_id
    assert (child.workflow, child.namespace, child.status, child.result) == ("double", "tenant-a", "completed", 42)
    assert child.parent_run_id == envelope.run_id and child.to_dict()["parent_run_id"] == envelope.run_id
    assert child.limits == {"max_total_subagents": 3}
    assert COUNTS[f"{child.run_id}:double"] == 1, "one child run, its body run once"
    # Its own progress, in its own stream; listed in the namespace as any run.
    records = [r.message for r in d.client.get_workflow_run_progress(child.run_id).records]
    assert "doubling 21" in records
    assert "doubling 21" not in [r.message for r in d.client.get_workflow_run_progress(envelope.run_id).records]
    assert child.run_id in {run.run_id for run in d.client.list_workflow_runs(limit=10).runs}

    detail = d.client.get_workflow_run_detail(envelope.run_id)
    assert [(c.key, c.run_id, c.workflow, c.status, c.detached) for c in detail.children] == [
        ("first", child.run_id, "double", "completed", False),
        ("nothing", schema.child_run_id(envelope.run_id, "nothing"), "nothing", "completed", False),
    ]
    assert detail.to_dict()["children"][0] == {
        "key": "first", "run_id": child.run_id, "workflow": "double", "status": "completed", "detached": False,
    }
    assert d.client.get_workflow_run_detail(child.run_id).children == []


def test_a_waiting_parent_holds_no_worker_slot(durable) -> None:
    """One worker slot: the parent's pass must give it up for its children to run at all."""

    def parent(ctx: WorkflowContext) -> Any:
        return [ctx.child(f"c{i}", "double", {"n": i}) for i in range(3)]

    d = durable([wf("parent", parent), *LEAVES], concurrency=1)
    envelope = d.client.run_workflow("parent", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [0, 2, 4]


def test_children_in_parallel_and_pipeline_branches(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        fanned = ctx.parallel([lambda i=i: ctx.child(f"p{i}", "double", {"n": i}) for i in range(6)])
        staged = ctx.pipeline(
            [1, 2, 3],
            lambda prev, item, i: ctx.child(f"s{i}", "double", {"n": prev}),
            lambda prev, item, i: ctx.child(f"t{i}", "double", {"n": prev}),
        )
        return {"fanned": fanned, "staged": staged}

    d = durable([wf("parent", parent), *LEAVES], fanout_tasks=2)
    envelope = d.client.run_workflow("parent", timeout=60)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == {"fanned": [0, 2, 4, 6, 8, 10], "staged": [4, 8, 12]}
    assert len(d.client.get_workflow_run_detail(envelope.run_id).children) == 12


# -- waiting ---------------------------------------------------------------------------------


def test_while_it_waits_the_parent_says_for_which_child_and_a_paused_child_keeps_it_waiting(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        return ctx.child("kid", "signalled", timeout=600)

    d = durable([wf("parent", parent), *LEAVES])
    run_id = d.client.start_workflow("parent")
    kid = schema.child_run_id(run_id, "kid")
    summary = poll(lambda: waiting(d.client, run_id), within=RUN_BOUND, what="the parent to wait")
    assert summary["kind"] == "child" and summary["name"] == kid
    assert summary["until"] is not None  # the call's timeout
    assert d.client.get_workflow_run(run_id).status == "running"

    poll(lambda: waiting(d.client, kid), within=RUN_BOUND, what="the child to wait")
    assert d.client.pause_workflow_run(kid, timeout=10).status == "paused"
    # The pause settled the child (paused): its parent was told nothing, and waits on.
    assert "v:kid" not in d.engine.store.hashes(run_id).journal
    parent_now = d.client.get_workflow_run(run_id)
    assert parent_now.status == "running" and parent_now.snapshot["waiting_for"]["name"] == kid

    d.client.signal_workflow_run(kid, "go", {"ok": True})
    d.client.resume_workflow(kid, timeout=TIMEOUT)
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.result == {"ok": True}
    assert envelope.snapshot["waiting_for"] is None


def test_a_parent_recovered_while_its_child_runs_finds_the_same_child(durable, raw_redis) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        count(f"{ctx.run_id}:parent-pass")
        return ctx.child("kid", "held", {"gate": f"{ctx.run_id}-kid", "value": "from the child"})

    d = durable([wf("parent", parent), *LEAVES], lease_seconds=2)
    run_id = d.client.start_workflow("parent")
    poll(lambda: COUNTS[f"{run_id}-kid:started"], within=RUN_BOUND, what="the child to start")
    poll(lambda: waiting(d.client, run_id), within=RUN_BOUND, what="the parent to wait")
    kill_attempt(raw_redis, d.engine, run_id)
    poll(lambda: d.client.get_workflow_run(run_id).attempt == 2, within=RUN_BOUND, what="the parent's take-over")
    poll(lambda: COUNTS[f"{run_id}:parent-pass"] >= 2, within=RUN_BOUND, what="the recovered parent's pass")
    gate(f"{run_id}-kid").set()
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == "from the child"
    assert COUNTS[f"{run_id}-kid:started"] == 1, "a recovered parent never starts a second child"
    assert child_of(d.client, run_id, "kid").attempt == 1


def test_a_paused_parent_leaves_its_child_running_and_resumes_with_its_result(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        return ctx.child("kid", "signalled")

    d = durable([wf("parent", parent), *LEAVES])
    run_id = d.client.start_workflow("parent")
    kid = schema.child_run_id(run_id, "kid")
    poll(lambda: waiting(d.client, kid), within=RUN_BOUND, what="the child to wait")
    assert d.client.pause_workflow_run(run_id, timeout=10).status == "paused"
    assert d.client.get_workflow_run(kid).status == "running"
    d.client.signal_workflow_run(kid, "go", "while the parent was paused")
    assert d.client.wait_for_workflow_run(kid, timeout=TIMEOUT).status == "completed"
    assert d.client.get_workflow_run(run_id).status == "paused"
    resumed = d.client.resume_workflow(run_id, timeout=TIMEOUT)
    assert resumed.result == "while the parent was paused"
    assert d.client.get_workflow_run(kid).attempt == 1


# -- failures ------------------------------------------------------------------------------


def test_a_failed_child_raises_child_workflow_failed_and_a_resumed_parent_looks_again(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        try:
            return ctx.child("kid", "failing", {"gate": ctx.run_id})
        except ChildWorkflowFailed as exc:
            ctx.log(f"caught {exc.child_status} {exc.child_reason} {exc.child_run_id}")
            raise

    d = durable([wf("parent", parent), *LEAVES])
    envelope = d.client.run_workflow("parent", timeout=TIMEOUT)
    kid = schema.child_run_id(envelope.run_id, "kid")
    assert (envelope.status, envelope.reason, envelope.can_resume) == ("error", "exception", True)
    assert envelope.error is not None
    assert envelope.error.startswith("StepFailed: step 'kid' raised ChildWorkflowFailed: ")
    assert kid in envelope.error and "error" in envelope.error and "the child broke" in envelope.error
    logs = [r.message for r in d.client.get_workflow_run_progress(envelope.run_id).records]
    assert f"caught error exception {kid}" in logs

    # Not cached across attempts: the child fixed and resumed, the parent resumed gets its result.
    gate(envelope.run_id).set()
    assert d.client.resume_workflow(kid, timeout=TIMEOUT).status == "completed"
    resumed = d.client.resume_workflow(envelope.run_id, timeout=TIMEOUT)
    assert resumed.status == "completed", resumed.error
    assert resumed.result == "fixed"


def test_a_cancelled_child_fails_its_parent_call_as_a_step_failure(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        try:
            ctx.child("kid", "signalled")
        except ChildWorkflowFailed as exc:
            return {
                "key": exc.key, "error_type": exc.error_type, "status": exc.child_status,
                "reason": exc.child_reason, "run_id": exc.child_run_id, "is_step_failed": isinstance(exc, StepFailed),
            }
        return None

    d = durable([wf("parent", parent), *LEAVES])
    run_id = d.client.start_workflow("parent")
    kid = schema.child_run_id(run_id, "kid")
    poll(lambda: waiting(d.client, kid), within=RUN_BOUND, what="the child to wait")
    assert d.client.cancel_workflow_run(kid, timeout=10).status == "cancelled"
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.result == {
        "key": "kid", "error_type": "ChildWorkflowFailed", "status": "cancelled", "reason": "cancelled",
        "run_id": kid, "is_step_failed": True,
    }


def test_a_timeout_cancels_the_child_and_fails_the_call(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        try:
            ctx.child("slow", "signalled", timeout=1)
        except StepFailed as exc:
            return [exc.key, exc.error_type, str(exc)]
        return None

    d = durable([wf("parent", parent), *LEAVES])
    started = time.monotonic()
    envelope = d.client.run_workflow("parent", timeout=TIMEOUT)
    assert time.monotonic() - started < 10
    key, error_type, message = envelope.result
    slow = schema.child_run_id(envelope.run_id, "slow")
    assert (key, error_type) == ("slow", "ChildTimeout")
    assert slow in message and "did not finish within 1 s" in message
    assert d.client.wait_for_workflow_run(slow, timeout=TIMEOUT).status == "cancelled"


# -- keys, detached children, bad calls ------------------------------------------------------


def test_start_child_returns_at_once_and_a_later_child_call_waits_for_that_child(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        started = ctx.start_child("kid", "held", {"gate": f"{ctx.run_id}-kid", "value": 7})
        ctx.step("after-start", lambda: count(f"{ctx.run_id}:after-start"))
        return [started, ctx.child("kid", "held", {"gate": "ignored"})]

    d = durable([wf("parent", parent), *LEAVES])
    run_id = d.client.start_workflow("parent")
    kid = schema.child_run_id(run_id, "kid")
    poll(lambda: COUNTS[f"{run_id}:after-start"], within=RUN_BOUND, what="the parent to go on past start_child")
    assert d.client.get_workflow_run(kid).status in ("pending", "running")
    gate(f"{run_id}-kid").set()
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.result == [kid, 7]
    assert COUNTS[f"{run_id}-kid:started"] == 1


def test_a_key_reused_with_another_workflow_gets_the_journaled_child_and_a_warning(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        return [ctx.child("k", "double", {"n": 2}), ctx.child("k", "nothing")]

    d = durable([wf("parent", parent), *LEAVES])
    envelope = d.client.run_workflow("parent", timeout=TIMEOUT)
    assert envelope.result == [4, 4]
    system = [r.message for r in d.client.get_workflow_run_progress(envelope.run_id).records if r.kind == "system"]
    warnings = [m for m in system if "Child key k" in m]
    kid = schema.child_run_id(envelope.run_id, "k")
    assert warnings == [
        f"Child key k already names run {kid} of workflow double: that child is used, "
        "and workflow nothing is not started"
    ]
    assert [c.workflow for c in d.client.get_workflow_run_detail(envelope.run_id).children] == ["double"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ctx: ctx.child("k", "no-such-workflow"), "Unknown workflow: 'no-such-workflow'"),
        (lambda ctx: ctx.child("k", "double", {"n": "two"}), "n"),
        (lambda ctx: ctx.child("k", "double", {}), "n"),
        (lambda ctx: ctx.start_child("k", "double", {"n": 1}, limits={"retries": 3}), "retries"),
        (lambda ctx: ctx.child("", "double", {"n": 1}), "Child key"),
        (lambda ctx: ctx.child("k", "double", {"n": 1}, timeout=-1), "timeout"),
    ],
)
def test_a_bad_child_call_is_a_value_error_at_the_call_and_starts_nothing(durable, call: Any, message: str) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        try:
            call(ctx)
        except ValueError as exc:
            return str(exc)
        return "no error"

    d = durable([wf("parent", parent), *LEAVES])
    envelope = d.client.run_workflow("parent", timeout=TIMEOUT)
    assert message in envelope.result
    assert d.client.get_workflow_run_detail(envelope.run_id).children == []
    assert d.engine.store.load_run(schema.child_run_id(envelope.run_id, "k")) is None


@pytest.mark.parametrize("call", [lambda ctx: ctx.start_child("bad", "no-such-workflow"),
                                  lambda ctx: ctx.start_child("bad", "double", {"n": "two"})])
def test_a_bad_start_child_the_workflow_catches_raises_alike_on_every_replay(durable, call: Any) -> None:
    """The check runs before the journal is read, as for ctx.child: a replay that
    finds the next start journaled where the bad one was asked still raises it."""

    def parent(ctx: WorkflowContext) -> Any:
        with contextlib.suppress(ValueError):
            call(ctx)
        kid = ctx.start_child("good", "double", {"n": 1})
        ctx.sleep(0.05)  # a second pass replays the rejected call
        return kid

    d = durable([wf("parent", parent), *LEAVES])
    envelope = d.client.run_workflow("parent", timeout=TIMEOUT)
    assert (envelope.status, envelope.error) == ("completed", None)
    assert [c.key for c in d.client.get_workflow_run_detail(envelope.run_id).children] == ["good"]


# -- cancelling the parent -------------------------------------------------------------------


def test_cancelling_the_parent_cancels_its_waited_for_children_first_but_not_detached_ones(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        ctx.start_child("loose", "signalled")
        return ctx.parallel([lambda: ctx.child("a", "signalled"), lambda: ctx.child("b", "signalled")])

    d = durable([wf("parent", parent), *LEAVES])
    run_id = d.client.start_workflow("parent")
    kids = {key: schema.child_run_id(run_id, key) for key in ("a", "b", "loose")}
    for kid in kids.values():
        poll(lambda kid=kid: waiting(d.client, kid), within=RUN_BOUND, what="every child to wait")
    envelope = d.client.cancel_workflow_run(run_id, timeout=10)
    assert envelope.status == "cancelled"
    for key in ("a", "b"):
        child = d.client.wait_for_workflow_run(kids[key], timeout=TIMEOUT)
        assert child.status == "cancelled"
        cancel_seen = next(r for r in d.client.get_workflow_run_progress(kids[key]).records if r.kind == "system")
        assert cancel_seen.at <= envelope.finished_at  # asked of the child before the parent settled
    assert d.client.get_workflow_run(kids["loose"]).status == "running"
    detail = d.client.get_workflow_run_detail(run_id)
    assert {(c.key, c.detached) for c in detail.children} == {("a", False), ("b", False), ("loose", True)}
    d.client.signal_workflow_run(kids["loose"], "go", "free")
    assert d.client.wait_for_workflow_run(kids["loose"], timeout=TIMEOUT).result == "free"


def test_a_parent_cancelled_while_its_child_is_being_started_leaves_no_orphan(durable) -> None:
    """The parent's attempt journaled the call and died before it created the
    child; the parent is cancelled; the dead attempt's start, should it still
    come, finds the child cancelled and starts nothing."""
    from celery_durable.tasks.children import EngineChildren

    def parent(ctx: WorkflowContext) -> Any:
        ctx.wait_for_signal("go")
        return ctx.child("kid", "double", {"n": 1})

    d = durable([wf("parent", parent), *LEAVES])
    run_id = d.client.start_workflow("parent")
    poll(lambda: waiting(d.client, run_id), within=RUN_BOUND, what="the parent to wait")
    record = d.engine.store.load_run(run_id)
    assert record is not None
    # What its pass would have journaled had the signal come: the call, at op 1 of the main body.
    journal = d.engine.store.journal(run_id, record.epoch, record.namespace)
    kid = schema.child_run_id(run_id, "kid")
    journal.child("m", 1, "kid", "m", None, None, kid, "double", wait=True)
    assert d.engine.store.load_run(kid) is None

    assert d.client.cancel_workflow_run(run_id, timeout=10).status == "cancelled"
    child = d.client.get_workflow_run(kid)
    assert (child.status, child.started_at, child.parent_run_id) == ("cancelled", None, run_id)

    ports = EngineChildren(d.engine, record)
    request = _request(d, ports, run_id, "kid", "double", {"n": 1})
    state = ports.start(request)
    assert (state.created, state.status) == (False, "cancelled")
    assert d.client.get_workflow_run(kid).status == "cancelled"
    assert COUNTS[f"{kid}:double"] == 0


def _request(d: Any, ports: Any, run_id: str, key: str, workflow: str, args: Any) -> Any:
    from celery_durable.workflows import jsonvalue
    from celery_durable.workflows.children import ChildRequest

    definition = ports.resolve(workflow)
    return ChildRequest(
        key=key, run_id=schema.child_run_id(run_id, key), workflow=definition, args=args,
        args_json=jsonvalue.dumps(args), limits_json="{}", ceilings={},
    )


def test_a_child_whose_worker_died_before_it_told_its_parent_is_told_by_the_sweep(durable) -> None:
    """The child settles, and its worker dies before its parent hears of it:
    settled here by hand, as the child's attempt would, with nothing told."""

    def parent(ctx: WorkflowContext) -> Any:
        return ctx.child("kid", "signalled")

    d = durable([wf("parent", parent), *LEAVES], lease_seconds=2)
    run_id = d.client.start_workflow("parent")
    kid = schema.child_run_id(run_id, "kid")
    poll(lambda: waiting(d.client, kid), within=RUN_BOUND, what="the child to wait")
    record = d.engine.store.load_run(kid)
    assert record is not None
    started = time.monotonic()
    d.engine.store.finish(kid, record.epoch, record.namespace, "completed", result_json='"settled by hand"', watch=True)
    assert "v:kid" not in d.engine.store.hashes(run_id).journal  # the parent was told nothing
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.result == "settled by hand"
    assert time.monotonic() - started < 2 * d.settings.lease_seconds + 5  # a lease, and the sweep's look


def test_a_replay_check_reads_children_from_the_journal_and_starts_none(durable) -> None:
    def parent(ctx: WorkflowContext) -> Any:
        ctx.start_child("loose", "nothing")
        done = ctx.child("kid", "double", {"n": 2})
        return [done, ctx.child("late", "signalled")]

    d = durable([wf("parent", parent), *LEAVES])
    run_id = d.client.start_workflow("parent")
    late = schema.child_run_id(run_id, "late")
    poll(lambda: waiting(d.client, late), within=RUN_BOUND, what="the second child to wait")
    before = {run.run_id for run in d.client.list_workflow_runs(limit=50).runs}
    [check] = d.client.check_replay([run_id])
    assert (check.verdict, check.message) == ("ok", "")
    assert {run.run_id for run in d.client.list_workflow_runs(limit=50).runs} == before
    d.client.signal_workflow_run(late, "go", "late")
    assert d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT).result == [4, "late"]
    [check] = d.client.check_replay([run_id])
    assert check.verdict == "ok"
