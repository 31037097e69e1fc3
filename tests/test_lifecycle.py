"""The life of a run through the client (SPEC §3, §4 Determinism, §7, §8, §12).

Start, wait, list, namespaces, cancellation, non-determinism, resume (with its
fence) and progress paging, against a real Redis and real Celery workers.
Steps that must hold still block on a ``threading.Event`` the test sets.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery.signals import task_postrun

from celery_durable import (
    RunEnvelope,
    RunNotFoundError,
    WorkflowCancelled,
    WorkflowDefinitionError,
    WorkflowResumeError,
    WorkflowWaitCancelled,
    define_workflow,
)
from tests.support.poll import RUN_BOUND, poll

GATE_SECONDS = 20
"""How long a gated step waits for the test before it gives up (a safety net, not a pause)."""

SNAPSHOT_KEYS = {
    "phase",
    "steps_done",
    "steps_running",
    "agents_done",
    "agents_running",
    "subagents_used",
    "ai_credits",
    "waiting_for",
}


def make_workflow(name: str, run: Callable[[Any], Any], *phases: str, **meta: Any) -> Any:
    return define_workflow(
        {"name": name, "description": f"{name} (lifecycle test)", "phases": [{"title": t} for t in phases], **meta},
        run,
    )


def gate(entered: threading.Event, release: threading.Event, value: Any) -> Any:
    """A step body that announces it started, then holds until the test releases it."""
    entered.set()
    if not release.wait(GATE_SECONDS):
        raise RuntimeError("the test never released this step")
    return value


def assert_utc(value: datetime | None) -> None:
    assert value is not None
    assert value.tzinfo is not None
    assert value.utcoffset() == timedelta(0)


def run_keys(raw_redis: Any, prefix: str) -> set[str]:
    return set(raw_redis.keys(f"{prefix}:*"))


@contextlib.contextmanager
def finished_tasks() -> Iterator[list[tuple[str, str, int]]]:
    """(task name, run id, epoch) of every celery-durable task that has returned, in order."""
    done: list[tuple[str, str, int]] = []

    def on_postrun(task: Any = None, kwargs: Any = None, **_: Any) -> None:
        if task is not None and kwargs:
            done.append((task.name, kwargs.get("run_id"), kwargs.get("epoch")))

    task_postrun.connect(on_postrun, weak=False)
    try:
        yield done
    finally:
        task_postrun.disconnect(on_postrun)


def resume_error(call: Callable[[], Any]) -> WorkflowResumeError:
    with pytest.raises(WorkflowResumeError) as info:
        call()
    return info.value


# -- start, get, wait, the envelope ------------------------------------------


@pytest.mark.topologies("redis", "cluster", "rabbitmq")
def test_start_returns_at_once_and_wait_returns_the_terminal_envelope(durable) -> None:
    entered, release = threading.Event(), threading.Event()

    def run(ctx):
        ctx.phase("Prepare")
        a = ctx.step("a", lambda: 1)
        b = ctx.step("b", lambda: 2)
        again = ctx.step("a", lambda: 99)  # the key is the identity: journaled value, no new step
        ctx.step("noise", lambda: 5, volatile=True)  # runs, journals nothing
        ctx.phase("Finish")
        c = ctx.step("gate", lambda: gate(entered, release, 3))
        return {"sum": a + b + c, "again": again}

    d = durable([make_workflow("lifecycle", run, "Prepare", "Finish")])
    try:
        run_id = d.client.start_workflow("lifecycle", args={"who": "test"})
        # start_workflow returned although the run cannot finish until released.
        assert isinstance(run_id, str) and run_id
        assert d.client.get_workflow_run(run_id).status in ("pending", "running")
        assert entered.wait(10)

        running = d.client.get_workflow_run(run_id)
        assert running.status == "running"
        assert running.can_resume is False
        assert running.attempt == 1
        assert running.finished_at is None
        assert_utc(running.started_at)
        assert running.snapshot["steps_done"] == 2
        assert running.snapshot["steps_running"] == 1
        assert running.snapshot["phase"] == "Finish"

        with pytest.raises(TimeoutError):
            d.client.wait_for_workflow_run(run_id, timeout=0.3)

        stop_waiting = threading.Event()
        setter = threading.Thread(target=stop_waiting.set)
        setter.start()
        with pytest.raises(WorkflowWaitCancelled):
            d.client.wait_for_workflow_run(run_id, timeout=10, cancel_event=stop_waiting)
        setter.join()
        # Cancelling the wait did not cancel the run.
        assert d.client.get_workflow_run(run_id).status == "running"
    finally:
        release.set()

    envelope = d.client.wait_for_workflow_run(run_id, timeout=20)
    assert isinstance(envelope, RunEnvelope)
    assert envelope.status == "completed"
    assert envelope.result == {"sum": 6, "again": 1}
    assert envelope.has_result is True
    assert envelope.reason is None
    assert envelope.error is None
    assert envelope.attempt == 1
    assert envelope.can_resume is False
    assert envelope.run_id == run_id
    assert envelope.workflow == "lifecycle"
    assert envelope.namespace == "default"
    assert envelope.args == {"who": "test"}

    for moment in (envelope.created_at, envelope.started_at, envelope.finished_at):
        assert_utc(moment)
    assert envelope.created_at <= envelope.started_at <= envelope.finished_at

    assert set(envelope.snapshot) == SNAPSHOT_KEYS
    assert envelope.snapshot["steps_done"] == 3  # a, b, gate: not the repeated key, not the volatile step
    assert envelope.snapshot["steps_running"] == 0
    assert envelope.snapshot["phase"] == "Finish"
    assert envelope.snapshot["waiting_for"] is None

    data = envelope.to_dict()
    json.dumps(data)
    assert data["result"] == {"sum": 6, "again": 1}
    assert data["reason"] is None
    assert set(data["snapshot"]) == SNAPSHOT_KEYS
    for name in ("created_at", "started_at", "finished_at"):
        assert isinstance(data[name], str)
        assert datetime.fromisoformat(data[name]) == getattr(envelope, name)

    # A wait on a settled run returns at once, the same envelope.
    assert d.client.wait_for_workflow_run(run_id, timeout=1) == envelope


# -- idempotency, listing, namespaces (no worker needed) ---------------------


@pytest.mark.topologies("redis", "cluster")
def test_idempotency_key_is_scoped_to_the_namespace(durable, raw_redis) -> None:
    wf = make_workflow("idem", lambda ctx: None)
    d = durable([wf], worker=False)
    other = durable([wf], worker=False, namespace="other")

    first = d.client.start_workflow("idem", args={"n": 1}, idempotency_key="order-42")
    assert d.client.start_workflow("idem", args={"n": 2}, idempotency_key="order-42") == first
    second = d.client.start_workflow("idem", idempotency_key="order-43")
    assert second != first

    elsewhere = other.client.start_workflow("idem", idempotency_key="order-42")
    assert elsewhere not in (first, second)
    assert other.client.start_workflow("idem", idempotency_key="order-42") == elsewhere

    # Racing starts with one key agree on one run.
    barrier = threading.Barrier(6)
    raced: list[str] = []

    def racer() -> None:
        barrier.wait(5)
        raced.append(d.client.start_workflow("idem", idempotency_key="race"))

    threads = [threading.Thread(target=racer) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(raced) == 6 and len(set(raced)) == 1
    third = raced[0]

    # The duplicate starts left no run behind.
    prefix = d.settings.key_prefix
    assert sum(1 for _ in raw_redis.scan_iter(match=f"{prefix}:*:run", count=1000)) == 4  # every node of a cluster
    assert {run.run_id for run in d.client.list_workflow_runs().runs} == {first, second, third}
    assert [run.run_id for run in other.client.list_workflow_runs().runs] == [elsewhere]
    assert d.client.get_workflow_run(first).args == {"n": 1}


def test_runs_of_another_namespace_and_unknown_ids_are_not_found(durable) -> None:
    wf = make_workflow("scoped", lambda ctx: None)
    d = durable([wf], worker=False)
    other = durable([wf], worker=False, namespace="other")
    run_id = d.client.start_workflow(wf)

    pending = d.client.get_workflow_run(run_id)
    assert pending.status == "pending"
    assert pending.attempt == 1
    assert pending.can_resume is False
    assert pending.started_at is None and pending.finished_at is None
    assert_utc(pending.created_at)
    assert set(pending.snapshot) == SNAPSHOT_KEYS

    for client, missing in [(other.client, run_id), (d.client, uuid.uuid4().hex), (d.client, "no-such-run")]:
        calls: list[Callable[[], Any]] = [
            lambda c=client, r=missing: c.get_workflow_run(r),
            lambda c=client, r=missing: c.get_workflow_run_progress(r),
            lambda c=client, r=missing: c.get_workflow_run_detail(r),
            lambda c=client, r=missing: c.cancel_workflow_run(r, timeout=1),
            lambda c=client, r=missing: c.wait_for_workflow_run(r, timeout=1),
        ]
        for call in calls:
            with pytest.raises(RunNotFoundError) as info:
                call()
            assert isinstance(info.value, LookupError)
            assert info.value.code == "not_found"
        assert resume_error(lambda c=client, r=missing: c.resume_workflow(r, timeout=1)).code == "not_found"

    assert other.client.list_workflow_runs().runs == []
    # The refused cancel from the other namespace did not touch the run.
    record = d.engine.store.load_run(run_id)
    assert record is not None and not record.cancel_requested and record.epoch == 1
    assert d.client.get_workflow_run(run_id).status == "pending"


def test_refused_calls_write_nothing(durable, raw_redis) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    wf = make_workflow("strict", lambda ctx: None, args_schema=schema)
    stranger = make_workflow("stranger", lambda ctx: None)
    d = durable([wf], worker=False)
    d.client.start_workflow("strict", args={"n": 1})  # so there is something to compare

    prefix = d.settings.key_prefix
    before = run_keys(raw_redis, prefix)
    queued = raw_redis.llen(d.settings.coordinator_queue)
    assert queued == 1

    with pytest.raises(ValueError, match="nope"):
        d.client.start_workflow("nope")
    with pytest.raises(ValueError, match="stranger"):
        d.client.start_workflow(stranger)
    with pytest.raises(ValueError, match=r"\['n'\]"):
        d.client.start_workflow("strict", args={"n": "one"})
    with pytest.raises(ValueError, match=r"\['n'\]"):
        d.client.run_workflow("strict", args={"n": "one"}, timeout=1)
    with pytest.raises(ValueError, match="JSON"):
        d.client.start_workflow("strict", args={"n": 1, "when": object()})
    with pytest.raises(WorkflowDefinitionError, match="retries"):
        d.client.start_workflow("strict", args={"n": 1}, limits={"retries": 3})
    with pytest.raises(WorkflowDefinitionError, match="timeout_seconds"):
        d.client.start_workflow("strict", args={"n": 1}, limits={"timeout_seconds": 0})
    with pytest.raises(ValueError, match="idempotency_key"):
        d.client.start_workflow("strict", args={"n": 1}, idempotency_key="")

    assert run_keys(raw_redis, prefix) == before
    assert raw_redis.llen(d.settings.coordinator_queue) == queued
    assert len(d.client.list_workflow_runs().runs) == 1


@pytest.mark.topologies("redis", "cluster")
def test_list_workflow_runs_newest_first_with_filters_and_paging(durable) -> None:
    def boom(ctx):
        ctx.step("explode", lambda: 1 / 0)

    ok = make_workflow("ok", lambda ctx: ctx.step("fine", lambda: "fine"))
    d = durable([ok, make_workflow("boom", boom)])
    ids = []
    for name in ("ok", "boom", "ok", "boom", "ok"):
        envelope = d.client.run_workflow(name, timeout=20)
        assert envelope.status == ("completed" if name == "ok" else "error")
        ids.append(envelope.run_id)
    newest_first = ids[::-1]

    assert [run.run_id for run in d.client.list_workflow_runs().runs] == newest_first

    seen: list[str] = []
    pages = 0
    cursor = None
    while True:
        page = d.client.list_workflow_runs(limit=2, cursor=cursor)
        pages += 1
        assert len(page.runs) <= 2
        seen.extend(run.run_id for run in page.runs)
        if page.next_cursor is None:
            break
        assert isinstance(page.next_cursor, str)
        cursor = page.next_cursor
    assert seen == newest_first
    assert pages == 3

    assert [r.run_id for r in d.client.list_workflow_runs(status="error").runs] == [ids[3], ids[1]]
    assert [r.run_id for r in d.client.list_workflow_runs(workflow="ok").runs] == [ids[4], ids[2], ids[0]]
    assert d.client.list_workflow_runs(status="completed", workflow="boom").runs == []
    assert all(r.status == "error" and r.workflow == "boom" for r in d.client.list_workflow_runs(status="error").runs)

    filtered: list[str] = []
    cursor = None
    for _ in range(5):
        page = d.client.list_workflow_runs(workflow="ok", limit=2, cursor=cursor)
        filtered.extend(run.run_id for run in page.runs)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert cursor is None
    assert filtered == [ids[4], ids[2], ids[0]]
    # The last matching runs are not the oldest runs: still no cursor to an empty page.
    last = d.client.list_workflow_runs(status="error", limit=2)
    assert [r.run_id for r in last.runs] == [ids[3], ids[1]]
    assert last.next_cursor is None

    for kwargs, option in [
        ({"status": "finished"}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"limit": True}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": 7}, "cursor"),
        ({"workflow": 7}, "workflow"),
    ]:
        with pytest.raises(ValueError, match=option):
            d.client.list_workflow_runs(**kwargs)


# -- cancellation --------------------------------------------------------------


def test_cancel_while_a_step_is_blocked_ends_the_run_cancelled(durable) -> None:
    entered, release = threading.Event(), threading.Event()
    seen: list[str] = []
    after_calls: list[str] = []

    def run(ctx):
        ctx.step("blocker", lambda: gate(entered, release, "done"))
        try:
            ctx.step("after", lambda: after_calls.append("ran") or "after")
        except WorkflowCancelled:
            seen.append("WorkflowCancelled")  # swallowed: the run must end cancelled all the same
        return "survived"

    d = durable([make_workflow("cancel-blocked", run)])
    run_id = d.client.start_workflow("cancel-blocked")
    assert entered.wait(10)

    result: dict[str, Any] = {}

    def cancel() -> None:
        try:
            result["envelope"] = d.client.cancel_workflow_run(run_id, timeout=20)
        except BaseException as exc:  # surfaced by the assertions below
            result["error"] = exc

    canceller = threading.Thread(target=cancel)
    canceller.start()
    try:
        poll(lambda: d.engine.store.load_run(run_id).cancel_requested, within=RUN_BOUND, what="the cancel request")
    finally:
        release.set()
    canceller.join(30)
    assert "error" not in result, result.get("error")

    envelope = result["envelope"]
    assert envelope.status == "cancelled"
    assert envelope.has_result is False
    assert envelope.can_resume is False
    assert seen == ["WorkflowCancelled"]
    assert after_calls == []
    assert envelope.snapshot["steps_done"] == 1  # the blocked step finished and was journaled
    records = d.client.get_workflow_run_progress(run_id).records
    assert any(r.kind == "system" and "cancel" in r.message.lower() for r in records)


def test_cancel_stops_code_that_checks_ctx_cancelled(durable) -> None:
    entered = threading.Event()
    rounds: list[int] = []

    def run(ctx):
        ctx.step("start", lambda: 1)
        entered.set()
        count = 0
        while not ctx.cancelled() and count < 2000:  # the bound is a safety net of 20 s
            count += 1
            ctx.cancel_event.wait(0.01)
        rounds.append(count)
        return "stopped by itself"

    d = durable([make_workflow("cancel-loop", run)])
    run_id = d.client.start_workflow("cancel-loop")
    assert entered.wait(10)
    envelope = d.client.cancel_workflow_run(run_id, timeout=15)
    assert envelope.status == "cancelled"
    assert envelope.has_result is False
    assert len(rounds) == 1 and rounds[0] < 2000
    # Settled for good: cancelling again changes nothing, resuming is refused.
    assert d.client.cancel_workflow_run(run_id, timeout=5) == envelope
    assert resume_error(lambda: d.client.resume_workflow(run_id, timeout=5)).code == "non_resumable"


@pytest.mark.parametrize("in_pass", [False, True], ids=["branch-tasks", "in-the-pass"])
@pytest.mark.topologies("redis", "cluster", "rabbitmq")
def test_cancel_a_run_waiting_on_a_parallel_fan_out(durable, in_pass) -> None:
    """Each branch blocks until its attempt learns of the cancel. As tasks
    (branch_batch_ms 0) all three are abandoned. Run by the coordinator's
    pass (InlineBranches), the first is the pass's own: it returns when the
    pass learns of the cancel, and is journaled before the pass settles the
    run; the two it handed on are abandoned. An abandoned branch returns only
    once the run has settled: one that learned of the cancel (its task's
    heartbeat) before the pass settled would be journaled, as any step that
    ends before its run does (a race the loaded machine lost 1 time in 16)."""
    size = 3
    first_abandoned = 1 if in_pass else 0
    entered = [threading.Event() for _ in range(size)]
    noticed = [threading.Event() for _ in range(size)]
    settled = threading.Event()

    def branch(ctx, i):
        entered[i].set()
        if ctx.cancel_event.wait(GATE_SECONDS):  # blocks until the branch's attempt learns of the cancel
            noticed[i].set()
        if i >= first_abandoned:
            settled.wait(GATE_SECONDS)  # its result comes late
        return i

    def run(ctx):
        ctx.step("before", lambda: 0)
        return ctx.parallel([lambda i=i: ctx.step(f"branch-{i}", lambda: branch(ctx, i)) for i in range(size)])

    def branch_rows() -> dict[str, str]:
        steps = d.client.get_workflow_run_detail(run_id).steps
        return {row.key: row.status for row in steps if row.key.startswith("branch-")}

    d = durable([make_workflow("cancel-fanout", run)], branch_batch_ms=20 if in_pass else 0)
    abandoned = {f"branch-{i}": "interrupted" for i in range(first_abandoned, size)}
    with finished_tasks() as done:
        run_id = d.client.start_workflow("cancel-fanout")
        for event in entered:
            assert event.wait(10)
        assert d.client.get_workflow_run(run_id).snapshot["steps_running"] == size

        envelope = d.client.cancel_workflow_run(run_id, timeout=15)
        settled.set()
        assert envelope.status == "cancelled"
        assert envelope.has_result is False
        # A settled run has no step left running: the abandoned branches are interrupted.
        assert envelope.snapshot["steps_running"] == 0
        rows = branch_rows()
        assert {key: rows[key] for key in abandoned} == abandoned, rows
        if in_pass:
            assert rows["branch-0"] == "completed", rows

        # Every blocked branch learns of it through its attempt's cancel_event,
        # and its late result changes nothing.
        for event in noticed:
            assert event.wait(10)
        poll(lambda: sum(1 for name, rid, _ in done if name == "celery_durable.branch" and rid == run_id)
            == len(abandoned), within=RUN_BOUND, what="the branch tasks to end")
    after = d.client.get_workflow_run(run_id)
    assert after == envelope
    assert branch_rows() == rows


# -- non-determinism -------------------------------------------------------------

PASSES = {"count": 0}
"""Module state the non-deterministic workflow (wrongly) reads: it changes on every pass."""


def shifty_run(ctx):
    key = "first" if PASSES["count"] == 0 else "second"
    PASSES["count"] += 1
    ctx.step(key, lambda: 1)
    ctx.parallel([lambda: "branch"])  # sent as a task, so a second pass replays the body after the fan-out
    return "unreachable"


def fixed_run(ctx):
    ctx.step("first", lambda: 1)
    ctx.parallel([lambda: "branch"])
    return "fixed"


DEPLOYED: dict[str, Callable[[Any], Any]] = {"run": shifty_run}
"""The code the test's worker runs. Two live workers in one process upset kombu's
Redis transport, so a code deploy is simulated: the worker's workflow calls
whatever is deployed, and a second engine (without a worker) registers the new
code under the same name, which is what the client's code-hash check sees."""


