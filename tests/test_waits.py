"""Durable waits (SPEC §5): timers and signals that hold no worker.

Real Redis, real workers; the crash test kills worker processes with SIGKILL.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_durable import RunNotFoundError, Signal, WorkflowContext
from tests.support.apps.waits import await_signal, nap
from tests.support.fleet import Fleet
from tests.support.poll import RUN_BOUND, poll
from tests.support.workflows import refusal_of, wf

TIMEOUT = 30


def waiting_for(client: Any, run_id: str) -> Any:
    return client.get_workflow_run(run_id).snapshot["waiting_for"]


def test_a_sleeping_run_completes_by_itself_about_on_time(durable) -> None:
    d = durable([nap], lease_seconds=3)
    started = datetime.now(UTC)
    run_id = d.client.start_workflow("nap", args={"seconds": 3})
    timer = poll(lambda: waiting_for(d.client, run_id), within=RUN_BOUND, what="the run to wait")
    assert timer["kind"] == "timer" and timer["name"] == ""
    due = datetime.fromisoformat(timer["until"])
    assert timedelta(seconds=2.5) < due - started < timedelta(seconds=4)
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    woke = datetime.fromisoformat(envelope.result)
    assert timedelta(0) <= woke - due < timedelta(seconds=1.5), woke - due
    assert envelope.snapshot["waiting_for"] is None


def test_signals_sent_early_are_kept_and_taken_in_order(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        return [ctx.wait_for_signal("item").payload for _ in range(3)]

    d = durable([wf("queue", run)])
    run_id = d.client.start_workflow("queue")
    for payload in ({"n": 1}, None, [3]):
        d.client.signal_workflow_run(run_id, "item", payload)
    assert d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT).result == [{"n": 1}, None, [3]]


def test_a_timeout_is_told_apart_from_a_none_payload(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        first = ctx.wait_for_signal("maybe", timeout=0.5)
        second = ctx.wait_for_signal("maybe", timeout=30)
        return [[s.payload, s.received, s.name] for s in (first, second)]

    d = durable([wf("maybe", run)])
    run_id = d.client.start_workflow("maybe")
    def second_wait() -> bool:
        until = (waiting_for(d.client, run_id) or {}).get("until")
        return bool(until) and datetime.fromisoformat(until) > datetime.now(UTC) + timedelta(seconds=5)

    poll(second_wait, within=RUN_BOUND, what="the second wait")
    d.client.signal_workflow_run(run_id, "maybe", None)
    result = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT).result
    assert result == [[None, False, "maybe"], [None, True, "maybe"]]


def test_waits_in_branches(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        pair = ctx.parallel([lambda: (ctx.sleep(0.5), "slept")[1], lambda: ctx.wait_for_signal("b").payload])
        staged = ctx.pipeline([1, 2], lambda prev, item, i: (ctx.sleep(timedelta(milliseconds=200)), prev * 10)[1])
        return {"pair": pair, "staged": staged}

    d = durable([wf("branchy", run)])
    run_id = d.client.start_workflow("branchy")
    poll(
        lambda: (waiting_for(d.client, run_id) or {}).get("kind") == "signal",
        within=RUN_BOUND,
        what="the branch's signal wait",
    )
    d.client.signal_workflow_run(run_id, "b", "B")
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert envelope.result == {"pair": ["slept", "B"], "staged": [10, 20]}


def test_a_wait_holds_no_worker_slot(durable) -> None:
    quick = wf("quick", lambda ctx: ctx.step("s", lambda: 1))
    d = durable([await_signal, quick], concurrency=1)
    waiting = [d.client.start_workflow("await-signal") for _ in range(10)]
    poll(lambda: all(waiting_for(d.client, r) for r in waiting), within=RUN_BOUND, what="ten runs waiting")
    others = [d.client.run_workflow("quick", timeout=TIMEOUT) for _ in range(3)]
    assert [e.status for e in others] == ["completed"] * 3
    for run_id in waiting:
        d.client.signal_workflow_run(run_id, "go", run_id)
    assert [d.client.wait_for_workflow_run(r, timeout=TIMEOUT).result["payload"] for r in waiting] == waiting


def test_cancel_and_pause_of_a_waiting_run_act_at_once_and_resume_keeps_the_due_time(durable) -> None:
    d = durable([nap, await_signal])
    doomed = d.client.start_workflow("await-signal")
    poll(lambda: waiting_for(d.client, doomed), within=RUN_BOUND, what="the wait")
    started = time.monotonic()
    assert d.client.cancel_workflow_run(doomed, timeout=10).status == "cancelled"
    assert time.monotonic() - started < 3

    napping = d.client.start_workflow("nap", args={"seconds": 4})
    due = poll(lambda: waiting_for(d.client, napping), within=RUN_BOUND, what="the nap")["until"]
    paused = d.client.pause_workflow_run(napping, timeout=10)
    assert paused.status == "paused" and paused.snapshot["waiting_for"] is None
    resumed = d.client.resume_workflow(napping, timeout=TIMEOUT)
    assert resumed.status == "completed"
    assert datetime.fromisoformat(resumed.result) >= datetime.fromisoformat(due)
    assert datetime.fromisoformat(resumed.result) - datetime.fromisoformat(due) < timedelta(seconds=2)


def test_waiting_is_not_active_time(durable) -> None:
    d = durable([nap])
    envelope = d.client.run_workflow("nap", args={"seconds": 3}, limits={"timeout_seconds": 1.5}, timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error


def test_who_may_be_signalled(durable) -> None:
    d = durable([nap])
    done = d.client.run_workflow("nap", args={"seconds": 0}, timeout=TIMEOUT)
    with pytest.raises(ValueError, match="is completed"):
        d.client.signal_workflow_run(done.run_id, "go")
    with pytest.raises(RunNotFoundError):
        d.client.signal_workflow_run("0" * 32, "go")
    other = d.engine.client(namespace="elsewhere")
    with pytest.raises(RunNotFoundError):
        other.signal_workflow_run(done.run_id, "go")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ctx: ctx.sleep(-1), "not negative"),
        (lambda ctx: ctx.sleep(math.nan), "finite"),
        (lambda ctx: ctx.sleep(math.inf), "finite"),
        (lambda ctx: ctx.sleep("5"), "seconds"),
        (lambda ctx: ctx.sleep_until(datetime(2030, 1, 1)), "aware"),
        (lambda ctx: ctx.wait_for_signal(""), "signal name"),
        (lambda ctx: ctx.wait_for_signal("x" * 129), "signal name"),
        (lambda ctx: ctx.wait_for_signal("ok", timeout=-2), "not negative"),
    ],
)
def test_bad_waits_are_a_clear_error_at_the_call_and_journal_nothing(durable, call: Any, message: str) -> None:
    def run(ctx: WorkflowContext) -> Any:
        return {"caught": refusal_of(lambda: call(ctx)), "after": ctx.step("after", lambda: 1)}

    d = durable([wf("bad-wait", run)])
    envelope = d.client.run_workflow("bad-wait", timeout=TIMEOUT)
    assert envelope.status == "completed"
    assert message in envelope.result["caught"]
    record = d.engine.store.load_run(envelope.run_id)
    assert record is not None
    journal = d.engine.store.replay_journal(record).read_sequence("m")  # archived or not (issue 42)
    assert [identity for _, identity, _ in journal.entries] == ["s|after"]


@pytest.mark.parametrize(
    ("name", "payload", "message"),
    [("", None, "signal name"), ("a b", None, "signal name"), ("go", {1, 2}, "JSON"), ("go", "x" * 2_000_000, "bytes")],
)
def test_bad_signals_are_refused_and_deliver_nothing(durable, name: str, payload: Any, message: str) -> None:
    d = durable([await_signal])
    run_id = d.client.start_workflow("await-signal")
    poll(lambda: waiting_for(d.client, run_id), within=RUN_BOUND, what="the wait")
    with pytest.raises(ValueError, match=message):
        d.client.signal_workflow_run(run_id, name, payload)
    assert d.client.get_workflow_run(run_id).status == "running"
    d.client.signal_workflow_run(run_id, "go", "fine")
    assert d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT).result["payload"] == "fine"


@pytest.mark.slow
def test_a_signal_sent_while_every_worker_is_dead_completes_the_run(settings, fleet: Fleet) -> None:
    from celery_durable import Engine

    settings = settings.model_copy(update={"lease_seconds": 3})
    fleet.settings = settings
    client = Engine([await_signal, nap], settings).client()
    worker = fleet.start("tests.support.apps.waits:engine", concurrency=2)
    run_id = client.start_workflow("await-signal")
    poll(lambda: waiting_for(client, run_id), within=RUN_BOUND, what="the wait")
    worker.kill()
    client.signal_workflow_run(run_id, "go", {"while": "nobody ran"})  # kept: no attempt is alive
    fleet.start("tests.support.apps.waits:engine", concurrency=2)
    envelope = client.wait_for_workflow_run(run_id, timeout=60)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == {"before": "journaled", "payload": {"while": "nobody ran"}}
    steps = {row.key: row.attempt for row in client.get_workflow_run_detail(run_id).steps}
    assert steps == {"before": 1}, "the step before the wait did not run again"


def test_the_approval_example_end_to_end_with_the_cli(durable) -> None:
    from examples.approval import expense_approval
    from tests.support.cli import cli

    app = "tests.support.apps.waits:make_approval_engine"

    d = durable([expense_approval])
    approved = d.client.start_workflow("expense-approval", args={"employee": "ada", "amount": 120})
    assert poll(lambda: waiting_for(d.client, approved), within=RUN_BOUND, what="the approval")["name"] == "approval"
    result = cli(d.settings, "runs", "approve", approved, "--note", "team dinner", "--app", app)
    assert result.exit_code == 0, result.output
    envelope = d.client.wait_for_workflow_run(approved, timeout=TIMEOUT)
    assert (envelope.result["status"], envelope.result["note"]) == ("paid", "team dinner")

    rejected = d.client.start_workflow("expense-approval", args={"employee": "bob", "amount": 9000})
    poll(lambda: waiting_for(d.client, rejected), within=RUN_BOUND, what="the approval")
    result = cli(d.settings, "runs", "approve", rejected, "--reject", "--note", "no receipt", "--app", app)
    assert result.exit_code == 0, result.output
    assert d.client.wait_for_workflow_run(rejected, timeout=TIMEOUT).result["status"] == "rejected"

    expired = d.client.run_workflow(
        "expense-approval", args={"remind_after_seconds": 0.5, "reminders": 2}, timeout=TIMEOUT
    )
    assert expired.result["status"] == "expired"
    steps = [row.key for row in d.client.get_workflow_run_detail(expired.run_id).steps]
    assert steps == ["record-claim", "ask", "remind-1", "remind-2"]


def test_signal_is_public_and_tells_a_timeout_apart() -> None:
    assert Signal("a", None, False) != Signal("a", None, True)