def deployed_run(ctx):
    return DEPLOYED["run"](ctx)


def test_nondeterminism_stops_the_run_and_only_a_code_change_resumes_it(durable) -> None:
    PASSES["count"] = 0
    DEPLOYED["run"] = shifty_run
    old = durable([make_workflow("shifty", deployed_run)], branch_batch_ms=0)  # the fan-out sent: a second pass
    run_id = old.client.start_workflow("shifty")
    envelope = old.client.wait_for_workflow_run(run_id, timeout=20)
    assert envelope.status == "error"
    assert envelope.reason == "nondeterminism"
    assert "expected first, got second" in envelope.error
    assert envelope.can_resume is False
    assert envelope.has_result is False

    assert resume_error(lambda: old.client.resume_workflow(run_id, timeout=5)).code == "non_resumable"

    DEPLOYED["run"] = fixed_run
    new = durable([make_workflow("shifty", fixed_run)], worker=False)
    assert resume_error(lambda: new.client.resume_workflow(run_id, timeout=5)).code == "workflow_code_changed"
    assert new.client.get_workflow_run(run_id).attempt == 1

    resumed = new.client.resume_workflow(run_id, allow_code_change=True, timeout=20)
    assert resumed.status == "completed"
    assert resumed.result == "fixed"
    assert resumed.attempt == 2
    assert resumed.reason is None


def test_a_completed_run_is_non_resumable_under_changed_code_too(durable) -> None:
    old = durable([make_workflow("settled", lambda ctx: "v1")])
    run_id = old.client.run_workflow("settled", timeout=20).run_id
    new = durable([make_workflow("settled", lambda ctx: "v2")], worker=False)
    for allow_code_change in (False, True):
        refused = resume_error(lambda a=allow_code_change: new.client.resume_workflow(run_id, allow_code_change=a))
        assert refused.code == "non_resumable", refused


# -- resume ------------------------------------------------------------------------


@pytest.mark.topologies("redis", "cluster", "rabbitmq")
def test_resume_after_a_failed_step_reruns_only_that_step(durable) -> None:
    calls: Counter[str] = Counter()

    def produce(name: str, value: int) -> int:
        calls[name] += 1
        return value

    def flaky() -> int:
        calls["b"] += 1
        if calls["b"] == 1:
            raise RuntimeError("transient outage")
        return 20

    def run(ctx):
        ctx.log("starting")
        a = ctx.step("a", lambda: produce("a", 1))
        ctx.log("a done")
        b = ctx.step("b", flaky)
        ctx.log("b done")
        c = ctx.step("c", lambda: produce("c", 300))
        return a + b + c

    d = durable([make_workflow("flaky", run)])
    failed = d.client.run_workflow("flaky", timeout=20)
    assert failed.status == "error"
    assert failed.reason == "exception"
    assert failed.can_resume is True
    assert "transient outage" in failed.error and "RuntimeError" in failed.error
    assert calls == {"a": 1, "b": 1}

    resumed = d.client.resume_workflow(failed.run_id, timeout=20)
    assert resumed.status == "completed"
    assert resumed.result == 321
    assert resumed.attempt == 2
    assert resumed.reason is None and resumed.error is None
    assert calls == {"a": 1, "b": 2, "c": 1}
    assert resumed.snapshot["steps_done"] == 3

    records = d.client.get_workflow_run_progress(failed.run_id).records
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    # The replay re-ran ctx.log calls of attempt 1; none was written twice (SPEC §7).
    logs = [(r.message, r.attempt) for r in records if r.kind == "log"]
    assert logs == [("starting", 1), ("a done", 1), ("b done", 2)]
    assert any(r.kind == "system" and "resum" in r.message.lower() and r.attempt == 2 for r in records)


def test_resume_refusals_on_a_completed_run(durable) -> None:
    d = durable([make_workflow("done", lambda ctx: ctx.step("only", lambda: "ok"))])
    completed = d.client.run_workflow("done", timeout=20)
    assert completed.status == "completed"

    # Cancelling a completed run changes nothing.
    assert d.client.cancel_workflow_run(completed.run_id, timeout=5) == completed

    assert resume_error(lambda: d.client.resume_workflow(completed.run_id, timeout=5)).code == "non_resumable"
    for limits in ({"retries": 1}, {"max_total_subagents": 0}, {"timeout_seconds": float("inf")}, "lots"):
        error = resume_error(lambda limits=limits: d.client.resume_workflow(completed.run_id, limits=limits))
        assert error.code == "workflow_limits_invalid"
    error = resume_error(lambda: d.client.resume_workflow(uuid.uuid4().hex, timeout=5))
    assert error.code == "not_found"
    assert d.client.get_workflow_run(completed.run_id) == completed


@pytest.mark.topologies("redis", "rabbitmq")
def test_force_resume_takes_over_and_fences_out_the_old_attempt(durable, raw_redis) -> None:
    entered, release = threading.Event(), threading.Event()
    seen: dict[int, str] = {}

    def produce(attempt: int) -> str:
        if attempt == 1:
            return gate(entered, release, "from-attempt-1")
        return f"from-attempt-{attempt}"

    after: list[int] = []

    def run(ctx):
        attempt = ctx.attempt
        try:
            value = ctx.step("slow", lambda: produce(attempt))
            # The write of "slow" travels with this call's, and is refused.
            ctx.step("after", lambda: after.append(attempt))
            return value
        except Exception as exc:  # the old attempt tries to carry on and finish anyway
            seen[attempt] = type(exc).__name__
            return f"attempt-{attempt}-gave-up"

    d = durable([make_workflow("takeover", run)])
    with finished_tasks() as done:
        run_id = d.client.start_workflow("takeover")
        try:
            assert entered.wait(10)
            assert resume_error(lambda: d.client.resume_workflow(run_id, timeout=5)).code == "already_active"
            still = d.client.get_workflow_run(run_id)
            assert (still.status, still.attempt, still.can_resume) == ("running", 1, False)

            resumed = d.client.resume_workflow(run_id, force=True, timeout=20)
        finally:
            release.set()
        assert resumed.status == "completed"
        assert resumed.attempt == 2
        assert resumed.result == "from-attempt-2"

        # Attempt 1 wakes up: its step result, and its attempt to finish, are refused.
        poll(
            lambda: ("celery_durable.coordinator", run_id, 1) in done,
            within=RUN_BOUND,
            what="attempt 1's coordinator task to end",
        )

    assert seen == {1: "StaleAttemptError"}
    assert after == [2], "the old attempt ran no work past its refused write"
    assert d.client.get_workflow_run(run_id) == resumed
    journal = d.engine.store.hashes(run_id).journal.get("v:slow")  # archived or not (issue 42)
    assert journal is not None and json.loads(journal[1:]) == "from-attempt-2"
    records = d.client.get_workflow_run_progress(run_id).records
    assert any(r.kind == "system" and r.attempt == 2 and "force" in r.message.lower() for r in records)


# -- progress paging ---------------------------------------------------------------


@pytest.mark.topologies("redis", "cluster")
def test_progress_paging(durable) -> None:
    entered, release = threading.Event(), threading.Event()

    def run(ctx):
        ctx.phase("One")
        for i in range(5):
            ctx.log(f"one {i}")
        ctx.step("gate", lambda: gate(entered, release, 1))
        ctx.phase("Two")
        for i in range(5):
            ctx.log(f"two {i}")
        return ctx.step("end", lambda: 2)

    d = durable([make_workflow("chatty", run, "One", "Two")])
    run_id = d.client.start_workflow("chatty")
    try:
        assert entered.wait(10)
        early = d.client.get_workflow_run_progress(run_id)
    finally:
        release.set()
    assert early.records and early.newest_seq == early.records[-1].seq
    assert d.client.wait_for_workflow_run(run_id, timeout=20).status == "completed"

    everything = d.client.get_workflow_run_progress(run_id, after_seq=-1, limit=500)
    records = everything.records
    n = len(records)
    assert n >= 13  # started, 2 phases, 10 logs, completed
    assert [r.seq for r in records] == list(range(1, n + 1))
    assert (everything.oldest_seq, everything.newest_seq) == (1, n)
    assert not everything.has_more_older and not everything.has_more_newer
    assert everything.revision >= n > early.newest_seq
    assert everything.revision > early.revision >= 0
    assert {r.kind for r in records} == {"system", "phase", "log"}
    assert [r.message for r in records if r.kind == "log"] == [f"one {i}" for i in range(5)] + [
        f"two {i}" for i in range(5)
    ]
    for record in records:
        assert record.attempt == 1
        assert_utc(record.at)

    def seqs(**kwargs: Any) -> tuple[list[int], bool, bool]:
        page = d.client.get_workflow_run_progress(run_id, **kwargs)
        assert (page.oldest_seq, page.newest_seq) == (1, n)
        return [r.seq for r in page.records], page.has_more_older, page.has_more_newer

    assert seqs(limit=5) == (list(range(n - 4, n + 1)), True, False)
    assert seqs() == (list(range(1, n + 1)), False, False)
    assert seqs(after_seq=0, limit=3) == ([1, 2, 3], False, True)
    assert seqs(after_seq=3, limit=3) == ([4, 5, 6], True, True)
    assert seqs(after_seq=n - 2, limit=5) == ([n - 1, n], True, False)
    assert seqs(after_seq=n)[0] == []
    assert seqs(before_seq=5, limit=3) == ([2, 3, 4], True, True)
    assert seqs(before_seq=3, limit=10) == ([1, 2], False, True)
    assert seqs(before_seq=1)[0] == []

    detail = d.client.get_workflow_run_detail(run_id)
    phase_ids = {phase.title: phase.phase_id for phase in detail.phases}
    two = [r for r in records if r.phase_id == phase_ids["Two"]]
    assert [r.message for r in two] == ["Two"] + [f"two {i}" for i in range(5)]
    scoped = d.client.get_workflow_run_progress(run_id, phase_id=phase_ids["Two"], after_seq=two[1].seq, limit=2)
    assert [r.seq for r in scoped.records] == [two[2].seq, two[3].seq]
    assert (scoped.oldest_seq, scoped.newest_seq) == (two[0].seq, two[-1].seq)
    assert scoped.has_more_older and scoped.has_more_newer

    for kwargs, option in [
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"limit": "10"}, "limit"),
        ({"after_seq": "3"}, "after_seq"),
        ({"before_seq": -2}, "before_seq"),
        ({"phase_id": 1}, "phase_id"),
    ]:
        with pytest.raises(ValueError, match=option):
            d.client.get_workflow_run_progress(run_id, **kwargs)
    with pytest.raises(TypeError):
        d.client.get_workflow_run_progress(run_id, **{"cursor": "abc"})
